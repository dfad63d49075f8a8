#!/usr/bin/env python3
"""End-to-end checks of `trainer` runs (standard library only).

    check_training.py TRAINER CHECK

CHECK is one of:
  toy         the toy model's loss after 50 steps is at most TOY_RATIO of its first loss
  text        llama-tiny on a text file: the mean loss of its last 10 steps is below the
              file's unigram byte entropy (what a model that ignores context can reach)
  dp          data parallel: -np 2 and -np 1 with the same global batch give losses
              equal within 1e-5 relative over 10 steps
  bad-input   an unknown model name, a tokens file of the wrong size and a batch
              that does not divide world x micro-batch fail with a clear message
  fsdp-default  -np 4 with configs/llama-tiny.yaml trains with FULL_SHARD, BF16 and
              recomputation (as the log says) and the loss falls
  step-line   llama-tiny at 2 ranks, 12 steps, logging.interval 5: the metrics file has every
              step, its keys start step, loss; each step line's loss, ms/step and tok/s are the
              means over its interval recomputed here from the file's per-step values (the
              process's first step untimed), its MFU is those tok/s against the measured CPU
              peak, elapsed and eta read NmSSs, and the summary's tok/s is the same mean over
              steps 2..12; the 1.7 MB save's line gives its size and time but no rate
  fsdp-bad-input  a shard_group_size that does not divide the world, an unknown module
              type in the wrap list and an unknown strategy fail with a clear message
  gpu         llama-tiny, 20 steps, on the GPU vs on the CPU with the same config: per-step
              losses agree within GPU_BF16_BOUND (BF16 params, the default) and
              GPU_F32_BOUND (F32 params) relative
  gpu-mpi     several ranks sharing one GPU through the MPI backend (device tensors staged
              through host memory): FULL_SHARD at 2 and 4 ranks vs NO_SHARD at 1 rank, F32,
              within 1e-5 relative per step, as the CPU FSDP equivalence
Each check prints what it measured; a failure exits 1. The gpu checks exit 77
(CTest's skip) when no GPU is visible.
"""
import collections
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SKIP, TEXT, check_main, fail, metrics_rows, mpirun, run  # noqa: E402

# The toy bound, stated here and in docs/training.md ("Correctness checks"). Measured on the CI machine
# kind: 0.696 -> 0.072 (ratio 0.10) in 50 steps, so 0.5 leaves room for
# harmless numeric changes but not for a broken gradient.
TOY_RATIO = 0.5
# GPU vs CPU: the same rounding rules (BF16 storage, F32 math) but another
# summation order in GEMMs and reductions. The CPU FSDP tests measure BF16 vs
# F32 at <= 7.5e-5 per step over 10 steps; GPU vs CPU in BF16 sees order
# effects of the same size compounded over 20 steps, so the bound is set at
# 5e-3, still far below what a wrong kernel does (1e-2 and more after a step).
# Not yet measured on a GPU (no GPU session so far): confirm and tighten.
GPU_BF16_BOUND = 5e-3
GPU_F32_BOUND = 1e-4


def gpu_visible():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


def losses(trainer, config, sets, np=None, tmp="."):
    metrics = os.path.join(tmp, f"metrics-{np}-{len(sets)}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [trainer, "--config", config, "--set", f"logging.metrics_file={metrics}"]
    for s in sets:
        cmd += ["--set", s]
    run((mpirun(np) if np else []) + cmd)
    rows = metrics_rows(metrics)
    # Models without tokens (the toy) report samples/s only.
    rate = "samples_per_s" if "toy" in config else "tokens_per_s"
    for key in ("step", "loss", "lr", "grad_norm", rate, "samples_per_s", "elapsed_s", "peak_bytes"):
        if key not in rows[0]:
            fail(f"metrics file lacks key '{key}'")
    if "toy" in config and "tokens_per_s" in rows[0]:
        fail("the toy model has no tokens, but its metrics report tokens_per_s")
    return [r["loss"] for r in rows]


def check_toy(trainer, tmp):
    ls = losses(trainer, "configs/toy.yaml", ["train.steps=50"], tmp=tmp)
    print(f"toy: loss {ls[0]:.5f} -> {ls[-1]:.5f} after {len(ls)} steps (ratio {ls[-1] / ls[0]:.3f}, bound {TOY_RATIO})")
    if len(ls) != 50 or not ls[-1] <= TOY_RATIO * ls[0]:
        fail("toy loss did not fall enough")


def unigram_entropy(path):
    data = open(path, "rb").read()
    counts = collections.Counter(data)
    return -sum(c / len(data) * math.log(c / len(data)) for c in counts.values())


def check_text(trainer, tmp):
    ls = losses(trainer, "configs/llama-tiny.yaml", ["data.kind=text", f"data.path={TEXT}"], tmp=tmp)
    bound = unigram_entropy(TEXT)
    tail = sum(ls[-10:]) / len(ls[-10:])
    print(f"text: loss {ls[0]:.4f} -> {ls[-1]:.4f} nats after {len(ls)} steps; mean of the last 10 {tail:.4f} "
          f"< unigram entropy {bound:.4f} (uniform {math.log(256):.4f})")
    if len(ls) < 10 or not tail < bound:
        fail("llama-tiny did not learn more than byte frequencies")


def check_dp(trainer, tmp):
    sets = ["train.steps=10"]
    one = losses(trainer, "configs/llama-tiny.yaml", sets, np=1, tmp=tmp)
    two = losses(trainer, "configs/llama-tiny.yaml", sets, np=2, tmp=tmp)
    worst = max(abs(a - b) / abs(b) for a, b in zip(one, two))
    print(f"dp: np1 {one[0]:.6f}..{one[-1]:.6f}, np2 {two[0]:.6f}..{two[-1]:.6f}, max relative difference {worst:.2e}")
    if len(one) != 10 or len(two) != 10 or worst > 1e-5:
        fail("np 2 and np 1 losses differ")


def expect_error(cmd, text):
    proc = run(cmd, expect_ok=False)
    if proc.returncode == 0 or text not in proc.stderr:
        sys.stderr.write(proc.stderr)
        fail(f"expected a non-zero exit and '{text}' from: {' '.join(cmd)}")
    line = next(l for l in proc.stderr.splitlines() if text in l)
    print(f"ok: exit {proc.returncode}: {line.strip()}")


def check_bad_input(trainer, tmp):
    expect_error([trainer, "--config", "configs/llama-tiny.yaml", "--set", "model.name=gpt"], "model.name")
    bad = os.path.join(tmp, "odd.bin")
    with open(bad, "wb") as f:
        f.write(bytes(1001))
    expect_error([trainer, "--config", "configs/llama-tiny.yaml", "--set", "data.kind=tokens", "--set",
                  "data.token_format=headerless", "--set", f"data.path={bad}"], "not a multiple of 2")
    expect_error([trainer, "--config", "configs/llama-tiny.yaml", "--set", "data.kind=tokens", "--set",
                  f"data.path={bad}"], f"tokens file '{bad}' is not an llm.c shard: it starts with 0 instead of")
    expect_error(mpirun(2) + [trainer, "--config", "configs/llama-tiny.yaml", "--set",
                              "train.global_batch_size=13"], "train.global_batch_size (13) must be divisible")


def check_fsdp_default(trainer, tmp):
    metrics = os.path.join(tmp, "m.jsonl")
    proc = run(mpirun(4) + [trainer, "--config", "configs/llama-tiny.yaml", "--set", f"logging.metrics_file={metrics}"])
    want = "4 rank(s), FULL_SHARD (shard groups of 4), param_dtype bf16, reduce_dtype f32, recomputed layers 2"
    if want not in proc.stderr:
        fail(f"the log does not say: {want}")
    ls = [r["loss"] for r in metrics_rows(metrics)]
    print(f"fsdp-default: {want}; loss {ls[0]:.4f} -> {ls[-1]:.4f} over {len(ls)} steps")
    if not ls[-1] < ls[0] - 1.0:
        fail("the loss did not fall by at least 1 nat")


def check_fsdp_bad_input(trainer, tmp):
    expect_error(mpirun(4) + [trainer, "--config", "configs/llama-tiny.yaml", "--set",
                              "fsdp.sharding_strategy=HYBRID_SHARD", "--set", "fsdp.shard_group_size=3"],
                 "fsdp.shard_group_size (3) must divide the world size (4)")
    expect_error([trainer, "--config", "configs/llama-tiny.yaml", "--set", "fsdp.auto_wrap.module_types=[Decoder]"],
                 "no module of type 'Decoder'")
    expect_error([trainer, "--config", "configs/llama-tiny.yaml", "--set", "fsdp.sharding_strategy=ZERO3"],
                 "expected one of FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD")


def max_rel_diff(a, b):
    if len(a) != len(b):
        fail(f"runs logged {len(a)} and {len(b)} steps")
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def check_gpu(trainer, tmp):
    if not gpu_visible():
        print("gpu: no GPU visible (nvidia-smi -L failed); skipped")
        sys.exit(SKIP)
    common = ["train.steps=20", "logging.interval=1"]
    for dtype, bound in (("bf16", GPU_BF16_BOUND), ("f32", GPU_F32_BOUND)):
        sets = common + [f"fsdp.mixed_precision.param_dtype={dtype}"]
        cpu = losses(trainer, "configs/llama-tiny.yaml", sets + ["train.device=cpu"], tmp=tmp)
        gpu = losses(trainer, "configs/llama-tiny.yaml", sets + ["train.device=cuda"], tmp=tmp)
        err = max_rel_diff(gpu, cpu)
        print(f"gpu: llama-tiny {dtype}, 20 steps: loss {gpu[0]:.4f} -> {gpu[-1]:.4f} on the GPU, "
              f"{cpu[0]:.4f} -> {cpu[-1]:.4f} on the CPU; max relative difference {err:.2e} (bound {bound})")
        if not err < bound:
            fail(f"{dtype}: the GPU run left the CPU run's losses")


def check_gpu_mpi(trainer, tmp):
    if not gpu_visible():
        print("gpu-mpi: no GPU visible (nvidia-smi -L failed); skipped")
        sys.exit(SKIP)
    sets = ["train.steps=10", "logging.interval=1", "train.device=cuda", "fsdp.mixed_precision.param_dtype=f32",
            "train.global_batch_size=8", "train.micro_batch_size=1"]
    ref = losses(trainer, "configs/llama-tiny.yaml", sets + ["fsdp.sharding_strategy=NO_SHARD"], np=1, tmp=tmp)
    for np in (2, 4):
        got = losses(trainer, "configs/llama-tiny.yaml", sets + ["fsdp.sharding_strategy=FULL_SHARD"], np=np, tmp=tmp)
        err = max_rel_diff(got, ref)
        print(f"gpu-mpi: {np} ranks on one GPU, FULL_SHARD vs 1 rank NO_SHARD: max relative difference {err:.2e}")
        if not err < 1e-5:
            fail(f"{np} ranks on one GPU do not match one rank")


STEP_LINE = re.compile(r"step (\d+)/12 \| loss ([\d.]+) \| lr \S+ \| grad_norm [\d.]+ \| ([\d,]+) tok/s \(all ranks\) \| "
                       r"([\d.]+) ms/step \| mfu ([\d.]+)% \| peak [\d.]+ [kMGT]?B \| elapsed (\d+m\d\ds) \| eta (\d+m\d\ds)$")


def check_step_line(trainer, tmp):
    metrics = os.path.join(tmp, "m.jsonl")
    proc = run(mpirun(2) + [trainer, "--config", "configs/llama-tiny.yaml", "--steps", "12", "--set",
                            "logging.interval=5", "--set", f"logging.metrics_file={metrics}", "--set",
                            f"checkpoint.dir={os.path.join(tmp, 'ck')}"])
    # A save of 1.7 MB gives its size and time, no rate (its time is fixed costs).
    save = re.search(r"saved checkpoint \S+/step-000010 \(unified\): ([\d.]+ [kM]B in [\d.]+ s), training blocked "
                     r"[\d.]+ s$", proc.stderr, flags=re.M)
    if not save:
        fail("the save line is not 'saved checkpoint DIR/step-000010 (unified): SIZE in T s, training blocked T s'")
    with open(metrics) as f:
        lines = [ln for ln in f.read().splitlines() if '"event"' not in ln]
    rows = metrics_rows(metrics)
    if [r["step"] for r in rows] != list(range(1, 13)):
        fail(f"the metrics file holds steps {[r['step'] for r in rows]}, not every step 1..12")
    if not all(ln.startswith('{"step":%d,"loss":' % r["step"]) for ln, r in zip(lines, rows)):
        fail(f"a metrics line does not start with step, then loss: {lines[0][:80]}")
    tokens = 12 * 32  # configs/llama-tiny.yaml: global batch 12, seq_len 32
    peak = float(re.search(r"device peak ([\d.]+) GFLOP/s per rank \(1024\^3 \S+ through ops::gemm, best of 5, measured in "
                           r"[\d.]+ s\)", proc.stderr)[1]) * 1e9
    flops = float(re.search(r"model FLOPs: (\S+) per token", proc.stderr)[1])
    found = [STEP_LINE.search(ln) for ln in proc.stderr.splitlines() if re.search(r"step \d+/12 \|", ln)]
    if None in found or [int(m[1]) for m in found] != [5, 10, 12]:
        fail("step lines not as expected:\n" + "\n".join(ln for ln in proc.stderr.splitlines() if "/12 |" in ln))
    before = 0
    for m in found:
        step = int(m[1])
        interval = [r for r in rows if before < r["step"] <= step]
        timed = [r for r in interval if r["step"] > 1] or interval  # step 1 includes warm-up
        loss = sum(r["loss"] for r in interval) / len(interval)
        ms = sum(r["step_ms"] for r in timed) / len(timed)
        rate = tokens / (ms / 1e3)
        mfu = min(100 * rate / 2 * flops / peak, 100.0)  # a peak measured low on a busy machine: capped
        if (abs(float(m[2]) - loss) > 5.1e-5 or abs(float(m[4]) - ms) > 0.051 or
                abs(int(m[3].replace(",", "")) - rate) > 0.51 + 1e-3 * rate or abs(float(m[5]) - mfu) > 0.051 + 0.01 * mfu):
            fail(f"step {step}: line says loss {m[2]}, {m[4]} ms/step, {m[3]} tok/s, mfu {m[5]}%; the file's steps "
                 f"{before + 1}..{step} give {loss:.4f}, {ms:.1f}, {rate:,.0f}, {mfu:.1f}%")
        before = step
    timed = rows[1:]
    rate = tokens * len(timed) / sum(r["step_ms"] / 1e3 for r in timed)
    summary = re.search(r"done: steps 1\.\.12, final loss [\d.]+, ([\d,]+) tok/s \(all ranks, steps 2\.\.12, MFU [\d.]+%\)",
                        proc.stderr)
    if not summary or abs(int(summary[1].replace(",", "")) - rate) > 0.51 + 1e-3 * rate:
        fail(f"the summary's tok/s is not the mean over steps 2..12 ({rate:,.0f}): {summary and summary[0]}")
    print(f"step-line: 12 steps in the file, lines at 5, 10, 12 match the file's means "
          f"(e.g. {found[-1][0]}); summary {summary[1]} tok/s = steps 2..12")


def main():
    check_main({"toy": check_toy, "text": check_text, "dp": check_dp, "bad-input": check_bad_input,
                "step-line": check_step_line,
                "fsdp-default": check_fsdp_default, "fsdp-bad-input": check_fsdp_bad_input, "gpu": check_gpu,
                "gpu-mpi": check_gpu_mpi})


if __name__ == "__main__":
    main()
