#!/usr/bin/python3
"""The CPU peer of the trainer: the same LLaMA trained by eager PyTorch on the CPU.

Meant for Debian's python3-torch 1.13 (run it with /usr/bin/python3) with
OpenBLAS selected as libblas.so.3 (apt-get install libopenblas0-pthread;
with the reference BLAS, F32 runs ~7x slower and the comparison says
nothing). The model is bench/torch_fsdp2.py's (HF LLaMA math and names:
RMSNorm, rotary in the rotate_half layout, SwiGLU, causal attention, tied or
untied lm_head as the config says), built from one of our YAML configs; so
are the parameter and FLOP counts (metrics/flops.h's convention). No FSDP:
one process, `--threads` intra-op threads.

    /usr/bin/python3 bench/torch_llama_cpu.py --config bench/configs/m8.yaml
    /usr/bin/python3 bench/torch_llama_cpu.py --config bench/configs/m8.yaml --dtype bf16 --recompute --threads 2
    /usr/bin/python3 bench/torch_llama_cpu.py --gemm-peak --threads 2      # torch.matmul 2048^3, F32 and BF16

Training: AdamW (the config's lr, betas, eps, weight_decay on >= 2-dim
parameters only, as ours), gradient clipping at optim.grad_clip, random
tokens made before the timed loop, micro-batch = the global batch unless
--micro-batch says otherwise (then gradients accumulate over the
micro-batches, as the trainer does). --dtype bf16 runs forward and backward
under torch.autocast("cpu", dtype=torch.bfloat16) with F32 parameters,
gradients and optimizer state (FP32 master weights); --dtype defaults to the
config's fsdp.mixed_precision.param_dtype. --recompute checkpoints every
decoder layer (torch.utils.checkpoint, non-reentrant).

It runs --warmup untimed steps, then times --steps steps one by one and
prints one JSON line: tokens_per_s from the median step time, the fastest and
slowest step as the spread, params, flops_per_token, peak_rss_bytes (the
process's peak resident memory, getrusage's ru_maxrss) and the settings
(--json FILE writes it too).

--max-memory GIB caps the process's data memory (RLIMIT_DATA, which counts
every private writable mapping, so torch's tensors) before torch loads: a
model that does not fit then fails with "out of memory" on stderr and exit
status 3 instead of waking the kernel's OOM killer on a shared machine.

--gemm-peak prints one JSON line per dtype with the GFLOP/s of
torch.matmul on --size^3 (default 2048) at --threads: F32 operands (OpenBLAS)
and BF16 operands (oneDNN inside torch, F32 accumulation), for a @ b and
a @ b.T, each the median of --gemm-repeats calls; "gflops" is the faster
layout's, as bench/gemm_peak.cpp reports ours.
"""

import argparse
import json
import os
import resource
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="bench/configs/m8.yaml", help="our YAML config file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, as the trainer's --set")
    parser.add_argument("--dtype", choices=["f32", "bf16"], default=None,
                        help="f32, or bf16 autocast with F32 master weights (default: the config's param_dtype)")
    parser.add_argument("--recompute", action="store_true", help="activation checkpointing of every decoder layer")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (default 0: every core allowed)")
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="sequences per forward/backward (default 0: the global batch, one pass per step)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--max-memory", type=float, default=0, metavar="GIB",
                        help="cap the data memory (RLIMIT_DATA) at GIB GiB; 0 = no cap (default)")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the JSON result line to FILE")
    parser.add_argument("--gemm-peak", action="store_true", help="measure torch.matmul GFLOP/s instead of training")
    parser.add_argument("--size", type=int, default=2048, help="--gemm-peak: M = N = K (default 2048)")
    parser.add_argument("--gemm-repeats", type=int, default=8, help="--gemm-peak: timed calls per dtype and layout")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 0 or args.micro_batch < 0 or args.size < 1:
        parser.error("--steps and --size must be >= 1; --warmup, --threads and --micro-batch >= 0")
    if args.max_memory < 0:
        parser.error("--max-memory must be >= 0")
    if args.threads == 0:
        args.threads = len(os.sched_getaffinity(0))
    return args


ARGS = parse_args()
# OpenBLAS (the F32 GEMMs) and OpenMP read their thread counts when they load,
# i.e. when torch is imported; torch.set_num_threads alone leaves OpenBLAS's
# pthread pool at every core.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
# Before torch maps anything, so the cap holds for everything it allocates.
if ARGS.max_memory > 0:
    _cap = int(ARGS.max_memory * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (_cap, _cap))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_fsdp2 as peer  # noqa: E402  (the model, the config loader and the FLOP counts)


def causal_attention_math(q, k, v, is_causal=True):
    """softmax(q k^T / sqrt(hd) + causal mask) v for q, k, v (B, H, T, hd).

    torch 1.13 has no F.scaled_dot_product_attention (2.0 added it); this is
    the computation of its math backend, which is what torch 2.x runs on the
    CPU for training too. Under autocast the two matmuls run in BF16 and so
    does the softmax (autocast leaves softmax's dtype alone on the CPU)."""
    assert is_causal, "the peer only needs causal attention"
    t = q.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)  # (B,H,T,T)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)  # (T,T) True above the diagonal
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # (B,H,T,T)
    return torch.matmul(probs, v)  # (B,H,T,hd)


if not hasattr(F, "scaled_dot_product_attention"):
    F.scaled_dot_product_attention = causal_attention_math  # what torch_fsdp2.Attention calls


def blas_library():
    """The libblas/openblas file this process mapped (after a GEMM has run)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
    return ",".join(sorted(paths)) or "unknown"


def emit(result, path):
    line = json.dumps(result)
    print(line, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")


def peak_rss_bytes():
    """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def median(values):
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


# --- GEMM peak -------------------------------------------------------------------------------


def gemm_peak(args):
    n = args.size
    flops = 2.0 * n * n * n
    torch.manual_seed(0)
    lines = []
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        a = (torch.rand(n, n) * 2 - 1).to(dtype)
        b = (torch.rand(n, n) * 2 - 1).to(dtype)
        layouts = {}
        best_single = float("inf")
        for layout, rhs in (("nn", b), ("nt", b.t())):
            for _ in range(2):
                torch.matmul(a, rhs)
            seconds = []
            for _ in range(args.gemm_repeats):
                t0 = time.perf_counter()
                torch.matmul(a, rhs)
                seconds.append(time.perf_counter() - t0)
            layouts[layout] = flops / median(seconds) / 1e9
            best_single = min(best_single, min(seconds))
        lines.append({"impl": "torch", "dtype": name, "size": n, "threads": torch.get_num_threads(),
                      "gflops": max(layouts.values()), "gflops_max": flops / best_single / 1e9,
                      "layouts": layouts, "repeats": args.gemm_repeats, "torch": torch.__version__,
                      "blas": blas_library()})
    for line in lines:
        emit(line, "")


# --- training --------------------------------------------------------------------------------


def build_optimizer(model, o):
    """AdamW with weight decay on >= 2-dim parameters only (as ours); foreach kernels when available."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    try:
        return torch.optim.AdamW(groups, foreach=True, **kwargs), True
    except TypeError:  # a torch without foreach
        return torch.optim.AdamW(groups, **kwargs), False


def train(args, config):
    m, t, o = config["model"], config["train"], config["optim"]
    seq_len, global_batch = int(t["seq_len"]), int(t["global_batch_size"])
    micro = args.micro_batch or global_batch
    if seq_len > m["max_position_embeddings"]:
        sys.exit(f"train.seq_len ({seq_len}) exceeds model.max_position_embeddings ({m['max_position_embeddings']})")
    if global_batch % micro != 0:
        sys.exit(f"--micro-batch {micro} does not divide train.global_batch_size ({global_batch})")
    accum = global_batch // micro
    dtype = args.dtype or config["fsdp"]["mixed_precision"]["param_dtype"]
    if dtype not in ("f32", "bf16"):
        sys.exit(f"fsdp.mixed_precision.param_dtype is {dtype!r}; the CPU peer runs f32 or bf16")
    torch.manual_seed(int(t["seed"]))

    model = peer.Llama(m, device="cpu")
    model.init_weights()
    for layer in model.model.layers:
        layer.recompute = args.recompute
    model.train()
    optimizer, foreach = build_optimizer(model, o)
    vocab = m["vocab_size"]
    # A few batches made up front and reused: no token generation inside the timed loop.
    batches = [torch.randint(0, vocab, (micro, seq_len + 1)) for _ in range(4)]

    def step(index):
        total = 0.0
        for a in range(accum):
            tokens = batches[(index * accum + a) % len(batches)]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                logits = model(tokens[:, :-1])  # (B,T,V)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1)) / accum
            loss.backward()
            total += loss.item()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    losses = [step(i) for i in range(args.warmup)]
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step(args.warmup + i))
        times.append(time.perf_counter() - t0)

    counts = peer.model_flops(m, seq_len)
    params, matmul = peer.count_module(model)
    if (params, matmul) != (counts["params"], counts["matmul_params"]):
        sys.exit(f"module counts {params}/{matmul} differ from the formula {counts['params']}/{counts['matmul_params']}")
    tokens = global_batch * seq_len
    step_s = median(times)
    result = {
        "impl": "torch",
        "config": args.config,
        "dtype": dtype,
        "recompute": "full" if args.recompute else "none",
        "threads": torch.get_num_threads(),
        "micro_batch_size": micro,
        "global_batch_size": global_batch,
        "accumulation": accum,
        "seq_len": seq_len,
        "params": params,
        "matmul_params": matmul,
        "flops_per_token": counts["flops_per_token"],
        "tokens_per_s": tokens / step_s,
        "tokens_per_s_min": tokens / max(times),
        "tokens_per_s_max": tokens / min(times),
        "step_time_s": step_s,
        "step_time_min_s": min(times),
        "step_time_max_s": max(times),
        "model_gflops": tokens / step_s * counts["flops_per_token"] / 1e9,
        "peak_rss_bytes": peak_rss_bytes(),
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "adamw_foreach": foreach,
        "torch": torch.__version__,
        "blas": blas_library(),
    }
    emit(result, args.json)


def main():
    torch.set_num_threads(ARGS.threads)
    if ARGS.gemm_peak:
        gemm_peak(ARGS)
        return
    config = peer.load_config(ARGS.config, ARGS.set)
    try:
        train(ARGS, config)
    except (MemoryError, RuntimeError) as e:
        # torch's CPU allocator raises RuntimeError ("DefaultCPUAllocator: can't allocate memory ...").
        if not isinstance(e, MemoryError) and "allocate" not in str(e):
            raise
        cap = f" (--max-memory {ARGS.max_memory:g} GiB)" if ARGS.max_memory > 0 else ""
        print(f"torch_llama_cpu.py: out of memory{cap} after a peak RSS of {peak_rss_bytes() / 2**30:.2f} GiB: "
              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
