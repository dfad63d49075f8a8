#!/usr/bin/env python3
"""Cross-check of st::models::Llama against a plain-PyTorch LLaMA.

    check_llama.py TORCH_REF_DUMP      # runs the dump tool into a temp dir, then checks
    check_llama.py --dir DIR           # checks an existing dump (DIR/manifest.json)

The dump (tests/torch_ref/dump_llama.cpp) holds, for an untied and a tied
tiny LLaMA, the initial weights under their Hugging Face names, tokens and
targets, our logits, mean cross-entropy and every parameter gradient, then
the losses of 5 AdamW steps and the final weights. This script builds the
same model from scratch in PyTorch (RMSNorm, rotary embeddings with
rotate_half as in Hugging Face's modeling_llama, grouped-query attention via
repeat_interleave of the KV heads, causal softmax attention, SwiGLU MLP, F32),
loads the weights, and compares:

  - logits, loss, every parameter gradient: ||ours - torch|| / ||torch||;
  - torch.optim.AdamW (two param groups: weight decay on >= 2-D parameters,
    none on the norms) for 5 steps: each loss and every final weight.

Every relative error must stay below 1e-4. Prints a table of the errors and
the maxima; exits 1 on a failure, 77 (CTest: skipped) without torch/numpy.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"check_llama.py: skipped, {e}")
    sys.exit(77)

TOL = 1e-4


# --- the model, written out as in Hugging Face modeling_llama ------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(seq_len, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    t = torch.arange(seq_len).float()
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.h, self.kv, self.hd, self.theta = h, kv, d // h, c["rope_theta"]
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2)   # [B, H, T, hd]
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)  # [B, KV, T, hd]
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        cos, sin = rope_tables(t, self.hd, self.theta)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.h // self.kv  # query head i uses KV head i // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.hd)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        out = (p @ v).transpose(1, 2).reshape(b, t, self.h * self.hd)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, tokens):
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tied = c["tie_word_embeddings"]
        self.model = LlamaModel(c)
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, tokens):
        h = self.model(tokens)
        if self.tied:
            return F.linear(h, self.model.embed_tokens.weight)
        return self.lm_head(h)


# --- comparison ------------------------------------------------------------------------

def load(root, entry):
    dtype = np.float32 if entry["dtype"] == "F32" else np.int32
    arr = np.fromfile(os.path.join(root, entry["file"]), dtype=dtype).reshape(entry["shape"])
    return torch.from_numpy(arr.copy())


def load_file(root, rel, shape):
    return torch.from_numpy(np.fromfile(os.path.join(root, rel), dtype=np.float32).reshape(shape).copy())


def rel_err(ours, ref):
    ours = torch.as_tensor(ours, dtype=torch.float64)
    ref = torch.as_tensor(ref, dtype=torch.float64)
    den = ref.norm().item()
    num = (ours - ref).norm().item()
    return num / den if den > 0 else num


def check_case(root, case, rows):
    c = case["config"]
    name = case["name"]
    torch.manual_seed(0)
    model = LlamaForCausalLM(c)
    ours_params = {p["name"]: p for p in case["params"]}
    torch_names = [n for n, _ in model.named_parameters()]
    if torch_names != [p["name"] for p in case["params"]]:
        rows.append((name, "parameter names", float("inf")))
        print(f"{name}: names differ\n  torch: {torch_names}\n  ours:  {[p['name'] for p in case['params']]}")
        return
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(load(root, ours_params[n]))

    tokens = load(root, case["tokens"]).long()
    targets = load(root, case["targets"]).long()
    ignore = case["ignore_index"]

    logits = model(tokens)
    v = logits.shape[-1]
    loss = F.cross_entropy(logits.view(-1, v), targets.view(-1), ignore_index=ignore)
    loss.backward()
    rows.append((name, "logits", rel_err(load(root, case["logits"]), logits.detach())))
    rows.append((name, "loss", abs(case["loss"] - loss.item()) / abs(loss.item())))
    grad_max = 0.0
    for n, p in model.named_parameters():
        e = ours_params[n]
        err = rel_err(load_file(root, e["grad"], e["shape"]), p.grad)
        rows.append((name, f"grad {n}", err))
        grad_max = max(grad_max, err)
    rows.append((name, "max grad", grad_max))

    # AdamW from the same initial weights, decay only on >= 2-D parameters.
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(load(root, ours_params[n]))
            p.grad = None
    h = case["adamw"]
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": h["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"])
    losses = []
    for _ in range(h["steps"]):
        opt.zero_grad(set_to_none=True)
        out = model(tokens)
        step_loss = F.cross_entropy(out.view(-1, v), targets.view(-1), ignore_index=ignore)
        step_loss.backward()
        losses.append(step_loss.item())
        opt.step()
    for i, (a, b) in enumerate(zip(h["losses"], losses)):
        rows.append((name, f"adamw loss {i + 1} ({b:.6f})", abs(a - b) / abs(b)))
    final_max = 0.0
    for n, p in model.named_parameters():
        e = ours_params[n]
        err = rel_err(load_file(root, e["final"], e["shape"]), p.detach())
        final_max = max(final_max, err)
    rows.append((name, "adamw final weights (max)", final_max))


def main(argv):
    if len(argv) == 3 and argv[1] == "--dir":
        root = argv[2]
        return check_dir(root)
    if len(argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="torch_ref_llama_") as root:
        subprocess.run([argv[1], root], check=True)
        return check_dir(root)


def check_dir(root):
    torch.set_num_threads(1)
    with open(os.path.join(root, "manifest.json")) as f:
        manifest = json.load(f)
    rows = []
    for case in manifest["cases"]:
        check_case(root, case, rows)
    failed = 0
    width = max(len(r[1]) for r in rows)
    print(f"{'case':<8} {'quantity':<{width}}  relative error")
    for case, what, err in rows:
        bad = not (err < TOL)
        failed += bad
        print(f"{case:<8} {what:<{width}}  {err:.3e}{'  FAIL' if bad else ''}")
    summary = {}
    for case, what, err in rows:
        key = "grad" if what.startswith("grad ") else what.split(" (")[0]
        key = "adamw loss" if key.startswith("adamw loss") else key
        summary[key] = max(summary.get(key, 0.0), err)
    print("maxima over both cases: " + ", ".join(f"{k} {v:.2e}" for k, v in summary.items() if k != "max grad"))
    if failed:
        print(f"check_llama.py: {failed} quantities above {TOL:g}")
        return 1
    print(f"check_llama.py: all {len(rows)} quantities below {TOL:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
