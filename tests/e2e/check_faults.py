#!/usr/bin/env python3
"""Faults a cluster produces every week, end to end through the trainer (standard library only).

    check_faults.py TRAINER CKPT_TOOL CHECK

CHECK is one of:
  nonfinite   A unified checkpoint at step 10 is edited (CRCs kept valid) so that
              one optimizer tensor drives its weight to Inf in the next update.
              Resuming from it at 2 ranks with --stop-after 11: step 11 trains
              with a finite loss, the save of step 11 is refused naming the tensor
              and the step, exit 1, `latest` still names step-000010 and no
              step-000011 exists. A checkpoint whose master weights hold NaN (CRC
              valid) is reported by `ckpt verify` (exit 1) and skipped by
              --resume auto, which says so and loads the next older one. A loss
              that becomes non-finite (weights of 3e38 loaded) stops the toy model
              and llama at their first step (exit 1, message names the step).
  ckpt-dir    checkpoint.dir under a regular file, on procfs, on a read-only and on a
              full file system (private tmpfs mounts), and with less free space than
              one checkpoint, fail before step 1 with exit 1 and a message naming
              checkpoint.dir; room for fewer than two checkpoints is a warning.
  lock        a second job on the checkpoint.dir of a running job fails at
              start-up naming the first job's pid and host; the first job
              finishes with exit 0 and all its checkpoints; after it (and after a
              SIGKILLed job) the directory is free again.
  strict      a 2-layer checkpoint into a 1-layer model: exit 1 listing the
              config.json difference and the unexpected tensors; with
              checkpoint.strict=false it loads with a warning. A checkpoint
              lacking tensors the model needs (3 layers from 2) fails even
              non-strict. rope_theta differing is caught by config.json alone.
              A checkpoint at or past train.steps and a trainer_state.json with
              a negative or overflowing step are errors; `auto` falls back past a
              corrupt trainer_state.json but never past a misfit. Another
              model size (wider MLP) names the reshaped tensors, offers
              --overwrite or another checkpoint.dir, never checkpoint.strict,
              and never falls back, at either checkpoint.strict.
  inputs      a token >= vocab_size at the end of the last of two llm.c files fails a
              4-rank run before step 1 with one line naming the file, byte offset and
              value; --config that is a directory, empty, only comments, a list or a
              scalar fails with one line; `latest` that is a FIFO, a directory or a
              symlink loop is reported and resume falls back, without hanging.
  resume-refused   the issue's reproduction: llama-tiny saved at steps 10 and 20
              with keep_last 1, then step-000020's master_weights-* removed: the rerun
              (interval 1, keep_last 1) exits 1 before step 1 with one error naming
              step-000020, the missing file and the ways on (restore, --resume PATH,
              --overwrite); step-000020 is still there and `latest` unchanged.
  resume-fallback  step-000010 good, step-000020 damaged: --resume auto warns naming
              step-000020 and why, resumes from step-000010; keep_last 1 keeps the
              damaged step-000020 (warned once), deletes only this run's older steps,
              and `latest` stays at step-000020; the next run falls back to this run's
              newest step with the warning and, reaching step 20 again, moves the
              damaged step-000020 to replaced-step-000020-<pid> instead of over it.
  resume-overwrite the damaged-only directory of resume-refused with --overwrite:
              the old steps are moved aside, training starts at step 1, exit 0.
  resume-ranks     2 ranks, one of which (ST_TEST_RESUME_VIEW_OF, a test hook) sees
              step-000010 incomplete, sees no step directory, or cannot list the
              directory; and rank 0 seeing none while rank 1 sees step-000010: each
              exits 1 (no hang) with one error naming the rank, its host and what it
              sees; the directory is unchanged. --resume ROOT that rank 1 resolves
              differently: exit 1 naming what each rank resolved.
  metrics     logging.metrics_file that cannot be written (/dev/full, and a file on a
              full private tmpfs that fills up mid-run): one WARNING naming the file
              and the reason, training goes on, exit 0, every checkpoint is saved,
              and the file keeps only complete lines. A metrics file that ends in a
              half-written line (a run killed mid-write) is cut back to its last
              complete line, with a warning, before the next run appends to it.
  memory      llama-tiny at train.seq_len 2048 under a 1200 MiB RLIMIT_DATA: the
              start-up `memory:` line gives the activations of the micro-batch with
              and without recomputation (proportional to the micro-batch, less when
              recomputed); micro-batch 128 is refused before step 1 (exit 1, one
              line) naming the largest micro-batch that fits and offering
              recomputation; both then train under the same limit; with the
              refusal disabled (test hook) the allocation failure names step 1,
              the phase and micro-batch, and what to lower.
  fifos       a FIFO as logging.metrics_file, data.path (text and tokens), data.val_path and
              data.tokenizer: exit 1 before step 1 with one line naming the key's file and
              "is not a regular file (a FIFO)" -- no hang (a 120 s guard; the old build
              blocked in open()).
  limits      values no run can hold, each refused before anything is allocated, exit 1,
              one line naming the key: train.global_batch_size 9223372036854775807 and
              model.num_hidden_layers 100000000 (config errors), a global batch larger
              than the data (8192 of the toy model's 4096 samples, both numbers named);
              configs/llama.yaml on the CPU under a 6 GiB RLIMIT_DATA and llama-tiny with
              20000 layers under 1200 MiB: "the run does not fit in memory" before the
              model is built (no "model llama:" line), naming master weights, gradients,
              optimizer state and what would fit (more ranks, fewer layers); the layer
              count it names trains under the same limit. A YAML null where a path is
              expected (checkpoint.dir=~, logging.metrics_file: null in a file) is an error naming
              the key; `--set checkpoint.dir=` stays the empty string (no checkpoints).
              logging.metrics_file in a directory that does not exist: created, as
              checkpoint.dir is. data.kind text on a binary file: exit 1 naming the file
              and the first bad byte, the rule prepare applies. fsdp.shard_group_size 2
              at 3 ranks (scripts/launch): the error is printed once for the job.
Each check prints what it observed; a failure exits 1.
"""
import json
import os
import re
import shutil
import socket
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    ROOT, check_main, crc32c, expect, fail, loss_by_step, metrics_rows, mpirun, resum_marker, run, sets)

TINY = "configs/llama-tiny.yaml"
TOY = "configs/toy.yaml"


def latest_name(root):
    with open(os.path.join(root, "latest")) as f:
        return f.read().strip()


# --- safetensors editing with valid checksums (harness.crc32c, harness.resum_marker) ---

def rewrite_tensor(ckpt, index_name, key, values_for):
    """Replaces tensor `key` (F32) of a unified checkpoint by values_for(n) and
    records its new CRC32C in the index, as an intact but bad save would. Every
    file keeps its size, so the COMPLETE marker still vouches for them: the
    number is replaced in place and padded with JSON whitespace (the last value
    is nudged by a few ulps until the new CRC's digits fit)."""
    index_path = os.path.join(ckpt, index_name)
    with open(index_path) as f:
        text = f.read()
    index = json.loads(text)
    path = os.path.join(ckpt, index["weight_map"][key])
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        begin, end = header[key]["data_offsets"]
        assert header[key]["dtype"] == "F32", header[key]
        count = (end - begin) // 4
        old = re.search(r'"%s": (\d+)' % re.escape(key), text)
        for nudge in range(1000):
            values = values_for(count)
            data = struct.pack(f"<{count - 1}f", *values[:-1]) + struct.pack("<I", struct.unpack(
                "<I", struct.pack("<f", values[-1]))[0] + nudge)
            crc = str(crc32c(data))
            if len(crc) <= len(old.group(1)) + 1:
                break
        f.seek(8 + n + begin)
        f.write(data)
    new = f'"{key}":' + crc.rjust(len(old.group(0)) - len(key) - 3)
    text = text[:old.start()] + new + text[old.end():]
    with open(index_path, "w") as f:
        f.write(text)
    resum_marker(ckpt, index_name)
    return count


def check_nonfinite(trainer, ckpt_tool, tmp):
    root = os.path.join(tmp, "nf")
    base = sets(checkpoint__dir=root, checkpoint__interval=10, train__device="cpu")
    run(mpirun(2) + [trainer, "--config", TINY, "--stop-after", "10"] + base)
    ten = os.path.join(root, "step-000010")
    # exp_avg huge and exp_avg_sq zero: Adam's next update of model.norm.weight is -Inf,
    # while the loss and the gradients of step 11 stay finite.
    key = "model.norm.weight"
    rewrite_tensor(ten, "optimizer.safetensors.index.json", key + ".exp_avg", lambda n: [3.0e38] * n)
    rewrite_tensor(ten, "optimizer.safetensors.index.json", key + ".exp_avg_sq", lambda n: [0.0] * n)
    metrics = os.path.join(tmp, "nf.jsonl")
    proc = run(mpirun(2) + [trainer, "--config", TINY, "--resume", "auto", "--stop-after", "11"] + base +
               sets(logging__metrics_file=metrics), expect_ok=False)
    expect(proc, 1, "checkpoint of step 11 was not committed (latest still names step-000010)",
           f"non-finite values in tensor '{key}'", what="save of non-finite state")
    # Found on the rank that holds the tensor, agreed by both: one line, naming the tensor.
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    if len(errors) != 1 or key not in errors[0]:
        fail(f"the refused save should print one error line naming '{key}', printed {errors}")
    step11 = loss_by_step(metrics)
    if 11 not in step11 or not step11[11] < 1e30:
        fail(f"step 11 should have trained with a finite loss first: {step11}")
    leftovers = sorted(os.listdir(root))
    if latest_name(root) != "step-000010" or any(n.startswith(("step-000011", ".tmp")) for n in leftovers):
        fail(f"latest moved or debris stayed: latest={latest_name(root)}, entries={leftovers}")
    print(f"nonfinite: step 11 loss {step11[11]:.4f}; save refused, exit 1, latest = step-000010, "
          f"directory holds {leftovers}")

    # A checkpoint with NaN master weights and valid CRCs (e.g. written by an older version).
    root2 = os.path.join(tmp, "nf2")
    base2 = sets(checkpoint__dir=root2, checkpoint__interval=10, train__device="cpu")
    run(mpirun(2) + [trainer, "--config", TINY, "--stop-after", "20"] + base2)
    twenty = os.path.join(root2, "step-000020")
    n = rewrite_tensor(twenty, "master_weights.safetensors.index.json", "model.norm.weight",
                       lambda n: [float("nan")] * 3 + [float("inf")] * 2 + [1.0] * (n - 5))
    proc = run([ckpt_tool, "verify", twenty], expect_ok=False)
    expect(proc, 1, "holds non-finite values: 3 NaN and 2 Inf, the first at element 0", what="ckpt verify")
    print(f"nonfinite: ckpt verify of a NaN checkpoint: exit {proc.returncode}")
    proc = run(mpirun(2) + [trainer, "--config", TINY, "--resume", "auto", "--stop-after", "21"] + base2)
    expect(proc, 0, f"--resume auto: {twenty} does not load",
           "tensor 'model.norm.weight' (master) holds 3 NaN and 2 Inf values",
           f"falling back to {os.path.join(root2, 'step-000010')}", "resumed from " + os.path.join(root2, "step-000010"),
           what="auto fallback past a NaN checkpoint")
    print(f"nonfinite: --resume auto skipped step-000020 ({n} elements, 5 non-finite) and resumed from step 10")

    # The loss itself becoming non-finite stops training, for both models: weights
    # that are finite but huge (3e38) make the next forward overflow.
    for config, index, key in ((TOY, "model.safetensors.index.json", "net2.weight"),
                               (TINY, "master_weights.safetensors.index.json", "lm_head.weight")):
        root3 = os.path.join(tmp, "loss-" + os.path.basename(config))
        run([trainer, "--config", config, "--stop-after", "2"] + sets(checkpoint__dir=root3))
        rewrite_tensor(os.path.join(root3, "step-000002"), index, key, lambda n: [3.0e38] * n)
        proc = run([trainer, "--config", config, "--resume", "auto"] + sets(checkpoint__dir=root3), expect_ok=False)
        expect(proc, 1, "step 3: the loss is", "stopped before the optimizer step",
               "the last checkpoint in checkpoint.dir stays latest", what=f"{config} with an overflowing loss")
        if latest_name(root3) != "step-000002":
            fail(f"{config}: latest moved to {latest_name(root3)}")
        line = [ln for ln in proc.stderr.splitlines() if "error:" in ln][-1]
        print(f"nonfinite: {config} from weights of 3e38: exit 1: {line[:150]}")


def check_ckpt_dir(trainer, ckpt_tool, tmp):
    afile = os.path.join(tmp, "afile")
    with open(afile, "w") as f:
        f.write("not a directory\n")
    for where, text in ((os.path.join(afile, "ckpt"), f"'{afile}' is not a directory"),
                        ("/proc/self/shardtrain-ckpt", "checkpoint.dir '/proc/self/shardtrain-ckpt'"),
                        ("/proc", "is on procfs")):
        metrics = os.path.join(tmp, "dir.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        t0 = time.time()
        proc = run(mpirun(2) + [trainer, "--config", TINY] +
                   sets(checkpoint__dir=where, logging__metrics_file=metrics), expect_ok=False)
        expect(proc, 1, "checkpoint.dir", text, what=f"checkpoint.dir={where}")
        if os.path.exists(metrics):
            fail(f"checkpoint.dir={where}: training ran before the directory was checked")
        print(f"ckpt-dir: {where}: exit 1 before step 1 ({time.time() - t0:.1f} s including mpirun): "
              f"{[ln for ln in proc.stderr.splitlines() if 'error' in ln][0][:150]}")
    check_file_systems(trainer, tmp)


def in_tmpfs(tmp, options, fill, cmd):
    """Runs `cmd` (ending in the checkpoint.dir value, as '{mnt}/ckpt') in a private
    mount namespace where {mnt} is a fresh tmpfs mounted with `options`; `fill`
    bytes are written into it first. None when this machine cannot do that."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        return None
    mnt = os.path.join(tmp, "mnt-" + options.replace(",", "-").replace("=", ""))
    os.makedirs(mnt, exist_ok=True)
    script = ('mount -t tmpfs -o "$1" none "$2" || exit 99; '
              'if [ "$3" -gt 0 ]; then head -c "$3" /dev/zero > "$2/fill" 2>/dev/null; fi; '
              'case "$1" in ro*) mount -o remount,ro "$2" || exit 99;; esac; shift 3; exec "$@"')
    args = [a.replace("{mnt}", mnt) for a in cmd]
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", options, mnt, str(fill)] + args,
                          cwd=ROOT, capture_output=True, text=True)
    return None if proc.returncode == 99 else proc


def check_file_systems(trainer, tmp):
    """Read-only, full and nearly full file systems, on tmpfs mounts of our own."""
    base = [trainer, "--config", TINY, "--steps", "2", "--set", "checkpoint.dir={mnt}/ckpt"]
    cases = (("ro,size=4m", 0, 1, "cannot be created: Read-only file system"),
             ("size=256k", 256 << 10, 1, "is not writable: No space left on device"),
             ("size=1m", 0, 1, "less than one checkpoint of this run needs (about 1.7 MB)"),
             ("size=3m", 0, 0, "room for fewer than two checkpoints of about 1.7 MB each"))
    for options, fill, code, text in cases:
        proc = in_tmpfs(tmp, options, fill, base)
        if proc is None:
            print(f"ckpt-dir: tmpfs {options}: this machine cannot mount a private tmpfs; case not run")
            continue
        expect(proc, code, "checkpoint.dir", text, what=f"tmpfs {options}")
        line = [ln for ln in proc.stderr.splitlines() if "checkpoint.dir '" in ln][0]
        print(f"ckpt-dir: tmpfs {options}{' filled' if fill else ''}: exit {proc.returncode}: {line[:170]}")


def check_lock(trainer, ckpt_tool, tmp):
    root = os.path.join(tmp, "locked")
    metrics = os.path.join(tmp, "first.jsonl")
    first = subprocess.Popen(mpirun(2) + [trainer, "--config", TINY, "--steps", "400"] +
                             sets(checkpoint__dir=root, checkpoint__interval=100, logging__metrics_file=metrics),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not os.path.exists(metrics) or len(open(metrics).readlines()) < 3):
        time.sleep(0.1)
    if first.poll() is not None:
        fail("the first job ended before the second started")
    second = run(mpirun(2) + [trainer, "--config", TINY, "--steps", "400"] + sets(checkpoint__dir=root),
                 expect_ok=False)
    holder = None
    with open(os.path.join(root, ".lock")) as f:
        holder = f.read().strip()
    expect(second, 1, f"checkpoint.dir '{root}' is in use by {holder}", what="second job")
    out, err = first.communicate(timeout=600)
    steps = sorted(n for n in os.listdir(root) if n.startswith("step-"))
    if first.returncode != 0 or steps != ["step-000100", "step-000200", "step-000300", "step-000400"]:
        sys.stderr.write(err[-3000:])
        fail(f"the first job was disturbed: exit {first.returncode}, checkpoints {steps}")
    print(f"lock: second job exit 1 ('in use by {holder}'); first job exit 0 with {steps}")
    # Free again after the holder ended, also when it was SIGKILLed.
    victim = subprocess.Popen([trainer, "--config", TINY, "--steps", "100000", "--resume", "auto"] +
                              sets(checkpoint__dir=root, checkpoint__interval=0, logging__interval=1000),
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Killed once it holds the lock (its pid is in the lock file), not after a guessed delay.
    lock, deadline = os.path.join(root, ".lock"), time.time() + 300
    while victim.poll() is None and time.time() < deadline and f"pid {victim.pid} " not in open(lock).read():
        time.sleep(0.05)
    if victim.poll() is not None or f"pid {victim.pid} " not in open(lock).read():
        fail(f"the job to be killed never took the lock (exit {victim.returncode})")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    proc = run([trainer, "--config", TINY, "--steps", "402", "--resume", "auto"] + sets(checkpoint__dir=root))
    expect(proc, 0, "resumed from", what="after a SIGKILLed holder")
    print("lock: after the holder was SIGKILLed, the next job took the directory and resumed (exit 0)")


def check_strict(trainer, ckpt_tool, tmp):
    two = os.path.join(tmp, "two")
    run([trainer, "--config", TINY, "--stop-after", "10"] + sets(checkpoint__dir=two))
    ten = os.path.join(two, "step-000010")
    one_layer = sets(model__num_hidden_layers=1)
    proc = run([trainer, "--config", TINY, "--resume", ten] + one_layer, expect_ok=False)
    expect(proc, 1, f"checkpoint {ten} does not fit this run",
           "config.json differs from the run: num_hidden_layers 2 (model.num_hidden_layers 1)",
           "9 tensor(s) of the checkpoint are not in the model: model.layers.1.input_layernorm.weight",
           "checkpoint.strict: false loads it anyway",
           "to keep this model, start a new run (leave out --resume); to resume, use the checkpoint's model.* settings",
           what="2 layers into 1")
    print("strict: 2-layer checkpoint into a 1-layer model: exit 1, lists num_hidden_layers and 9 tensors")
    proc = run([trainer, "--config", TINY, "--resume", ten, "--stop-after", "11"] + one_layer +
               sets(checkpoint__strict="false"))
    expect(proc, 0, "(checkpoint.strict: false)", "resumed from", what="non-strict 2 into 1")
    print("strict: the same with checkpoint.strict=false: warning, exit 0")
    for extra, text in ((sets(model__num_hidden_layers=3), "tensor(s) the run needs are missing from it: "
                                                          "model.layers.2.input_layernorm.weight (exp_avg)"),
                        (sets(model__rope_theta=500000.0), "rope_theta 10000.0 (model.rope_theta 500000.0)")):
        for strict in ("true", "false"):
            proc = run([trainer, "--config", TINY, "--resume", ten] + extra + sets(checkpoint__strict=strict),
                       expect_ok=False)
            if "rope_theta" in text and strict == "false":
                expect(proc, 0, text, what="rope_theta non-strict")
            else:
                expect(proc, 1, text, what=f"{extra} strict={strict}")
    print("strict: 3 layers from 2 fails even non-strict; rope_theta is caught from config.json alone")
    # init_from follows the same rule.
    proc = run([trainer, "--config", TINY] + one_layer + sets(checkpoint__init_from=ten), expect_ok=False)
    expect(proc, 1, "does not fit this run", what="init_from 2 into 1")

    # Finished runs and corrupt steps.
    proc = run([trainer, "--config", TINY, "--resume", ten, "--steps", "10"], expect_ok=False)
    expect(proc, 1, f"checkpoint {ten} is at step 10, the run ends at step 10 (train.steps): this run is finished; "
                    "its run was set to end at step 60: --steps 60 continues that schedule", what="finished run")
    state_path = os.path.join(ten, "trainer_state.json")
    with open(state_path) as f:
        good = f.read()
    for bad, shown in ((-5, "-5"), (10 ** 30, "1e+30"), ("12", '"12"')):
        state = json.loads(good)
        state["step"] = bad
        with open(state_path, "w") as f:
            json.dump(state, f)
        resum_marker(ten, "trainer_state.json")  # as a buggy save would leave it: the marker vouches for the file
        proc = run([trainer, "--config", TINY, "--resume", ten], expect_ok=False)
        expect(proc, 1, f"{state_path} is corrupt: 'step' is {shown}, expected a non-negative integer",
               what=f"step {bad}")
    print("strict: step 10 of 10 says the run is finished; steps -5, 1e30 and \"12\" are corrupt-checkpoint errors")
    # --resume auto: a corrupt trainer_state.json falls back; a misfit does not.
    with open(state_path, "w") as f:
        f.write(good)
    resum_marker(ten, "trainer_state.json")
    run([trainer, "--config", TINY, "--stop-after", "20"] + sets(checkpoint__dir=os.path.join(tmp, "auto")))
    auto_root = os.path.join(tmp, "auto")
    # Same size as before and re-summed in the COMPLETE marker, as a buggy save would
    # leave it: the marker vouches for the file, the parser must refuse it.
    corrupt_path = os.path.join(auto_root, "step-000020", "trainer_state.json")
    size = os.path.getsize(corrupt_path)
    with open(corrupt_path, "w") as f:
        f.write('{"step": -1, "consumed_samples": 0, "optimizer_steps": 0}'.ljust(size))
    resum_marker(os.path.dirname(corrupt_path), "trainer_state.json")
    proc = run([trainer, "--config", TINY, "--resume", "auto", "--stop-after", "21"] +
               sets(checkpoint__dir=auto_root))
    expect(proc, 0, "'step' is -1", f"falling back to {os.path.join(auto_root, 'step-000010')}",
           what="auto past a corrupt trainer_state.json")
    proc = run([trainer, "--config", TINY, "--resume", "auto"] + one_layer + sets(checkpoint__dir=auto_root),
               expect_ok=False)
    expect(proc, 1, "does not fit this run", what="auto with a misfit")
    if "falling back" in proc.stderr + proc.stdout:
        fail("--resume auto fell back past a checkpoint that does not fit the model")
    print("strict: --resume auto falls back past a corrupt trainer_state.json, not past a model mismatch")
    # Another model size: tensors of another shape. checkpoint.strict cannot help, so it is not
    # suggested, at either setting; the error offers the ways out, and nothing falls back.
    wider = sets(model__intermediate_size=344)
    for strict in ("true", "false"):
        proc = run([trainer, "--config", TINY, "--resume", "auto"] + wider +
                   sets(checkpoint__dir=auto_root, checkpoint__strict=strict), expect_ok=False)
        expect(proc, 1, "does not fit this run", "intermediate_size 172 (model.intermediate_size 344)",
               "tensor(s) have another shape: model.layers.0.mlp.down_proj.weight ([64, 172] in the checkpoint, "
               "[64, 344] in the model)",
               f"--overwrite moves the checkpoints in {auto_root} aside, or set another checkpoint.dir",
               what=f"wider MLP, strict={strict}")
        out = proc.stderr + proc.stdout
        if "checkpoint.strict: false loads" in out or "falling back" in out:
            fail(f"a shape misfit suggested checkpoint.strict or fell back (strict={strict}):\n{out}")
        if out.count("does not fit this run") != 1:
            fail(f"the misfit was printed {out.count('does not fit this run')} times, expected once:\n{out}")
    print("strict: another model size never falls back and offers --overwrite or another checkpoint.dir, "
          "not checkpoint.strict")


def llmc_shard(tokens):
    """An llm.c uint16 shard: 256 int32 header (magic, version, count), then the tokens."""
    header = struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253))
    return header + struct.pack(f"<{len(tokens)}H", *tokens)


def check_inputs(trainer, ckpt_tool, tmp):
    # A token outside the vocabulary in the last position of the last file, at 4
    # ranks: found at start-up by the rank that scans that part, reported once.
    data = os.path.join(tmp, "tokens")
    os.makedirs(data)
    n = 200_000
    with open(os.path.join(data, "a.bin"), "wb") as f:
        f.write(llmc_shard([(7 * i) % 256 for i in range(n)]))
    bad = [(11 * i) % 256 for i in range(n)]
    bad[-1] = 300
    bad_path = os.path.join(data, "b.bin")
    with open(bad_path, "wb") as f:
        f.write(llmc_shard(bad))
    metrics = os.path.join(tmp, "inputs.jsonl")
    proc = run(mpirun(4) + [trainer, "--config", TINY] +
               sets(data__kind="tokens", data__path=data, logging__metrics_file=metrics), expect_ok=False)
    want = (f"tokens file '{bad_path}': token 300 at byte offset {1024 + 2 * (n - 1)} (token {n - 1} of the file) "
            f"is >= model.vocab_size (256)")
    out = expect(proc, 1, "rank 3: " + want, what="out-of-range token at the end of the data")
    errors = [ln for ln in out.splitlines() if "error:" in ln]
    if len(errors) != 1 or os.path.exists(metrics):
        fail(f"expected one error line before step 1, got {errors} (metrics written: {os.path.exists(metrics)})")
    print(f"inputs: 4 ranks, token 300 at the end of b.bin: exit 1 before step 1: {errors[0][:170]}")
    # The same corpus without the bad token trains.
    bad[-1] = 5
    with open(bad_path, "wb") as f:
        f.write(llmc_shard(bad))
    run(mpirun(2) + [trainer, "--config", TINY, "--steps", "2"] + sets(data__kind="tokens", data__path=data))

    # Config files that are no config.
    cases = {"dir": (None, "is a directory; pass a YAML file"),
             "empty.yaml": ("", "is empty (no settings, only blank lines or comments)"),
             "comments.yaml": ("# a comment\n\n", "is empty (no settings, only blank lines or comments)"),
             "list.yaml": ("- model\n", "at the top level of {}, got a list"),
             "scalar.yaml": ("llama\n", "at the top level of {}, got 'llama'")}
    for name, (text, message) in cases.items():
        path = os.path.join(tmp, name)
        if text is None:
            os.makedirs(path)
        else:
            with open(path, "w") as f:
                f.write(text)
        proc = run(mpirun(2) + [trainer, "--config", path], expect_ok=False)
        out = expect(proc, 1, message.format(path), what=f"--config {name}")
        if len([ln for ln in out.splitlines() if "error:" in ln]) != 1:
            fail(f"--config {name}: expected one error line")
    print("inputs: --config of a directory, an empty file, only comments, a list, a scalar: exit 1, one line each")

    # `latest` that is a FIFO, a directory or a symlink loop: reported, fallback, no hang.
    root = os.path.join(tmp, "latest")
    run([trainer, "--config", TINY, "--stop-after", "10"] + sets(checkpoint__dir=root))
    latest = os.path.join(root, "latest")
    for kind in ("fifo", "directory", "loop"):
        if os.path.isdir(latest) and not os.path.islink(latest):
            os.rmdir(latest)
        elif os.path.lexists(latest):
            os.remove(latest)
        {"fifo": lambda: os.mkfifo(latest), "directory": lambda: os.mkdir(latest),
         "loop": lambda: os.symlink(latest, latest)}[kind]()
        try:
            proc = subprocess.run([trainer, "--config", TINY, "--stop-after", "11"] + sets(checkpoint__dir=root),
                                  cwd=ROOT, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            fail(f"latest as a {kind}: the trainer hung")
        expect(proc, 0, f"--resume auto: {latest}", "using step-000010", "resumed from", what=f"latest as a {kind}")
        # The run re-committed step 11 and replaced latest by a regular file; put the case back for the next kind.
        shutil.rmtree(os.path.join(root, "step-000011"))
    print("inputs: latest as a FIFO, a directory, a symlink loop: said, fell back to step-000010, no hang")


def json_lines(path, what):
    """The lines of a metrics file, each of which must be a whole JSON object."""
    with open(path) as f:
        text = f.read()
    if text and not text.endswith("\n"):
        fail(f"{what}: {path} ends in a half line: {text[-80:]!r}")
    try:
        lines = [json.loads(line) for line in text.splitlines()]
    except ValueError as e:
        fail(f"{what}: {path} holds a line that is not JSON ({e})")
    return [r for r in lines if "event" not in r]  # the step lines; an event line marks where a run began


def check_metrics(trainer, ckpt_tool, tmp):
    run_args = [trainer, "--config", TINY, "--steps", "12"] + sets(checkpoint__interval=5, logging__interval=1)
    warning = "training goes on without writing metrics (checkpoints are not affected)"
    # A device that is always full.
    root = os.path.join(tmp, "full")
    proc = run(run_args + sets(checkpoint__dir=root, logging__metrics_file="/dev/full"), expect_ok=False)
    out = expect(proc, 0, "cannot write logging.metrics_file '/dev/full': No space left on device", warning,
                 "done: steps 1..12", what="metrics on /dev/full")
    if out.count(warning) != 1 or latest_name(root) != "step-000012":
        fail(f"metrics on /dev/full: {out.count(warning)} warnings, latest {latest_name(root)}")
    print(f"metrics: /dev/full: one warning, exit 0, checkpoints {sorted(os.listdir(root))}")
    # A real file system that fills up while the run logs: lines of ~170 bytes into the last free page.
    copy = os.path.join(tmp, "filled.jsonl")
    root = os.path.join(tmp, "tmpfs-run")
    cmd = ["sh", "-c", 'mnt="$1"; shift; "$@"; rc=$?; cp "$mnt/m.jsonl" "' + copy + '"; exit $rc', "sh", "{mnt}"]
    cmd += run_args + ["--steps", "40"] + sets(checkpoint__dir=root, logging__metrics_file="{mnt}/m.jsonl")
    proc = in_tmpfs(tmp, "size=64k", (64 << 10) - 4096, cmd)
    if proc is None:
        print("metrics: this machine cannot mount a private tmpfs; the full-file-system case not run")
    else:
        expect(proc, 0, "No space left on device", warning, "done: steps 1..40", what="metrics on a full tmpfs")
        lines = json_lines(copy, "metrics on a full tmpfs")
        if not 0 < len(lines) < 40 or [r["step"] for r in lines] != list(range(1, len(lines) + 1)):
            fail(f"metrics on a full tmpfs: steps {[r['step'] for r in lines]}")
        print(f"metrics: full tmpfs: warning, exit 0, latest {latest_name(root)}, the file keeps steps 1..{len(lines)} "
              f"as whole lines")
    # A half-written last line from an earlier run is cut before this run appends.
    path = os.path.join(tmp, "half.jsonl")
    root = os.path.join(tmp, "half")
    run(run_args + ["--steps", "3"] + sets(checkpoint__dir=root, logging__metrics_file=path))
    with open(path) as f:
        whole = f.read()
    half = whole.splitlines()[-1][:40]
    with open(path, "w") as f:
        f.write(whole + half)
    proc = run(run_args + ["--steps", "6"] + sets(checkpoint__dir=root, logging__metrics_file=path), expect_ok=False)
    expect(proc, 0, f"ended in a half-written line (an earlier run stopped mid-write): cut the last {len(half)} byte(s)",
           what="metrics with a half line")
    steps = [r["step"] for r in json_lines(path, "metrics with a half line")]
    if steps != [1, 2, 3, 4, 5, 6]:
        fail(f"metrics with a half line: steps {steps} after the resume")
    print(f"metrics: a half line of {len(half)} bytes was cut; after the resume the file reads steps {steps}")

def damage_step(step_dir):
    """Removes the master_weights-* files of a checkpoint (an interrupted copy); returns the phrase naming them."""
    removed = sorted(n for n in os.listdir(step_dir) if n.startswith("master_weights-"))
    if not removed:
        fail(f"{step_dir} holds no master_weights-* file to remove")
    for name in removed:
        os.remove(os.path.join(step_dir, name))
    return f"{removed[0]} is missing" if len(removed) == 1 else f"{len(removed)} files are missing: " + ", ".join(removed)


def tiny_run(trainer, root, *args, **kv):
    return [trainer, "--config", TINY, "--steps", "30"] + list(args) + sets(checkpoint__dir=root, **kv)


def error_lines(proc):
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error:" in ln]


def damaged_only_root(trainer, tmp, name):
    """The issue's setup: steps 10 and 20 with keep_last 1 (so only step-000020 stays), step 20 damaged."""
    root = os.path.join(tmp, name)
    run(tiny_run(trainer, root, "--stop-after", "20", checkpoint__interval=10, checkpoint__keep_last=1))
    if sorted(n for n in os.listdir(root) if n.startswith("step-")) != ["step-000020"]:
        fail(f"setup: expected only step-000020 in {root}: {sorted(os.listdir(root))}")
    return root, damage_step(os.path.join(root, "step-000020"))


def check_resume_refused(trainer, ckpt_tool, tmp):
    root, missing = damaged_only_root(trainer, tmp, "D")
    before = sorted(os.listdir(root))
    metrics = os.path.join(tmp, "refused.jsonl")
    proc = run(tiny_run(trainer, root, "--stop-after", "22", checkpoint__interval=1, checkpoint__keep_last=1,
                        logging__metrics_file=metrics), expect_ok=False)
    out = expect(proc, 1, f"--resume auto: {root} holds step directories, but none is a complete checkpoint that loads:",
                 f"\n  step-000020: {missing}", "restore the missing or damaged files",
                 "--resume PATH", "--overwrite", what="damaged newest, nothing older")
    if "starting from step 0" in out or (os.path.exists(metrics) and loss_by_step(metrics)):
        fail("the refused run started training")
    if len(error_lines(proc)) != 1:
        fail(f"one error line expected, got {error_lines(proc)}")
    if sorted(os.listdir(root)) != before or latest_name(root) != "step-000020":
        fail(f"the directory changed: {sorted(os.listdir(root))}, latest {latest_name(root)}")
    print(f"resume-refused: exit 1: {error_lines(proc)[0][:120]}... ; step-000020 kept, latest = step-000020")


def check_resume_fallback(trainer, ckpt_tool, tmp):
    root = os.path.join(tmp, "fb")
    run(tiny_run(trainer, root, "--stop-after", "20", checkpoint__interval=10))
    missing = damage_step(os.path.join(root, "step-000020"))
    ten = os.path.join(root, "step-000010")
    proc = run(tiny_run(trainer, root, "--stop-after", "13", checkpoint__interval=1, checkpoint__keep_last=1))
    out = expect(proc, 0, f"--resume auto: latest names step-000020, which is incomplete ({missing}",
                 "using step-000010", f"resumed from {ten}",
                 f"checkpoint.keep_last 1: kept step-000020 ({missing}", "latest still names step-000020",
                 what="fallback past a damaged step")
    if out.count("checkpoint.keep_last 1: kept step-000020") != 1:
        fail("the kept damaged step should be warned about once per run")
    steps = sorted(n for n in os.listdir(root) if n.startswith("step-"))
    if steps != ["step-000013", "step-000020"] or latest_name(root) != "step-000020":
        fail(f"retention: expected step-000013 and the damaged step-000020, latest step-000020; got {steps}, "
             f"latest {latest_name(root)}")
    print(f"resume-fallback: warned and resumed from step-000010; kept {steps}, latest = step-000020")
    # The next run falls back to step 13 again; reaching step 20 it moves the damaged one aside, never over it.
    proc = run(tiny_run(trainer, root, "--stop-after", "21", checkpoint__interval=1, checkpoint__keep_last=1))
    expect(proc, 0, "--resume auto: latest names step-000020, which is incomplete", "using step-000013",
           f"resumed from {os.path.join(root, 'step-000013')}",
           "step-000020 of an earlier run (newer than step-000013, where this run started) was moved to "
           f"{os.path.join(root, 'replaced-step-000020-')}", what="the next run")
    entries = sorted(os.listdir(root))
    aside = [n for n in entries if n.startswith("replaced-step-000020-")]
    steps = [n for n in entries if n.startswith("step-")]
    if (len(aside) != 1 or not os.path.exists(os.path.join(root, aside[0], "trainer_state.json")) or
            steps != ["step-000021"] or latest_name(root) != "step-000021"):
        fail(f"after reaching step 20 again: {entries}, latest {latest_name(root)}")
    print(f"resume-fallback: the next run fell back to step-000013 with the warning, kept the damaged step 20 as "
          f"{aside[0]}, ended with {steps}, latest = step-000021")


def check_resume_overwrite(trainer, ckpt_tool, tmp):
    root, _ = damaged_only_root(trainer, tmp, "ow")
    proc = run(tiny_run(trainer, root, "--stop-after", "2", "--overwrite", checkpoint__interval=1))
    expect(proc, 0, "--overwrite: moved 1 checkpoint(s)", "done: steps 1..2", what="--overwrite")
    aside = [n for n in os.listdir(root) if n.startswith("overwritten-")]
    if len(aside) != 1 or not os.path.isdir(os.path.join(root, aside[0], "step-000020")):
        fail(f"the damaged step should have been moved aside: {sorted(os.listdir(root))}")
    print(f"resume-overwrite: exit 0, trained 1..2, step-000020 moved to {aside[0]}/")


def check_resume_ranks(trainer, ckpt_tool, tmp):
    root = os.path.join(tmp, "ranks")
    run(mpirun(2) + tiny_run(trainer, root, "--stop-after", "10", checkpoint__interval=10))
    other = os.path.join(tmp, "rank-view")  # what a rank on another host might see: a copy lacking a file
    shutil.copytree(root, other)
    missing = damage_step(os.path.join(other, "step-000010"))
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    a_file = os.path.join(tmp, "a-file")
    with open(a_file, "w") as f:
        f.write("x")
    host = socket.gethostname()
    before = sorted(os.listdir(root))
    cases = [
        ("1:" + other, "rank 0 on host {h} would resume step-000010",
         f"rank 1 on host {host} sees: step-000010 (incomplete: {missing}"),
        ("1:" + empty, "rank 0 on host {h} would resume step-000010", f"rank 1 on host {host} sees: no step directory"),
        ("1:" + os.path.join(a_file, "sub"), "rank 0 on host {h} would resume step-000010",
         f"rank 1 on host {host} sees: cannot open checkpoint directory {os.path.join(a_file, 'sub')}: Not a directory"),
        ("0:" + empty, "rank 0 on host {h} sees no step directory (it would start from step 0)",
         f"rank 1 on host {host} sees: step-000010 (complete)"),
    ]
    for hook, lead, seen in cases:
        env = dict(os.environ, ST_TEST_RESUME_VIEW_OF=hook)
        try:
            proc = subprocess.run(mpirun(2) + ["-x", "ST_TEST_RESUME_VIEW_OF"] +
                                  tiny_run(trainer, root, "--stop-after", "12", checkpoint__interval=1),
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            fail(f"{hook}: the job hung")
        expect(proc, 1, f"--resume auto: the ranks do not see the same checkpoints in {root}",
               lead.format(h=host), seen, what=f"views differ ({hook})")
        errors = error_lines(proc)
        if len(errors) != 1:
            fail(f"{hook}: one error line expected, got {errors}")
        if sorted(os.listdir(root)) != before or latest_name(root) != "step-000010":
            fail(f"{hook}: the directory changed: {sorted(os.listdir(root))}")
        print(f"resume-ranks: {hook.split(':')[0]} differs -> exit 1: {seen}")
    # --resume ROOT: every rank resolves the root; here rank 1 finds no complete checkpoint in its copy.
    env = dict(os.environ, ST_TEST_RESUME_VIEW_OF="1:" + other)
    try:
        proc = subprocess.run(mpirun(2) + ["-x", "ST_TEST_RESUME_VIEW_OF"] +
                              tiny_run(trainer, root, "--stop-after", "12", "--resume", root),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        fail("--resume ROOT: the job hung")
    expect(proc, 1, f"--resume {root}: the ranks do not resolve it to the same checkpoint:",
           f"rank 0 on host {host}: {os.path.join(root, 'step-000010')}",
           f"rank 1 on host {host}: fails: {other} is a checkpoint root without a complete checkpoint",
           what="--resume ROOT resolved differently")
    if len(error_lines(proc)) != 1:
        fail(f"--resume ROOT: one error line expected, got {error_lines(proc)}")
    print("resume-ranks: --resume ROOT resolved differently by rank 1 -> exit 1 naming both ranks")


# --- memory: the start-up estimate, the refusal and the out-of-memory error ---

MEMORY_LIMIT = 1200 << 20  # RLIMIT_DATA of the memory check's runs (bytes)
BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def run_limited(cmd, env=None):
    """`cmd` in ROOT with its data segment (heap and private mappings) capped at MEMORY_LIMIT."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, preexec_fn=cap,
                          env=dict(os.environ, **(env or {})))


def byte_figure(text):
    number, unit = text.split()
    return float(number) * BYTES[unit]


def memory_line(out, what):
    """(without, with) recomputation: the activation bytes of the start-up memory line."""
    m = re.search(r"memory: activations per micro-batch of (\d+) x 2048 tokens: ([\d.]+ [KMGT]?B) without "
                  r"recomputation, ([\d.]+ [KMGT]?B) with every layer recomputed; a step adds about", out)
    if not m:
        fail(f"{what}: no start-up memory line with and without recomputation:\n{out[-3000:]}")
    return int(m.group(1)), byte_figure(m.group(2)), byte_figure(m.group(3))


def check_memory(trainer, ckpt_tool, tmp):
    base = [trainer, "--config", TINY, "--steps", "1"] + sets(
        train__seq_len=2048, model__max_position_embeddings=2048, train__global_batch_size=128,
        fsdp__activation_checkpointing__mode="none", logging__metrics_file=os.path.join(tmp, "metrics.jsonl"))
    # Too large: refused before step 1, naming the largest micro-batch that fits.
    proc = run_limited(base + sets(train__micro_batch_size=128, checkpoint__dir=os.path.join(tmp, "c1")))
    out = expect(proc, 1, "error: train.micro_batch_size 128 does not fit: a step would add about",
                 "activations of 128 x 2048 tokens:", "B available; ", what="micro-batch 128 under 1200 MiB")
    if "step 1/" in out or len([l for l in out.splitlines() if "error:" in l]) != 1:
        fail(f"micro-batch 128: expected one error line before step 1:\n{out[-3000:]}")
    samples, big_plain, big_recomputed = memory_line(out, "micro-batch 128")
    fits = re.search(r"; train\.micro_batch_size (\d+) fits \(about [\d.]+ [KMGT]?B\)", out)
    if samples != 128 or not fits or not big_recomputed < big_plain:
        fail(f"micro-batch 128: memory line or advice wrong:\n{out[-3000:]}")
    fit = int(fits.group(1))
    recompute = "; or keep it and recompute every layer (fsdp.activation_checkpointing.mode: full)"
    if recompute not in out:
        fail(f"micro-batch 128: recomputation ({big_recomputed} bytes) fits but is not offered:\n{out[-3000:]}")
    print(f"memory: micro-batch 128 refused before step 1; activations {big_plain / 1e6:.1f} MB, "
          f"{big_recomputed / 1e6:.1f} MB recomputed; advice: micro-batch {fit}, or recompute")
    # The second way out works too: micro-batch 128 with every layer recomputed trains under the limit.
    proc = run_limited(base + sets(train__micro_batch_size=128, fsdp__activation_checkpointing__mode="full",
                                      checkpoint__dir=os.path.join(tmp, "c2")))
    expect(proc, 0, "step 1/1", "(2 of 2 layers recomputed)", what="micro-batch 128 recomputed")
    # The advice works: that micro-batch trains under the same limit.
    proc = run_limited(base + sets(train__micro_batch_size=fit, checkpoint__dir=os.path.join(tmp, "c3")))
    out = expect(proc, 0, "step 1/1", what=f"advised micro-batch {fit}")
    samples, plain, recomputed = memory_line(out, f"micro-batch {fit}")
    # Activations grow with the micro-batch: the two lines' figures are in the ratio of the micro-batches.
    for small, big in ((plain, big_plain), (recomputed, big_recomputed)):
        if abs(big / small - 128 / fit) > 0.01 * 128 / fit:
            fail(f"activations {small} at micro-batch {fit} vs {big} at 128: not proportional")
    peak = metrics_rows(os.path.join(tmp, "metrics.jsonl"))[-1]["peak_bytes"]
    if not 0 < peak < MEMORY_LIMIT:
        fail(f"micro-batch {fit}: peak {peak} bytes, limit {MEMORY_LIMIT}")
    print(f"memory: micro-batch {fit} trains under the limit (peak {peak / 1e6:.1f} MB, "
          f"activations {plain / 1e6:.1f} MB estimated)")
    # Past the refusal (test hook): the allocation failure says where and what to lower.
    proc = run_limited(base + sets(train__micro_batch_size=128, checkpoint__dir=os.path.join(tmp, "c4")),
                       env={"ST_TEST_SKIP_MEMORY_CHECK": "1"})
    out = expect(proc, 1, "error: out of host memory allocating",
                 "in step 1 (forward and backward of micro-batch 1), with a step estimated at",
                 "lower train.micro_batch_size (now 128) or train.seq_len (now 2048)", what="out of memory in step 1")
    print("memory: without the refusal, micro-batch 128 fails in step 1 naming the phase and what to lower")


HANG_GUARD_S = 120  # a hang guard only: every run below ends in seconds


def run_guarded(cmd, what, env=None):
    """Runs `cmd` in ROOT; fails the check if it does not end within HANG_GUARD_S (it hung)."""
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S,
                              env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        fail(f"{what}: the run hung (no end within {HANG_GUARD_S} s)")


def expect_one_error(proc, texts, what):
    """Exit 1, every text in the output, exactly one error line, and no step trained."""
    out = expect(proc, 1, *texts, what=what)
    errors = [ln for ln in out.splitlines() if "error:" in ln]
    if len(errors) != 1 or "step 1/" in out:
        fail(f"{what}: expected one error line before step 1, got {errors}")
    return errors[0]


def check_fifos(trainer, ckpt_tool, tmp):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog.\n" * 200)
    not_regular = f"'{fifo}' is not a regular file (a FIFO)"
    cases = [("logging.metrics_file", sets(logging__metrics_file=fifo), "logging.metrics_file " + not_regular),
             ("data.path (text)", sets(data__kind="text", data__path=fifo), "data.path text file " + not_regular),
             ("data.path (tokens)", sets(data__kind="tokens", data__path=fifo),
              "data.path tokens file " + not_regular),
             ("data.val_path", sets(data__kind="text", data__path=text, data__val_path=fifo, eval__interval=1),
              "data.val_path text file " + not_regular),
             ("data.tokenizer", sets(data__kind="text", data__path=text, data__tokenizer=fifo),
              "tokenizer " + not_regular)]
    for key, args, message in cases:
        proc = run_guarded([trainer, "--config", TINY, "--steps", "1"] + args, f"a FIFO as {key}")
        line = expect_one_error(proc, [message], f"a FIFO as {key}")
        print(f"fifos: {key}: exit 1 at once: {line}")


def check_limits(trainer, ckpt_tool, tmp):
    check_absurd_values(trainer, tmp)
    check_state_memory(trainer, tmp)
    check_paths(trainer, tmp)
    check_binary_text(trainer, tmp)
    check_shard_group_once(trainer, tmp)


def check_absurd_values(trainer, tmp):
    cases = [("train.global_batch_size=9223372036854775807",
              "invalid value 9223372036854775807 for 'train.global_batch_size': expected a positive integer <= "
              "1048576 (larger is not a real run)"),
             ("model.num_hidden_layers=100000000",
              "invalid value 100000000 for 'model.num_hidden_layers': expected a positive integer <= 65536")]
    for assignment, message in cases:
        proc = run_guarded([trainer, "--config", TINY, "--set", assignment], assignment)
        print(f"limits: {assignment}: {expect_one_error(proc, [message], assignment)}")
    proc = run_guarded([trainer, "--config", TOY, "--steps", "1"] + sets(train__global_batch_size=8192),
                       "a global batch larger than the data")
    line = expect_one_error(proc, ["train.global_batch_size 8192 is larger than the training data, 4096 samples",
                                   "lower train.global_batch_size to at most 4096"], "global batch 8192 of 4096")
    print(f"limits: global batch larger than the data: {line[:160]}")


def run_data_limited(cmd, limit, what):
    """`cmd` with RLIMIT_DATA (heap and private mappings) capped at `limit` bytes, under the hang guard."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, preexec_fn=cap, timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        fail(f"{what}: no end within {HANG_GUARD_S} s")


def check_state_memory(trainer, tmp):
    # configs/llama.yaml (about a billion parameters) on the CPU under 6 GiB: refused before the model exists.
    parts = ["error: the run does not fit in memory: before its first step a rank would hold about",
             "master weights", "gradients", "optimizer state", "(adamw)", "what would fit: FULL_SHARD over"]
    proc = run_data_limited([trainer, "--config", "configs/llama.yaml", "--steps", "1"] +
                            sets(train__device="cpu", checkpoint__dir=os.path.join(tmp, "big")), 6 << 30,
                            "llama.yaml under 6 GiB")
    line = expect_one_error(proc, parts + ["model.num_hidden_layers"], "llama.yaml on the CPU under 6 GiB")
    if "model llama:" in proc.stdout + proc.stderr:
        fail("llama.yaml under 6 GiB: refused only after the model was built")
    print(f"limits: llama.yaml under 6 GiB: refused before the model was built: {line[:400]}")
    # 20000 layers of llama-tiny under 1200 MiB: refused, naming a layer count that does train there.
    tiny = [trainer, "--config", TINY, "--steps", "1"]
    proc = run_data_limited(tiny + sets(model__num_hidden_layers=20000), 1200 << 20, "20000 layers")
    line = expect_one_error(proc, parts[:5], "llama-tiny with 20000 layers under 1200 MiB")
    m = re.search(r"model\.num_hidden_layers (\d+) \(now 20000\)", line)
    if not m or not 0 < int(m.group(1)) < 20000 or "model llama:" in proc.stdout + proc.stderr:
        fail(f"20000 layers: no layer count that fits, or refused after the model was built: {line}")
    layers = int(m.group(1))
    proc = run_data_limited(tiny + sets(model__num_hidden_layers=layers), 1200 << 20, f"{layers} layers")
    expect(proc, 0, "step 1/1", what=f"the advised {layers} layers under the same limit")
    print(f"limits: 20000 layers refused before the model was built; the advised {layers} layers train there")


def check_paths(trainer, tmp):
    # A YAML null where a path is expected: "~" is not the home directory, and it no longer means "none".
    proc = run_guarded([trainer, "--config", TOY, "--steps", "1", "--set", "checkpoint.dir=~"], "checkpoint.dir=~")
    line = expect_one_error(proc, ["bad value for 'checkpoint.dir' in --set: got an empty value, expected a string",
                                   "~ is not the home directory here"], "checkpoint.dir=~")
    print(f"limits: checkpoint.dir=~: {line[:200]}")
    config = os.path.join(tmp, "null-path.yaml")
    with open(config, "w") as f:
        f.write("model:\n  name: toy\ntrain:\n  steps: 1\nlogging:\n  metrics_file: null\n")
    proc = run_guarded([trainer, "--config", config], "metrics_file: null")
    expect_one_error(proc, [f"bad value for 'logging.metrics_file' at {config}:6: got an empty value"],
                     "metrics_file: null in a file")
    # "--set checkpoint.dir=" is still the empty string: no checkpoints, exit 0.
    proc = run_guarded([trainer, "--config", TOY, "--steps", "1", "--set", "checkpoint.dir="], "checkpoint.dir=")
    expect(proc, 0, "step 1/1", what="checkpoint.dir= (empty)")
    # logging.metrics_file in directories that do not exist yet: created, as checkpoint.dir is.
    metrics = os.path.join(tmp, "new", "deeper", "m.jsonl")
    proc = run_guarded([trainer, "--config", TOY, "--steps", "2"] + sets(logging__metrics_file=metrics),
                       "metrics file in a new directory")
    expect(proc, 0, "step 2/2", what="metrics file in a new directory")
    if [r["step"] for r in metrics_rows(metrics)] != [1, 2]:
        fail(f"{metrics}: steps {[r['step'] for r in metrics_rows(metrics)]}")
    print("limits: logging.metrics_file in new/deeper/: directories created, steps 1..2 logged")


def check_binary_text(trainer, tmp):
    path = os.path.join(tmp, "binary.dat")
    with open(path, "wb") as f:
        f.write(b"text first, then " + bytes(range(256)) * 64)
    proc = run_guarded([trainer, "--config", TINY, "--steps", "1"] + sets(data__kind="text", data__path=path),
                       "data.kind text on a binary file")
    line = expect_one_error(proc, [f"text file '{path}' (data.path) is not UTF-8 text: a NUL byte at offset 17",
                                   "prepare refuses the same file"], "data.kind text on a binary file")
    print(f"limits: data.kind text on a binary file: {line[:200]}")


def check_shard_group_once(trainer, tmp):
    launch = os.path.join(ROOT, "scripts", "launch")
    proc = run_guarded([launch, "-np", "3", trainer, "--config", TOY, "--steps", "1"] +
                       sets(fsdp__sharding_strategy="HYBRID_SHARD", fsdp__shard_group_size=2), "shard group 2 of 3")
    message = "fsdp.shard_group_size (2) must divide the world size (3)"
    out = expect(proc, 1, message, what="shard group 2 of 3 ranks")
    if out.count(message) != 1:
        fail(f"shard group 2 of 3 ranks: the error is printed {out.count(message)} times, expected once")
    print(f"limits: fsdp.shard_group_size 2 at 3 ranks: printed once, exit 1")


def main():
    check_main({"nonfinite": check_nonfinite, "ckpt-dir": check_ckpt_dir, "lock": check_lock, "strict": check_strict,
                "inputs": check_inputs, "resume-refused": check_resume_refused, "resume-fallback": check_resume_fallback,
                "resume-overwrite": check_resume_overwrite, "resume-ranks": check_resume_ranks,
                "metrics": check_metrics, "memory": check_memory, "fifos": check_fifos, "limits": check_limits},
               programs=2)


if __name__ == "__main__":
    main()
