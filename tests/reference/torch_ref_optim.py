#!/usr/bin/env python3
"""Cross-check of st::optim against torch.optim (PyTorch 1.13, CPU).

    torch_ref_optim.py DUMP_OPTIM_REF

Runs DUMP_OPTIM_REF (tests/reference/dump_optim_ref.cpp) into a temporary
directory, then replays the same 10 steps with torch.optim.AdamW and
torch.optim.SGD (foreach=False, one param group with weight decay for w1/w2
and one without for b1, the LR of each step taken from the dump) and
torch.nn.utils.clip_grad_norm_, and compares:

  - parameters and optimizer state inside the ranges: max relative difference
    |ours - torch| / max(|torch|, 1e-6 * max|torch|) must stay below 1e-6
    (on an AVX2 machine the results are normally bit-identical; the count of
    differing elements is printed);
  - padding: parameters keep their NaN bit pattern, state stays exactly 0;
  - the LR of every step against the documented schedule formula (1e-12).

Prints the measured figures. Exit 1 on a failure, 77 (CTest: skipped) when
torch or numpy is missing. Needs only torch and numpy.
"""
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: {e}")
    sys.exit(77)

N = 1000
STEPS = 10
# (name, offset, numel, weight decay) as in dump_optim_ref.cpp
RANGES = [("w1", 0, 300, True), ("b1", 310, 20, False), ("w2", 340, 600, True)]
TOLERANCE = 1e-6
MAX_NORM = 1.0

ADAMW = dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, kind="cosine", warmup=3, min_lr=1e-3)
SGD = dict(lr=5e-2, weight_decay=0.1, momentum=0.9, kind="linear", warmup=2, min_lr=5e-3)

failures = []


def load(directory, name, dtype=np.float32):
    return np.fromfile(os.path.join(directory, name), dtype=dtype)


def schedule(cfg, step, total):
    """optim/optimizer.h's learning_rate, written from its documentation."""
    w = cfg["warmup"]
    if step < w:
        return cfg["lr"] * (step + 1) / w
    progress = min(1.0, (step - w) / max(1, total - w - 1))
    if cfg["kind"] == "cosine":
        return cfg["min_lr"] + (cfg["lr"] - cfg["min_lr"]) * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg["kind"] == "linear":
        return cfg["lr"] + (cfg["min_lr"] - cfg["lr"]) * progress
    return cfg["lr"]


def compare(label, ours, ref):
    """Max relative difference inside the ranges; records a failure above TOLERANCE."""
    ref = ref.astype(np.float32)
    floor = max(1e-6 * float(np.max(np.abs(ref))), 1e-30)
    diff = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    rel = float(np.max(diff / np.maximum(np.abs(ref.astype(np.float64)), floor)))
    differing = int(np.count_nonzero(ours.view(np.uint32) != ref.view(np.uint32)))
    print(f"  {label:<28} max rel diff {rel:.3e}   differing elements {differing}/{ref.size}")
    if not rel < TOLERANCE:
        failures.append(f"{label}: max relative difference {rel:.3e} >= {TOLERANCE}")
    return rel


def check_padding(label, ours, initial, state):
    """Outside the ranges: params keep their initial bits, state stays 0."""
    mask = np.ones(N, dtype=bool)
    for _, off, n, _ in RANGES:
        mask[off:off + n] = False
    if not np.array_equal(ours.view(np.uint32)[mask], initial.view(np.uint32)[mask]):
        failures.append(f"{label}: padding of the parameters changed")
    for name, t in state.items():
        if np.any(t.view(np.uint32)[mask] != 0):
            failures.append(f"{label}: padding of {name} is not 0")


def replay(directory, prefix, cfg, make_optimizer, state_names):
    print(f"{prefix}:")
    p0 = load(directory, f"{prefix}_param0.bin")
    lrs = load(directory, f"{prefix}_lrs.bin", np.float64)
    worst_lr = max(abs(lrs[s] - schedule(cfg, s, STEPS)) / cfg["lr"] for s in range(STEPS))
    print(f"  {'schedule (vs formula)':<28} max rel diff {worst_lr:.3e}")
    if not worst_lr < 1e-12:
        failures.append(f"{prefix}: schedule differs from the documented formula by {worst_lr:.3e}")

    params = {name: torch.tensor(p0[off:off + n].copy(), requires_grad=True) for name, off, n, _ in RANGES}
    decay = [params[name] for name, _, _, wd in RANGES if wd]
    no_decay = [params[name] for name, _, _, wd in RANGES if not wd]
    opt = make_optimizer([{"params": decay, "weight_decay": cfg["weight_decay"]},
                          {"params": no_decay, "weight_decay": 0.0}])
    for step in range(STEPS):
        grad = load(directory, f"{prefix}_grad{step + 1}.bin")
        for name, off, n, _ in RANGES:
            params[name].grad = torch.tensor(grad[off:off + n].copy())
        for group in opt.param_groups:
            group["lr"] = float(lrs[step])
        opt.step()

    ours_p = load(directory, f"{prefix}_param.bin")
    ours_state = {s: load(directory, f"{prefix}_{s}.bin") for s in state_names}
    worst = 0.0
    for name, off, n, _ in RANGES:
        worst = max(worst, compare(f"{name} param", ours_p[off:off + n], params[name].detach().numpy()))
        for s in state_names:
            ref = opt.state[params[name]][s].numpy()
            worst = max(worst, compare(f"{name} {s}", ours_state[s][off:off + n], ref))
    check_padding(prefix, ours_p, p0, ours_state)
    return worst


def check_clip(directory):
    print("clip_grad_norm_:")
    p0 = load(directory, "adamw_param0.bin")
    grad = load(directory, "adamw_grad1.bin")
    norm, coef = load(directory, "clip_stats.bin", np.float64)
    params = []
    for _, off, n, _ in RANGES:
        p = torch.tensor(p0[off:off + n].copy(), requires_grad=True)
        p.grad = torch.tensor(grad[off:off + n].copy())
        params.append(p)
    total = float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM))
    ref_coef = min(1.0, MAX_NORM / (total + 1e-6))
    rel_norm = abs(norm - total) / total
    rel_coef = abs(coef - ref_coef) / ref_coef
    print(f"  {'total norm':<28} ours {norm:.9g} torch {total:.9g} rel diff {rel_norm:.3e}")
    print(f"  {'clip coefficient':<28} ours {coef:.9g} torch {ref_coef:.9g} rel diff {rel_coef:.3e}")
    if not (rel_norm < TOLERANCE and rel_coef < TOLERANCE and coef < 1.0):
        failures.append("clip: norm or coefficient differs from torch (or clipping did not act)")
    clipped = load(directory, "clip_grad.bin")
    worst = 0.0
    for (name, off, n, _), p in zip(RANGES, params):
        worst = max(worst, compare(f"{name} clipped grad", clipped[off:off + n], p.grad.numpy()))
    return worst


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not os.access(sys.argv[1], os.X_OK):
        print(f"FAILED: {sys.argv[1]} is not an executable (build the dump_optim_ref target)")
        return 1
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="optim_ref_") as directory:
        proc = subprocess.run([sys.argv[1], directory], capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr)
            print(f"FAILED: {sys.argv[1]} exited with {proc.returncode}")
            return 1
        a = ADAMW
        worst_adamw = replay(directory, "adamw", a,
                             lambda groups: torch.optim.AdamW(groups, lr=a["lr"], betas=a["betas"], eps=a["eps"],
                                                              foreach=False),
                             ["exp_avg", "exp_avg_sq"])
        s = SGD
        worst_sgd = replay(directory, "sgd", s,
                           lambda groups: torch.optim.SGD(groups, lr=s["lr"], momentum=s["momentum"], foreach=False),
                           ["momentum_buffer"])
        worst_clip = check_clip(directory)
    print(f"torch {torch.__version__}: max relative difference AdamW {worst_adamw:.3e}, SGD {worst_sgd:.3e}, "
          f"clipped grad {worst_clip:.3e} (tolerance {TOLERANCE:g})")
    for f in failures:
        print("FAILED: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
