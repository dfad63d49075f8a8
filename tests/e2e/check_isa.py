#!/usr/bin/env python3
"""The CPU instruction-set cap (ST_MAX_CPU_ISA, core/cpu/isa.h) and the MFU the
step lines report. Usage: check_isa.py TRAINER CHECK

  cap        llama-tiny (BF16 parameters) at ST_MAX_CPU_ISA=avx2: exit 0, the start-up
             CPU line names ISA avx2 (and the cap, when the machine has more) and BF16
             GEMMs widened to F32; its losses match the run at the machine's own level
             within the BF16 bound below (equal when the machine is AVX2-only, where
             both runs take the same path).
  bad-value  ST_MAX_CPU_ISA=avx9: exit 1 before step 1, one error naming the variable,
             its value and the accepted levels.
  mfu-cap    a start-up peak scaled to a thousandth (test hook): the step lines report
             MFU 100.0% at most, and one warning says the peak was measured low.
Each check prints what it observed; a failure exits 1.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check_main, expect, fail, loss_by_step, metrics_rows, sets  # noqa: E402
import subprocess  # noqa: E402

TINY = "configs/llama-tiny.yaml"


def run_env(cmd, env):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, **env))


def cpu_line(out):
    m = re.search(r"INFO  CPU: .*GEMMs by (.*)$", out, re.M)
    if not m:
        fail(f"no start-up CPU line:\n{out[-3000:]}")
    return m.group(1)


def check_cap(trainer, tmp):
    losses = {}
    lines = {}
    for level in ("avx2", ""):
        metrics = os.path.join(tmp, f"m-{level or 'own'}.jsonl")
        env = {"ST_MAX_CPU_ISA": level}  # "": the machine's own level, whatever the caller's environment says
        proc = run_env([trainer, "--config", TINY, "--steps", "3"] +
                       sets(fsdp__mixed_precision__param_dtype="bf16", logging__metrics_file=metrics), env)
        out = expect(proc, 0, "step 3/3", what=f"llama-tiny at ST_MAX_CPU_ISA={level or '(unset)'}")
        lines[level] = cpu_line(out)
        losses[level] = loss_by_step(metrics)
    capped, own = lines["avx2"], lines[""]
    if "ISA avx2" not in capped or "BF16 widened to F32" not in capped:
        fail(f"at the AVX2 cap the CPU line says: {capped}")
    if "ISA avx2" not in own and "capped by ST_MAX_CPU_ISA; the machine has" not in capped:
        fail(f"the machine has more than AVX2 ({own}) but the capped line does not say so: {capped}")
    # BF16 parameters: the two levels may round GEMM results differently (BF16
    # dot products against widened F32), one BF16 ulp per element at most, which
    # moves a loss of ~5.5 over 3 steps far less than 0.02.
    for step, loss in losses[""].items():
        other = losses["avx2"].get(step)
        if other is None or abs(other - loss) > 0.02:
            fail(f"step {step}: loss {loss} at the machine's level ({own}), {other} at the AVX2 cap")
        if "ISA avx2" in own and other != loss:
            fail(f"step {step}: the machine is AVX2-only, yet the capped run's loss {other} differs from {loss}")
    print(f"cap: capped CPU line '{capped}'; own '{own}'; losses {losses['avx2']} vs {losses['']}")


def check_bad_value(trainer, tmp):
    proc = run_env([trainer, "--config", TINY, "--steps", "1"], {"ST_MAX_CPU_ISA": "avx9"})
    out = expect(proc, 1, "error: ST_MAX_CPU_ISA=avx9 is not an instruction-set level: expected avx2, avx512, "
                 "avx512_bf16 or amx", what="ST_MAX_CPU_ISA=avx9")
    if "step 1/" in out or len([ln for ln in out.splitlines() if "error:" in ln]) != 1:
        fail(f"expected one error line before step 1:\n{out[-3000:]}")
    print("bad-value: ST_MAX_CPU_ISA=avx9 -> exit 1 naming the variable and the levels")


def check_mfu_cap(trainer, tmp):
    metrics = os.path.join(tmp, "m.jsonl")
    proc = run_env([trainer, "--config", TINY, "--steps", "4"] + sets(logging__metrics_file=metrics),
                   {"ST_TEST_CPU_PEAK_SCALE": "0.001"})
    out = expect(proc, 0, "step 4/4", "is above 100%: the start-up GEMM peak", "MFU is reported as at most 100%",
                 what="peak scaled to 1/1000")
    mfus = [float(x) for x in re.findall(r"\| mfu ([\d.]+)% \|", out)]
    if not mfus or max(mfus) > 100.0 or mfus[-1] != 100.0:
        fail(f"step lines' MFU {mfus}: expected at most 100%, and 100% with the peak scaled down")
    if out.count("is above 100%") != 1:
        fail(f"expected the warning once:\n{out[-3000:]}")
    file_mfu = [r["mfu"] for r in metrics_rows(metrics) if "mfu" in r]
    if not file_mfu or max(file_mfu) > 1.0:
        fail(f"metrics file MFU {file_mfu}: expected at most 1")
    print(f"mfu-cap: step lines {mfus}, one warning")


if __name__ == "__main__":
    check_main({"cap": check_cap, "bad-value": check_bad_value, "mfu-cap": check_mfu_cap})
