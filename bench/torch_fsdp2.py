#!/usr/bin/env python3
"""The PyTorch peer of the trainer: the same LLaMA, trained with FSDP2.

Builds the model of one of our YAML configs (configs/llama.yaml by default)
out of plain torch modules written here (HF LLaMA's math: RMSNorm, rotary in
the rotate_half layout, grouped-query attention through
F.scaled_dot_product_attention(is_causal=True), SwiGLU MLP, tied or untied
lm_head; parameter names are HF's), shards every decoder layer and then the
root with torch.distributed.fsdp.fully_shard under
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32), and trains it with
AdamW on random tokens. It times steps after a warm-up and reports tokens/s,
MFU (the formula of metrics/flops.h, written again below), peak memory and the
step time as one JSON line.

    python3 bench/torch_fsdp2.py --config configs/llama.yaml          # one GPU
    python3 bench/torch_fsdp2.py --config configs/llama.yaml --compile --recompute
    torchrun --nproc-per-node 8 bench/torch_fsdp2.py --config configs/llama.yaml
    python3 bench/torch_fsdp2.py --count-only --config configs/llama.yaml   # no GPU needed

--set key=value overrides config keys as the trainer's --set does
(train.micro_batch_size, train.seq_len, model.num_hidden_layers, ...).
Without torchrun it starts a world-size-1 process group itself.

--count-only prints the parameter count, the matmul-parameter count and the
FLOPs per token as JSON without a GPU; it must keep running on Debian's
torch 1.13 (CPU), so the model code below uses nothing newer than 1.13 at
construction time, and FSDP2 is imported only when training.
"""

import argparse
import json
import math
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

# --- configuration: our YAML files, with the defaults of the */config.h headers --

# The keys this script reads, with the defaults of the */config.h headers (a config
# file may leave any of them out, as configs/toy.yaml does).
DEFAULTS = {
    "model": {
        "name": "llama",
        "vocab_size": 32000,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "init_std": 0.02,
    },
    "train": {"steps": 100, "global_batch_size": 8, "micro_batch_size": 1, "seq_len": 128, "seed": 1234},
    "optim": {"lr": 3e-4, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0},
    "fsdp": {"mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "f32"}},
}


def _merge(into, src):
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def load_config(path, overrides):
    """Our YAML file over DEFAULTS, then each "key=value" (value parsed as YAML)."""
    import yaml

    with open(path) as f:
        loaded = yaml.safe_load(f) or {}
    config = json.loads(json.dumps(DEFAULTS))  # a deep copy
    _merge(config, loaded)
    for assignment in overrides:
        key, sep, text = assignment.partition("=")
        if not sep or not key:
            sys.exit(f"--set {assignment!r}: expected key=value, e.g. train.seq_len=2048")
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        # Strict, as the trainer's --set: a typo must not silently benchmark the default.
        if not isinstance(node, dict) or leaf not in node:
            sys.exit(f"--set {assignment!r}: unknown key {key} (not in {path} nor among this peer's keys)")
        node[leaf] = yaml.safe_load(text) if text != "" else ""
    if config["model"]["name"] != "llama":
        sys.exit(f"{path}: model.name is {config['model']['name']!r}; this peer builds only llama")
    return config


# --- FLOPs and MFU: metrics/flops.h again -----------------------------------------------

# Dense BF16 (tensor cores, FP32 accumulate) and plain FP32 peaks per GPU in
# FLOP/s, keyed by substrings of the device name; the first match wins. The
# same table, in the same order and with the same sources, as metrics/flops.cpp
# (tests/unit/test_flops.cpp checks that the two agree).
PEAKS = [
    ("H100 NVL", 835e12, 60e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100 80GB HBM3", 989e12, 67e12),
    ("H100 SXM", 989e12, 67e12),
    ("H200 NVL", 835e12, 60e12),
    ("H200", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("H100", 989e12, 67e12),
]


def peak_flops(device_name, dtype):
    """dtype "bf16" or "f32"; 0 for an unknown device (MFU n/a)."""
    for key, bf16, f32 in PEAKS:
        if key in device_name:
            return bf16 if dtype == "bf16" else f32
    return 0.0


def model_flops(m, seq_len):
    """params, matmul_params and training FLOPs per token, as metrics/flops.h counts them:
    6 * matmul_params + 12 * L * T * (H * head_dim) (PaLM: the full T x T score matrix)."""
    d, layers = m["hidden_size"], m["num_hidden_layers"]
    head_dim = d // m["num_attention_heads"]
    kv_width = head_dim * m["num_key_value_heads"]
    layer_matmul = 2 * d * d + 2 * d * kv_width + 3 * d * m["intermediate_size"]
    table = m["vocab_size"] * d
    matmul = layers * layer_matmul + table
    params = layers * (layer_matmul + 2 * d) + d + table + (0 if m["tie_word_embeddings"] else table)
    attention = 12.0 * layers * seq_len * (head_dim * m["num_attention_heads"])
    return {"params": params, "matmul_params": matmul, "flops_per_token": 6.0 * matmul + attention}


def mfu(tokens_per_s, flops_per_token, peak):
    """tokens_per_s of one device; 0 when the peak is unknown."""
    return tokens_per_s * flops_per_token / peak if peak > 0 else 0.0


# --- the model (HF LlamaForCausalLM's tree and names) -----------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        # As HF: normalise in FP32, scale in the input dtype.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_tables(seq_len, head_dim, theta, device, dtype):
    """cos, sin [T, head_dim] of HF's rotary embedding (frequencies repeated, rotate_half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, m, device):
        super().__init__()
        d = m["hidden_size"]
        self.heads = m["num_attention_heads"]
        self.kv_heads = m["num_key_value_heads"]
        self.head_dim = d // self.heads
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False, device=device)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False, device=device)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False, device=device)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False, device=device)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B,H,T,hd)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # (B,KV,T,hd)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # (B,KV,T,hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kv_heads != self.heads:
            # Each kv head serves heads / kv_heads consecutive query heads, as HF's repeat_kv.
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B,H,T,hd)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, m, device):
        super().__init__()
        d, f = m["hidden_size"], m["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False, device=device)
        self.up_proj = nn.Linear(d, f, bias=False, device=device)
        self.down_proj = nn.Linear(f, d, bias=False, device=device)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, m, device):
        super().__init__()
        self.input_layernorm = RMSNorm(m["hidden_size"], m["rms_norm_eps"], device)
        self.self_attn = Attention(m, device)
        self.post_attention_layernorm = RMSNorm(m["hidden_size"], m["rms_norm_eps"], device)
        self.mlp = MLP(m, device)
        self.recompute = False  # keep only the input, re-run the forward in backward

    def _forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, x, cos, sin):
        if self.recompute and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)


class LlamaModel(nn.Module):
    def __init__(self, m, device):
        super().__init__()
        self.embed_tokens = nn.Embedding(m["vocab_size"], m["hidden_size"], device=device)
        self.layers = nn.ModuleList([DecoderLayer(m, device) for _ in range(m["num_hidden_layers"])])
        self.norm = RMSNorm(m["hidden_size"], m["rms_norm_eps"], device)


class Llama(nn.Module):
    """tokens (B, T) int64 -> logits (B, T, V)."""

    def __init__(self, m, device):
        super().__init__()
        self.m = m
        self.model = LlamaModel(m, device)
        self.lm_head = nn.Linear(m["hidden_size"], m["vocab_size"], bias=False, device=device)
        if m["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, tokens):
        h = self.model.embed_tokens(tokens)  # (B,T,D)
        cos, sin = rotary_tables(
            tokens.shape[1], self.m["hidden_size"] // self.m["num_attention_heads"], self.m["rope_theta"],
            h.device, h.dtype)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.lm_head(self.model.norm(h))  # (B,T,V)

    @torch.no_grad()
    def init_weights(self):
        """normal(0, init_std) for linears and the embedding, ones for norms (as our models)."""
        std = self.m["init_std"]
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)


def count_module(model):
    """The independent count: parameters the modules hold (a tied matrix once) and
    the distinct weights of every nn.Linear (a tied lm_head is the embedding's matrix)."""
    params = sum(p.numel() for p in model.parameters())
    seen, matmul = set(), 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            matmul += module.weight.numel()
    return params, matmul


# --- training -------------------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp2():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4/2.5 kept FSDP2 under _composable
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def train(args, config):
    if not torch.cuda.is_available():
        sys.exit("torch_fsdp2.py: no CUDA device visible (use --count-only to count parameters without a GPU)")
    import torch.distributed as dist

    try:
        fully_shard, MixedPrecisionPolicy = _fsdp2()
    except ImportError:
        sys.exit(f"torch_fsdp2.py: FSDP2 (fully_shard) needs torch >= 2.4; this is torch {torch.__version__}")
    if "RANK" not in os.environ:  # not under torchrun: a world of one, set up here
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    m, t, o = config["model"], config["train"], config["optim"]
    seq_len, micro = int(t["seq_len"]), int(t["micro_batch_size"])
    if seq_len > m["max_position_embeddings"]:
        sys.exit(f"train.seq_len ({seq_len}) exceeds model.max_position_embeddings ({m['max_position_embeddings']})")
    global_batch = int(t["global_batch_size"])
    if global_batch % (micro * world) != 0:
        sys.exit(f"train.global_batch_size ({global_batch}) must be a multiple of train.micro_batch_size ({micro}) "
                 f"x world size ({world})")
    accum = global_batch // (micro * world)
    precision = config["fsdp"]["mixed_precision"]
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    torch.manual_seed(int(t["seed"]) + rank)

    # Built on the meta device, sharded, then materialised shard by shard: no
    # rank ever holds the whole FP32 model (torchtitan's order: recompute,
    # compile, then sharding, each per decoder layer, then the root).
    model = Llama(m, device="meta")
    mp = MixedPrecisionPolicy(param_dtype=dtypes[precision["param_dtype"]],
                              reduce_dtype=dtypes[precision["reduce_dtype"]])
    for i, layer in enumerate(model.model.layers):
        layer.recompute = args.recompute
        if args.compile:
            layer = torch.compile(layer)
            model.model.layers[i] = layer
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=device)
    model.init_weights()

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    try:
        optimizer = torch.optim.AdamW(groups, fused=True, **kwargs)
        fused = True
    except (RuntimeError, TypeError, ValueError):
        optimizer = torch.optim.AdamW(groups, **kwargs)
        fused = False

    # A few batches made up front and reused: random tokens, never generated inside the timed loop.
    vocab = m["vocab_size"]
    batches = [torch.randint(0, vocab, (micro, seq_len + 1), device=device) for _ in range(4)]

    def step(index):
        for a in range(accum):
            tokens = batches[(index * accum + a) % len(batches)]
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1)) / accum
            loss.backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item() * accum  # the host waits for the step, as the trainer's loss line does

    t_start = time.perf_counter()
    losses = [step(i) for i in range(args.warmup)]
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t_start
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step(args.warmup + i))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)

    counts = model_flops(m, seq_len)
    params, matmul = count_module(model)  # DTensor numel is the global numel
    step_s = sum(times) / len(times)
    tokens_per_s = global_batch * seq_len / step_s
    device_name = torch.cuda.get_device_name(device)
    peak = peak_flops(device_name, precision["param_dtype"])
    result = {
        "impl": "torch_fsdp2",
        "mode": "compile" if args.compile else "eager",
        "recompute": "full" if args.recompute else "none",
        "config": args.config,
        "world_size": world,
        "micro_batch_size": micro,
        "global_batch_size": global_batch,
        "seq_len": seq_len,
        "num_hidden_layers": m["num_hidden_layers"],
        "params": params,
        "matmul_params": matmul,
        "flops_per_token": counts["flops_per_token"],
        "tokens_per_s": tokens_per_s,
        "step_time_s": step_s,
        "step_time_median_s": sorted(times)[len(times) // 2],
        "mfu": mfu(tokens_per_s / world, counts["flops_per_token"], peak),
        "peak_flops": peak,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "warmup_steps": args.warmup,
        "warmup_s": warmup_s,
        "timed_steps": args.steps,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "fused_adamw": fused,
        "device": device_name,
        "torch": torch.__version__,
    }
    if params != counts["params"] or matmul != counts["matmul_params"]:
        print(f"warning: module counts {params}/{matmul} differ from the formula "
              f"{counts['params']}/{counts['matmul_params']}", file=sys.stderr)
    if rank == 0:
        mfu_text = f"{result['mfu'] * 100:.1f}%" if peak > 0 else "n/a"
        print(f"torch_fsdp2 {result['mode']} recompute={result['recompute']}: {tokens_per_s:,.0f} tok/s, "
              f"step {step_s * 1e3:.1f} ms, MFU {mfu_text}, peak {result['peak_memory_bytes'] / 2**30:.2f} GiB, "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        emit(result, args.json)
    dist.destroy_process_group()


def emit(result, path):
    line = json.dumps(result)
    print(line)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/llama.yaml", help="our YAML config file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    parser.add_argument("--recompute", action="store_true", help="activation checkpointing of every decoder layer")
    parser.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the JSON result line to FILE")
    parser.add_argument("--count-only", action="store_true",
                        help="print parameter and matmul-parameter counts as JSON and exit (no GPU)")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    config = load_config(args.config, args.set)

    if args.count_only:
        m, seq_len = config["model"], int(config["train"]["seq_len"])
        params, matmul = count_module(Llama(m, device="meta"))  # shapes only, no memory
        counts = model_flops(m, seq_len)
        if (params, matmul) != (counts["params"], counts["matmul_params"]):
            sys.exit(f"module counts {params}/{matmul} differ from the formula "
                     f"{counts['params']}/{counts['matmul_params']}")
        emit({"config": args.config, "seq_len": seq_len, "params": params, "matmul_params": matmul,
              "flops_per_token": counts["flops_per_token"],
              "peaks": {key: [bf16, f32] for key, bf16, f32 in PEAKS}}, args.json)
        return
    train(args, config)


if __name__ == "__main__":
    main()
