#!/usr/bin/env python3
"""End-to-end checks of the trainer's checkpoints (standard library only).

    check_checkpoints.py TRAINER CHECK

CHECK is one of:
  resume      llama-tiny at 4 ranks: 20 steps uninterrupted vs 10 steps, --stop-after
              with a checkpoint, new processes, --resume auto, 10 more: bit-identical
              losses, for both layouts (unified, sharded), sync and async saves
  async       llama-tiny at 2 ranks, 12 steps, saving every step with checkpoint.async,
              so each save's writer thread runs beside the next step (the check
              ThreadSanitizer runs: scripts/sanitize.sh thread), stopped after 6 and
              resumed: latest is step 6, keep_last 2 left steps 5 and 6 only, and
              steps 7..12 are bit-identical to an uninterrupted run
  elastic     F32 llama-tiny saved at 4 ranks (FULL_SHARD, per-layer units), resumed at
              1, 2, 3 and 4 ranks with other strategies and wrap policies, from both
              layouts: losses within ELASTIC_BOUND relative of the uninterrupted run
  toy         the tutorial case: the toy model saved at 4 ranks, loaded in one process
  options     skip_save_model_weight, F32 model weights standing in for master weights,
              and master_weight_compatible (master weights derived from BF16 model weights)
  init-from   checkpoint.init_from a model-only directory: the weights arrive exactly,
              the optimizer and the step start fresh; a checkpoint in checkpoint.dir wins
  crash       a 2-rank run saving every step is SIGKILLed at each of CRASH_POINTS, named
              phases of step 3's save (sync and async) where the process stopped
              itself (ST_TEST_PAUSE_AT, core/test_hook.h: no timing); after each,
              `latest` names the complete step 2 (step 3 once latest moved), --resume
              auto loads that step and removes the killed save's debris
  corruption  a flipped byte, a missing file, a tensor missing from an index and a shape
              that disagrees with the model config each fail with a clear error that names
              the file or tensor, exit non-zero and leave the checkpoints as they were;
              --resume auto falls back past a latest checkpoint that fails its checksum
  sigterm     SIGTERM to one rank stops every rank after the current step with a
              checkpoint and exit 0; resuming from it continues bit-identically
  compat      checkpoints written by an earlier version (tests/fixtures/ckpt-v1-*, both
              layouts, step 2 of a 4-step run of a 1-layer LLaMA) still load at 1 and 2
              ranks: steps 3-4 within COMPAT_BOUND of an uninterrupted run today (not
              bit-identical: kernels may round differently since), and `ckpt verify` passes,
              noting the files its marker gives no checksum for
  load-paths  (issue 36) every way into a checkpoint applies the same check: a same-size edit
              of trainer_state.json (consumed_samples), and a COMPLETE marker that is
              edited, empty, a FIFO or a directory, are each refused by --resume PATH,
              checkpoint.init_from, generate --checkpoint, ckpt convert and ckpt verify
              (exit 1, the file named, nothing trained), and skipped with a warning by
              --resume auto, which resumes the step before; a flipped data byte prints
              its CRC32Cs in hex (0x...)
  header      (issue 36) two shapes of a master-weights header swapped (same size):
              ckpt verify fails naming the header's checksum; --resume auto warns and
              resumes the intact step before, never "does not fit this run"
  latest-missing (issue 36) `latest` names step-000030 but the step directory was
              renamed step-30: --resume auto exits 1 before step 1 naming it; nothing
              trained, `latest` unchanged
  latest-full (issue 36) writing .latest.tmp fails with ENOSPC (it is a link to
              /dev/full) after step 10 was renamed into place: exit 1 saying step 10
              is complete and committed and `latest` still names step-000005
  data-change (issue 36) --resume with another train.seed and data.token_dtype warns
              naming both keys with old and new values; an unchanged run does not
Each check prints what it measured; a failure exits 1.
"""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    ROOT, check_main, crc32c, expect, fail, loss_by_step, mpirun, resum_marker, run, sets)

TINY = "configs/llama-tiny.yaml"
# Elastic restarts change the reduction order (other world sizes, shard
# layouts), so losses agree to rounding, not bit for bit; F32 rounding over
# 10 steps stays orders of magnitude below this.
ELASTIC_BOUND = 1e-5


def train(trainer, np, tmp, name, extra, config=TINY, steps=20, expect_ok=True):
    metrics = os.path.join(tmp, name + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    proc = run(mpirun(np) + [trainer, "--config", config, "--steps", str(steps), "--set",
                             f"logging.metrics_file={metrics}", "--set", "logging.interval=1"] + extra, expect_ok)
    losses = loss_by_step(metrics) if os.path.exists(metrics) else {}
    return losses, proc


def latest_of(root):
    with open(os.path.join(root, "latest")) as f:
        return os.path.join(root, f.read().strip())


def max_rel(a, b, steps):
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, parsed here from the format."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def read_family(directory, index_name):
    with open(os.path.join(directory, index_name)) as f:
        weight_map = json.load(f)["weight_map"]
    files = {}
    out = {}
    for key, file in weight_map.items():
        if file not in files:
            files[file] = read_safetensors(os.path.join(directory, file))
        out[key] = files[file][key]
    return out


def check_resume(trainer, tmp):
    full, _ = train(trainer, 4, tmp, "full", [])
    for layout in ("unified", "sharded"):
        for mode in ("false", "true"):
            ckpt = os.path.join(tmp, f"ckpt-{layout}-{mode}")
            opts = sets(checkpoint__dir=ckpt, checkpoint__format=layout, checkpoint__async=mode)
            first, proc = train(trainer, 4, tmp, "first", opts + ["--stop-after", "10"])
            if sorted(first) != list(range(1, 11)) or "stopped after step 10 of 20" not in proc.stderr:
                fail(f"{layout}/async={mode}: --stop-after 10 did not stop after step 10")
            if latest_of(ckpt) != os.path.join(ckpt, "step-000010"):
                fail(f"{layout}/async={mode}: latest does not name step-000010")
            second, proc = train(trainer, 4, tmp, "second", opts + ["--resume", "auto"])
            if sorted(second) != list(range(11, 21)) or f"{layout} layout" not in proc.stderr:
                fail(f"{layout}/async={mode}: --resume auto did not continue at step 11 from a {layout} checkpoint")
            both = {**first, **second}
            same = all(full[s] == both[s] for s in range(1, 21))
            print(f"resume {layout:8} async={mode:5}: steps 11..20 after a restart at 4 ranks, bit-identical: {same}")
            if not same:
                fail("resumed losses differ from the uninterrupted run")


def check_async(trainer, tmp):
    full, _ = train(trainer, 2, tmp, "full", [], steps=12)
    ckpt = os.path.join(tmp, "ckpt")
    opts = sets(checkpoint__dir=ckpt, checkpoint__interval=1, checkpoint__keep_last=2, checkpoint__async="true")
    first, _ = train(trainer, 2, tmp, "first", opts + ["--stop-after", "6"], steps=12)
    if sorted(first) != list(range(1, 7)) or latest_of(ckpt) != os.path.join(ckpt, "step-000006"):
        fail("async saves every step: --stop-after 6 did not stop after step 6 with latest naming step-000006")
    steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))
    if steps != ["step-000005", "step-000006"]:
        fail(f"async saves every step with keep_last 2 left {steps}, expected step-000005 and step-000006")
    second, _ = train(trainer, 2, tmp, "second", opts + ["--resume", "auto"], steps=12)
    both = {**first, **second}
    same = sorted(second) == list(range(7, 13)) and all(full[s] == both[s] for s in range(1, 13))
    print(f"async: saved every step in the background, stopped after 6, resumed: steps 7..12 bit-identical: {same}")
    if not same:
        fail("after async saves every step, the resumed losses differ from the uninterrupted run")


def check_elastic(trainer, tmp):
    f32 = sets(fsdp__mixed_precision__param_dtype="f32")
    full, _ = train(trainer, 4, tmp, "full", f32)
    resumes = [
        (1, "NO_SHARD", "none", []),
        (2, "SHARD_GRAD_OP", "transformer", []),
        (3, "FULL_SHARD", "size_based", sets(fsdp__auto_wrap__min_num_params=20000)),
        (4, "HYBRID_SHARD", "transformer", sets(fsdp__shard_group_size=2)),
    ]
    for layout in ("unified", "sharded"):
        ckpt = os.path.join(tmp, f"ckpt-{layout}")
        train(trainer, 4, tmp, "first", f32 + sets(checkpoint__dir=ckpt, checkpoint__format=layout) +
              ["--stop-after", "10"])
        step10 = os.path.join(ckpt, "step-000010")
        for np, strategy, policy, extra in resumes:
            resumed, _ = train(trainer, np, tmp, f"np{np}", f32 + extra + sets(
                fsdp__sharding_strategy=strategy, fsdp__auto_wrap__policy=policy) + ["--resume", step10])
            if sorted(resumed) != list(range(11, 21)):
                fail(f"elastic resume at {np} rank(s) did not run steps 11..20")
            worst = max_rel(resumed, full, range(11, 21))
            print(f"elastic: {layout} saved at 4 ranks FULL_SHARD, resumed at {np} rank(s) {strategy}/{policy}: "
                  f"max relative loss difference {worst:.2e} over steps 11..20")
            if worst > ELASTIC_BOUND:
                fail(f"elastic resume at {np} rank(s) drifted past {ELASTIC_BOUND}")


def check_toy(trainer, tmp):
    toy = "configs/toy.yaml"
    full, _ = train(trainer, 4, tmp, "full", [], config=toy)
    for layout in ("unified", "sharded"):
        ckpt = os.path.join(tmp, f"toy-{layout}")
        train(trainer, 4, tmp, "first", sets(checkpoint__dir=ckpt, checkpoint__format=layout) + ["--stop-after", "10"],
              config=toy)
        resumed, proc = train(trainer, 1, tmp, "one", sets(checkpoint__dir=ckpt, checkpoint__format=layout) +
                              ["--resume", "auto"], config=toy)
        if sorted(resumed) != list(range(11, 21)) or "saved by 4 rank(s)" not in proc.stderr:
            fail(f"toy {layout}: the 4-rank checkpoint was not resumed in one process")
        worst = max_rel(resumed, full, range(11, 21))
        print(f"toy: {layout} saved at 4 ranks, loaded in one process: max relative loss difference {worst:.2e}")
        if worst > ELASTIC_BOUND:
            fail("toy elastic resume drifted")


def check_options(trainer, tmp):
    full, _ = train(trainer, 4, tmp, "full", [])

    # skip_save_model_weight: only master weights (and optimizer state) on disk; resume is exact.
    ckpt = os.path.join(tmp, "skip")
    opts = sets(checkpoint__dir=ckpt) + ["--set", "checkpoint.unified_checkpoint_config=[skip_save_model_weight]"]
    first, _ = train(trainer, 4, tmp, "first", opts + ["--stop-after", "10"])
    names = os.listdir(latest_of(ckpt))
    if any(n.startswith("model-") for n in names) or "master_weights.safetensors.index.json" not in names:
        fail(f"skip_save_model_weight: unexpected files {sorted(names)}")
    second, _ = train(trainer, 4, tmp, "second", opts + ["--resume", "auto"])
    same = all(full[s] == {**first, **second}[s] for s in range(1, 21))
    print(f"options: skip_save_model_weight: no model-* files, resume bit-identical: {same}")
    if not same:
        fail("skip_save_model_weight resume differs")

    # F32 training: the model weights are the master weights, stored once.
    f32 = sets(fsdp__mixed_precision__param_dtype="f32")
    full32, _ = train(trainer, 4, tmp, "full32", f32)
    ckpt = os.path.join(tmp, "f32")
    first, _ = train(trainer, 4, tmp, "first", f32 + sets(checkpoint__dir=ckpt) + ["--stop-after", "10"])
    names = os.listdir(latest_of(ckpt))
    if any(n.startswith("master_weights") for n in names):
        fail("F32 training wrote master_weights files beside identical model weights")
    second, _ = train(trainer, 4, tmp, "second", f32 + sets(checkpoint__dir=ckpt) + ["--resume", "auto"])
    same = all(full32[s] == {**first, **second}[s] for s in range(1, 21))
    print(f"options: F32 model weights stand in for master weights: resume bit-identical: {same}")
    if not same:
        fail("F32 resume from model weights differs")

    # master_weight_compatible: a BF16 checkpoint without master weights.
    ckpt = os.path.join(tmp, "compat")
    train(trainer, 4, tmp, "first", sets(checkpoint__dir=ckpt) + ["--stop-after", "10"])
    step10 = latest_of(ckpt)
    dropped = [n for n in os.listdir(step10) if n.startswith("master_weights")]
    for n in dropped:
        os.remove(os.path.join(step10, n))
    drop_from_marker(step10, dropped)  # as a save that never wrote them would have
    _, proc = train(trainer, 4, tmp, "refused", ["--resume", step10], expect_ok=False)
    if proc.returncode == 0 or "master_weight_compatible" not in proc.stderr:
        fail("resuming BF16 model weights without master weights did not ask for master_weight_compatible")
    compat, _ = train(trainer, 4, tmp, "compat", ["--resume", step10, "--set",
                                                  "checkpoint.unified_checkpoint_config=[master_weight_compatible]"])
    worst = max_rel(compat, full, range(11, 21))
    # Master weights rounded to BF16 (relative error <= 2^-9) move the loss by far less than 1%.
    print(f"options: master_weight_compatible from BF16 model weights: max relative loss difference {worst:.2e}")
    if sorted(compat) != list(range(11, 21)) or not 0 < worst < 1e-2:
        fail("master_weight_compatible resume is not close to the uninterrupted run")


def drop_from_marker(step_dir, names):
    """Rewrites step_dir's COMPLETE marker without the lines of `names` (and with its own new CRC32C)."""
    path = os.path.join(step_dir, "COMPLETE")
    with open(path) as f:
        lines = f.read().splitlines()[:-1]  # without its crc32c line
    body = "".join(line + "\n" for line in lines if line.rsplit(" ", 1)[-1] not in names)
    with open(path, "w") as f:
        f.write(body + f"crc32c {crc32c(body.encode()):08x}\n")


def check_init_from(trainer, tmp):
    f32 = sets(fsdp__mixed_precision__param_dtype="f32")
    src = os.path.join(tmp, "src")
    train(trainer, 2, tmp, "src", f32 + sets(checkpoint__dir=src) + ["--stop-after", "10"])
    # A Hugging Face style model directory: model weights, their index and config.json only.
    model_dir = os.path.join(tmp, "hf-model")
    os.mkdir(model_dir)
    for n in os.listdir(latest_of(src)):
        if n.startswith("model") or n == "config.json":
            shutil.copy(os.path.join(latest_of(src), n), model_dir)
    out = os.path.join(tmp, "out")
    # An AdamW step of lr 1e-30 without weight decay moves no weight (the update is
    # some 20 orders of magnitude below half an F32 ulp), so after one step the saved
    # weights must equal the source's exactly.
    frozen = sets(optim__lr="1e-30", optim__weight_decay=0, optim__schedule__min_lr=0,
                  optim__schedule__warmup_steps=0)
    init, proc = train(trainer, 3, tmp, "init", f32 + frozen + sets(checkpoint__init_from=model_dir,
                                                                    checkpoint__dir=out), steps=1)
    if "initialised the weights from" not in proc.stderr:
        fail("init_from was not reported")
    want = read_family(model_dir, "model.safetensors.index.json")
    got = read_family(latest_of(out), "model.safetensors.index.json")
    same = want.keys() == got.keys() and all(want[k] == got[k] for k in want)
    with open(os.path.join(latest_of(out), "trainer_state.json")) as f:
        state = json.load(f)
    print(f"init-from: {len(want)} tensors from a model-only directory, byte-identical after a step at lr 1e-30: {same}; "
          f"step {state['step']}, optimizer steps {state['optimizer_steps']}")
    if not same or state["step"] != 1 or state["optimizer_steps"] != 1:
        fail("init_from did not load the weights exactly or did not start a fresh optimizer")
    # init_from a whole checkpoint (master weights there) starts from the same weights.
    whole, _ = train(trainer, 1, tmp, "whole", f32 + frozen + sets(checkpoint__init_from=latest_of(src)), steps=1)
    print(f"init-from: step-1 loss from the model-only directory {init[1]!r}, from the whole checkpoint {whole[1]!r}")
    if init[1] != whole[1]:
        fail("init_from a model-only directory and from the checkpoint give different first losses")
    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    if hf.get("model_type") != "llama" or hf.get("architectures") != ["LlamaForCausalLM"]:
        fail(f"config.json is not a LlamaConfig: {hf}")
    # A checkpoint in checkpoint.dir wins over init_from.
    _, proc = train(trainer, 2, tmp, "again", f32 + sets(checkpoint__init_from=model_dir, checkpoint__dir=src) +
                    ["--resume", "auto", "--stop-after", "11"])
    if "resumed from" not in proc.stderr or "initialised" in proc.stderr:
        fail("--resume auto with a checkpoint present still used init_from")
    # A directory that is not a checkpoint is named.
    _, proc = train(trainer, 1, tmp, "bad", sets(checkpoint__init_from=tmp), expect_ok=False)
    if proc.returncode == 0 or f"'{tmp}' is not a checkpoint" not in proc.stderr:
        fail("init_from a directory without weights did not fail clearly")


def complete(step_dir):
    """Mirrors checkpoint/commit.h: a COMPLETE marker whose listed files exist with their sizes."""
    try:
        with open(os.path.join(step_dir, "COMPLETE")) as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        kind = line.split(" ", 1)[0]
        if kind in ("file", "head", "sum"):  # "file SIZE NAME", "head|sum SIZE CRC NAME"
            fields = line.split(" ", 2 if kind == "file" else 3)
            size, name = fields[1], fields[-1]
            p = os.path.join(step_dir, name)
            if not os.path.exists(p) or os.path.getsize(p) != int(size):
                return False
    return True


# Where check_crash kills the job: the save's own phases (core/test_hook.h),
# each reached in step CRASH_STEP, with synchronous and async saves. The
# temporary directory exists from temp_created to renamed; latest moves at
# latest_renamed.
CRASH_POINTS = [("temp_created", "false"), ("files_written", "false"), ("files_written", "true"),
                ("marker_written", "true"), ("temp_dir_synced", "false"), ("renamed", "false"),
                ("latest_tmp_written", "true"), ("latest_renamed", "false")]
CRASH_STEP = 3


def kill_at(cmd, point, step, root):
    """Runs `cmd` with the test hook set to stop the job at `point` of `step`;
    once a process says it stopped there, SIGKILLs every process of the job."""
    env = dict(os.environ, ST_TEST_PAUSE_AT=f"{point}@{step}")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    seen = []
    for line in proc.stderr:  # a hang here is caught by CTest's timeout
        seen.append(line)
        if line.startswith(f"test hook: paused at {point} of step {step}"):
            break
    else:
        proc.wait()
        fail(f"{point}@{step}: the job ended (exit {proc.returncode}) without reaching the point: "
             f"{''.join(seen[-20:])}")
    subprocess.run(["pkill", "-KILL", "-f", root])
    proc.stderr.close()
    proc.wait()


def check_crash(trainer, tmp):
    mid_save = 0
    for i, (point, async_save) in enumerate(CRASH_POINTS):
        root = os.path.join(tmp, f"crash-{i}")
        cmd = mpirun(2) + [trainer, "--config", TINY, "--steps", "100000", "--resume", "auto"] + sets(
            checkpoint__dir=root, checkpoint__interval=1, checkpoint__keep_last=3, checkpoint__async=async_save,
            logging__interval=1000)
        kill_at(cmd, point, CRASH_STEP, root)
        tmp_left = any(n.startswith(".tmp-step") for n in os.listdir(root))
        mid_save += tmp_left
        latest = latest_of(root)
        want_latest = CRASH_STEP if point == "latest_renamed" else CRASH_STEP - 1
        if os.path.basename(latest) != f"step-{want_latest:06d}" or not complete(latest):
            fail(f"{point}: latest names {os.path.basename(latest)} (complete: {complete(latest)}), "
                 f"expected a complete step-{want_latest:06d}")
        # Between the rename and latest's move, step 3 is complete but latest names step 2: the
        # resume takes the one `latest` names (a commit is the move of latest).
        check = run(mpirun(1) + [trainer, "--config", TINY, "--resume", "auto"] +
                    sets(checkpoint__dir=root, train__steps=want_latest + 1), expect_ok=False)
        if check.returncode != 0 or f"resumed from {latest}" not in check.stderr:
            sys.stderr.write(check.stderr)
            fail(f"{point}: --resume auto did not load {latest}")
        newest = latest
        if any(n.startswith(".tmp-step") for n in os.listdir(root)):
            fail(f"{point}: the resumed run left the killed save's temporary directory behind")
        print(f"crash at {point} of step {CRASH_STEP} (async {async_save}): latest = {os.path.basename(latest)}, "
              f"complete; temporary directory left: {tmp_left}; --resume auto loaded {os.path.basename(newest)} "
              f"and cleaned up")
    print(f"crash: {len(CRASH_POINTS)} SIGKILLs at named save phases, {mid_save} inside a save's temporary directory; "
          f"latest always complete and loaded")
    if mid_save < 4:
        fail(f"only {mid_save} kills left a temporary directory; the first five points are inside one")


def expect_failure(trainer, tmp, name, extra, needles, ckpt):
    before = sorted(os.listdir(ckpt))
    _, proc = train(trainer, 2, tmp, name, extra, expect_ok=False)
    message = [line for line in proc.stderr.splitlines() if "error" in line]
    if proc.returncode == 0 or not all(any(n in line for line in message) for n in needles):
        sys.stderr.write(proc.stderr[-3000:])
        fail(f"{name}: expected a non-zero exit and an error naming {needles}")
    if sorted(os.listdir(ckpt)) != before:
        fail(f"{name}: the checkpoint directory changed")
    print(f"corruption: {name}: exit {proc.returncode}: {message[0].strip()[:200]}")


def flip_byte(path, key):
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        at = 8 + n + header[key]["data_offsets"][0] + 3
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def check_corruption(trainer, tmp):
    ckpt = os.path.join(tmp, "good")
    opts = sets(checkpoint__dir=ckpt)
    train(trainer, 2, tmp, "save", opts + ["--stop-after", "5"])
    train(trainer, 2, tmp, "save", opts + ["--resume", "auto", "--stop-after", "10"])
    step10 = os.path.join(ckpt, "step-000010")

    def variant(name):
        d = os.path.join(tmp, "variants", name)
        shutil.copytree(step10, d)
        return d

    with open(os.path.join(step10, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    key = "model.layers.1.mlp.up_proj.weight"
    d = variant("flipped")
    flip_byte(os.path.join(d, weight_map[key]), key)
    expect_failure(trainer, tmp, "flipped-byte", ["--resume", d],
                   [f"checksum mismatch in '{os.path.join(d, weight_map[key])}', tensor '{key}'"], ckpt)

    d = variant("missing-file")
    with open(os.path.join(d, "optimizer.safetensors.index.json")) as f:
        gone = sorted(set(json.load(f)["weight_map"].values()))[0]
    os.remove(os.path.join(d, gone))
    expect_failure(trainer, tmp, "missing-file", ["--resume", d], [f"checkpoint {d} is damaged or incomplete: {gone} "
                                                                   "is missing"], ckpt)

    d = variant("missing-tensor")
    path = os.path.join(d, "optimizer.safetensors.index.json")
    with open(path) as f:
        index = json.load(f)
    del index["weight_map"]["model.norm.weight.exp_avg"]
    with open(path, "w") as f:
        json.dump(index, f)
    # Edited as a buggy save would leave it, the marker vouching for it: the fit check must still name the tensor.
    resum_marker(d, "optimizer.safetensors.index.json")
    expect_failure(trainer, tmp, "tensor-missing-from-index", ["--resume", d],
                   ["1 tensor(s) the run needs are missing from it: model.norm.weight (exp_avg)"], ckpt)

    # Caught from config.json before any tensor is read; without that check
    # (checkpoint.strict: false) the loader still names the tensor whose shape differs.
    expect_failure(trainer, tmp, "shape-mismatch", ["--resume", step10] + sets(model__intermediate_size=96),
                   ["does not fit this run", "intermediate_size 172 (model.intermediate_size 96)"], ckpt)
    expect_failure(trainer, tmp, "shape-mismatch-nonstrict",
                   ["--resume", step10] + sets(model__intermediate_size=96, checkpoint__strict="false"),
                   ["6 tensor(s) have another shape: model.layers.0.mlp.down_proj.weight ([64, 172] in the checkpoint, "
                    "[64, 96] in the model)", "to resume, use the checkpoint's model.* settings"], ckpt)

    # --resume auto: latest fails its checksum, the previous checkpoint loads instead.
    key = "model.layers.0.self_attn.q_proj.weight"
    with open(os.path.join(step10, "master_weights.safetensors.index.json")) as f:
        master_file = json.load(f)["weight_map"][key]
    flip_byte(os.path.join(step10, master_file), key)
    resumed, proc = train(trainer, 2, tmp, "fallback", opts + ["--resume", "auto", "--stop-after", "7"])
    fell_back = "does not load" in proc.stderr and f"resumed from {os.path.join(ckpt, 'step-000005')}" in proc.stderr
    print(f"corruption: --resume auto with a flipped byte in latest: reported and fell back to step-000005: "
          f"{fell_back}; continued at steps {sorted(resumed)}")
    if not fell_back or sorted(resumed) != [6, 7]:
        fail("--resume auto did not fall back past a checkpoint that fails its checksum")


def check_sigterm(trainer, tmp):
    ckpt = os.path.join(tmp, "term")
    metrics = os.path.join(tmp, "term.jsonl")
    cmd = mpirun(2) + [trainer, "--config", TINY, "--steps", "100000"] + sets(
        checkpoint__dir=ckpt, logging__metrics_file=metrics, logging__interval=1)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and (not os.path.exists(metrics) or len(open(metrics).readlines()) < 5):
        time.sleep(0.1)
    # One rank gets the signal, as when a scheduler preempts one node first.
    subprocess.run(["pkill", "-TERM", "-n", "-f", f"trainer --config {TINY} --steps 100000"])
    _, err = proc.communicate(timeout=120)
    stopped = loss_by_step(metrics)
    k = max(stopped)
    ok = proc.returncode == 0 and f"stopped after step {k} of 100000 (SIGTERM)" in err
    print(f"sigterm: exit {proc.returncode}, stopped after step {k}, latest = {os.path.basename(latest_of(ckpt))}")
    if not ok or latest_of(ckpt) != os.path.join(ckpt, f"step-{k:06d}"):
        sys.stderr.write(err[-3000:])
        fail("SIGTERM did not stop the run with a checkpoint of the last step and exit 0")
    resumed, _ = train(trainer, 2, tmp, "after", sets(checkpoint__dir=ckpt) + ["--resume", "auto", "--stop-after",
                                                                               str(k + 3)], steps=100000)
    full, _ = train(trainer, 2, tmp, "full", ["--stop-after", str(k + 3)], steps=100000)
    same = all(resumed[s] == full[s] for s in range(k + 1, k + 4))
    print(f"sigterm: steps {k + 1}..{k + 3} after the restart, bit-identical: {same}")
    if not same:
        fail("the run resumed after SIGTERM differs from an uninterrupted one")


# The stored checkpoints were written by commit f069d83 (2026-11-25); a later change of
# kernel rounding moves steps 3-4 by far less than this.
COMPAT_BOUND = 1e-3
COMPAT = sets(model__hidden_size=16, model__intermediate_size=32, model__num_hidden_layers=1,
              model__num_attention_heads=2, model__num_key_value_heads=1, fsdp__mixed_precision__param_dtype="f32",
              train__global_batch_size=2, train__micro_batch_size=1, train__seq_len=16,
              model__max_position_embeddings=16)


def check_compat(trainer, tmp):
    ckpt_tool = os.path.join(os.path.dirname(trainer), "ckpt")
    full, _ = train(trainer, 1, tmp, "full", COMPAT, steps=4)
    for layout in ("unified", "sharded"):
        stored = os.path.join(ROOT, "tests", "fixtures", f"ckpt-v1-{layout}")
        proc = run([ckpt_tool, "verify", stored], expect_ok=False)
        if proc.returncode != 0:
            fail(f"ckpt verify {stored}: {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
        # Its marker gives sizes alone (version 1): loadable, and said (issue 36).
        if "was saved by an earlier version: its COMPLETE marker gives no checksum for" not in proc.stderr:
            fail(f"ckpt verify {stored} did not say which files no checksum covers: {proc.stderr[-1500:]}")
        for np in (1, 2):
            losses, proc = train(trainer, np, tmp, f"{layout}-{np}", COMPAT + ["--resume", stored], steps=4)
            if sorted(losses) != [3, 4] or f"resumed from {stored}" not in proc.stderr:
                fail(f"{layout} at {np} rank(s) did not resume at step 3: {losses} {proc.stderr[-1500:]}")
            rel = max_rel(losses, full, [3, 4])
            print(f"compat: {layout} v1 checkpoint at {np} rank(s): steps 3-4 {losses[3]:.6f} {losses[4]:.6f}, "
                  f"uninterrupted {full[3]:.6f} {full[4]:.6f}, max rel {rel:.2e}")
            if rel > COMPAT_BOUND:
                fail(f"resumed from the v1 {layout} checkpoint, the loss differs by {rel:.2e} > {COMPAT_BOUND}")


# ---- issue 36: one check on every way in ----------------------------------------------

def tools_of(trainer):
    bin_dir = os.path.dirname(trainer)
    return os.path.join(bin_dir, "ckpt"), os.path.join(bin_dir, "generate")


def saved_root(trainer, tmp, name, *stops):
    """A root of 1-rank llama-tiny checkpoints at each step of `stops` (60-step run)."""
    root = os.path.join(tmp, name)
    for stop in stops:
        run([trainer, "--config", TINY, "--steps", "60", "--stop-after", str(stop)] + sets(checkpoint__dir=root))
    return root


def edit_consumed_samples(step_dir):
    """consumed_samples 240 -> 248 in place (same size), as the issue did."""
    path = os.path.join(step_dir, "trainer_state.json")
    with open(path) as f:
        text = f.read()
    edited = text.replace('"consumed_samples": 240,', '"consumed_samples": 248,')
    if edited == text:
        fail(f"{path} does not record consumed_samples 240")
    with open(path, "w") as f:
        f.write(edited)


def damage_marker(kind):
    def damage(step_dir):
        marker = os.path.join(step_dir, "COMPLETE")
        with open(marker) as f:
            text = f.read()
        os.remove(marker)
        if kind == "edited":
            with open(marker, "w") as f:
                f.write(text.replace("step 20\n", "step 21\n"))
        elif kind == "empty":
            open(marker, "w").close()
        elif kind == "FIFO":
            os.mkfifo(marker)
        else:
            os.mkdir(marker)
    return damage


# (what, damage, what the error says about it)
DAMAGES = [("trainer_state.json edited (same size)", edit_consumed_samples,
            "trainer_state.json fails its checksum in COMPLETE (crc32c 0x"),
           ("COMPLETE edited", damage_marker("edited"), "COMPLETE marker fails its crc32c check"),
           ("COMPLETE empty", damage_marker("empty"), "COMPLETE marker is truncated"),
           ("COMPLETE a FIFO", damage_marker("FIFO"), "COMPLETE is not a regular file"),
           ("COMPLETE a directory", damage_marker("directory"), "COMPLETE is a directory, not a file")]


def check_load_paths(trainer, tmp):
    ckpt_tool, generate = tools_of(trainer)
    root = saved_root(trainer, tmp, "good", 10, 20)
    base = [trainer, "--config", TINY, "--steps", "60", "--stop-after", "21"]
    for i, (what, damage, said) in enumerate(DAMAGES):
        copy = os.path.join(tmp, f"damaged-{i}")
        shutil.copytree(os.path.join(root, "step-000010"), os.path.join(copy, "step-000010"))
        shutil.copytree(os.path.join(root, "step-000020"), os.path.join(copy, "step-000020"))
        shutil.copy(os.path.join(root, "latest"), copy)
        step20 = os.path.join(copy, "step-000020")
        damage(step20)
        ways = {
            "--resume PATH": base + ["--resume", step20],
            "checkpoint.init_from": base + sets(checkpoint__init_from=step20),
            "generate --checkpoint": [generate, "--checkpoint", step20, "--prompt", "a", "--max-new-tokens", "2"],
            "ckpt convert": [ckpt_tool, "convert", step20, "--to", "sharded", os.path.join(tmp, f"out-{i}")],
        }
        for way, cmd in ways.items():
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
            expect(proc, 1, step20, said, what=f"{what}: {way}")
            if "step 21/60" in proc.stderr or os.path.exists(os.path.join(tmp, f"out-{i}")):
                fail(f"{what}: {way} trained or wrote output")
        proc = subprocess.run([ckpt_tool, "verify", step20], cwd=ROOT, capture_output=True, text=True, timeout=120)
        expect(proc, 1, said, "FAILED", what=f"{what}: ckpt verify")
        # --resume auto skips it with a warning naming why and resumes the step before.
        proc = subprocess.run(base + sets(checkpoint__dir=copy), cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        expect(proc, 0, "latest names step-000020, which is incomplete (", said,
               f"resumed from {os.path.join(copy, 'step-000010')}", what=f"{what}: --resume auto")
        print(f"load-paths: {what}: --resume PATH, init_from, generate, ckpt convert and verify exit 1 naming it; "
              f"--resume auto falls back to step-000010")
    # A flipped data byte: the trainer prints the CRC32Cs as ckpt verify does, in hex.
    flipped = os.path.join(tmp, "flipped")
    shutil.copytree(os.path.join(root, "step-000020"), flipped)
    key = "model.layers.0.self_attn.q_proj.weight"
    with open(os.path.join(flipped, "master_weights.safetensors.index.json")) as f:
        flip_byte(os.path.join(flipped, json.load(f)["weight_map"][key]), key)
    proc = run(base + ["--resume", flipped], expect_ok=False)
    line = expect(proc, 1, f"tensor '{key}'", "crc32c 0x", "but the index records 0x", what="flipped byte")
    print("load-paths: a flipped byte: " + [ln for ln in line.splitlines() if "crc32c 0x" in ln][0][:200])


def swap_header_shapes(path, a, b):
    """Swaps the shapes of tensors a and b (of equal length as JSON) in a safetensors header, in place."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        text = f.read(n).decode()
        header = json.loads(text)
        sa, sb = (json.dumps(header[k]["shape"], separators=(",", ":")) for k in (a, b))
        edited = text.replace(sa, "\0", 1).replace(sb, sa, 1).replace("\0", sb, 1)
        if len(edited) != len(text) or json.loads(edited)[a]["shape"] != header[b]["shape"]:
            fail(f"cannot swap the shapes of {a} and {b} in place in {path}")
        f.seek(8)
        f.write(edited.encode())


def check_header(trainer, tmp):
    ckpt_tool, _ = tools_of(trainer)
    root = saved_root(trainer, tmp, "root", 10, 20)
    step20 = os.path.join(root, "step-000020")
    with open(os.path.join(step20, "master_weights.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    a, b = "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.gate_proj.weight"  # [64,172], [172,64]
    swap_header_shapes(os.path.join(step20, weight_map[a]), a, b)
    said = f"{weight_map[a]}: its header fails its checksum in COMPLETE (crc32c 0x"
    proc = run([ckpt_tool, "verify", step20], expect_ok=False)
    expect(proc, 1, said, "FAILED", what="ckpt verify of a swapped header")
    proc = run([trainer, "--config", TINY, "--steps", "60", "--stop-after", "21"] + sets(checkpoint__dir=root),
               expect_ok=False)
    out = expect(proc, 0, "latest names step-000020, which is incomplete (" + said,
                 f"resumed from {os.path.join(root, 'step-000010')}", what="--resume auto past a swapped header")
    if "does not fit this run" in out or "--overwrite" in out:
        fail("a swapped header was treated as a checkpoint that does not fit")
    print(f"header: shapes of {a} and {b} swapped in {weight_map[a]}: ckpt verify exit 1, "
          f"--resume auto warned and resumed step-000010")


def check_latest_missing(trainer, tmp):
    root = saved_root(trainer, tmp, "root", 30)
    for older in ("step-000010", "step-000020"):  # the only checkpoint, as in the issue
        shutil.rmtree(os.path.join(root, older))
    os.rename(os.path.join(root, "step-000030"), os.path.join(root, "step-30"))
    metrics = os.path.join(tmp, "m.jsonl")
    proc = run([trainer, "--config", TINY, "--steps", "60"] + sets(checkpoint__dir=root, logging__metrics_file=metrics),
               expect_ok=False)
    expect(proc, 1, f"--resume auto: {root}/latest names step-000030, but {root}", "holds no step directory",
           "Nothing was trained or deleted", what="latest naming a missing step")
    if os.path.exists(metrics) and loss_by_step(metrics):
        fail("a run whose latest names a missing step trained")
    with open(os.path.join(root, "latest")) as f:
        latest = f.read()
    steps = [n for n in os.listdir(root) if n.startswith("step-")]
    if latest != "step-000030\n" or steps != ["step-30"]:
        fail(f"the root changed: latest {latest!r}, step entries {steps}")
    print("latest-missing: latest names step-000030, its directory renamed step-30: exit 1 before step 1, "
          "latest unchanged")


def check_latest_full(trainer, tmp):
    root = saved_root(trainer, tmp, "root", 5)
    os.symlink("/dev/full", os.path.join(root, ".latest.tmp"))  # every write to it fails with ENOSPC
    proc = run([trainer, "--config", TINY, "--steps", "60", "--stop-after", "10"] + sets(checkpoint__dir=root),
               expect_ok=False)
    step10 = os.path.join(root, "step-000010")
    expect(proc, 1, "No space left on device", f"{step10} is complete (step 10 was committed), but "
           f"{os.path.join(root, 'latest')} still names step-000005", f"--resume {step10} from the committed step",
           what="ENOSPC on .latest.tmp")
    with open(os.path.join(root, "latest")) as f:
        latest = f.read().strip()
    if latest != "step-000005" or not complete(step10):
        fail(f"after ENOSPC on .latest.tmp: latest {latest}, step 10 complete: {complete(step10)}")
    os.remove(os.path.join(root, ".latest.tmp"))
    print("latest-full: ENOSPC writing .latest.tmp: exit 1, the error says step-000010 is committed and latest "
          "still names step-000005")


def check_data_change(trainer, tmp):
    root = saved_root(trainer, tmp, "root", 10)
    base = [trainer, "--config", TINY, "--steps", "60", "--resume", os.path.join(root, "step-000010")]
    proc = run(base + ["--stop-after", "11"] + sets(train__seed=7, data__token_dtype="uint32"))
    out = expect(proc, 0, "the data settings differ from the checkpoint's (", "train.seed 1234 -> 7",
                 "data.token_dtype uint16 -> uint32", what="changed seed and data")
    line = [ln for ln in out.splitlines() if "data settings differ" in ln][0]
    proc = run(base + ["--stop-after", "11"])
    if "data settings differ" in proc.stdout + proc.stderr:
        fail("an unchanged resume warned about data settings")
    print(f"data-change: {line.strip()[:220]}")


def main():
    check_main({"resume": check_resume, "async": check_async, "elastic": check_elastic, "toy": check_toy,
                "options": check_options, "init-from": check_init_from, "crash": check_crash,
                "corruption": check_corruption, "sigterm": check_sigterm, "compat": check_compat,
                "load-paths": check_load_paths, "header": check_header, "latest-missing": check_latest_missing,
                "latest-full": check_latest_full, "data-change": check_data_change})


if __name__ == "__main__":
    main()
