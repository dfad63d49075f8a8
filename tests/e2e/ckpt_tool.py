#!/usr/bin/env python3
"""End-to-end checks of the `ckpt` tool on checkpoints the trainer writes
(standard library + numpy; safetensors files are parsed here, independently
of the C++ reader).

    ckpt_tool.py CKPT TRAINER CHECK

Each check trains configs/llama-tiny.yaml for 3 steps at 2 ranks (mpirun) with
checkpoint.format sharded and unified, and then:
  inspect   `ckpt inspect ROOT --json` picks step-000003 through `latest`, says the
            format, step 3 and world size 2, and lists every llama-tiny tensor (master
            or model weights, exp_avg, exp_avg_sq) with the shape, dtype and bytes that
            the checkpoint's own index and safetensors headers give, and with the shapes
            of the model (123,712 parameters); the text form lists the same tensors and
            their count by kind
  verify    passes on the checkpoint ("verified ... : OK"); fails (exit 1) naming the
            file and the tensor after one byte inside a tensor's data is flipped (the
            CRC32Cs in hex, 0x...); names two tensors' shapes swapped in a safetensors
            header (same size: its header's checksum in COMPLETE); on a root whose
            `latest` names an incomplete step (or one that is not there), exits 1 naming
            it even though the step it falls back to verifies, while a root without
            `latest` (a first save killed before it was written) passes; names
            a deleted file and a truncated one, and trainer_state.json after a
            same-size edit of consumed_samples (its checksum in COMPLETE)
  convert   the checkpoint converted to the other layout with 3 processes, and back with
            1 process (no launcher), holds every tensor byte-identical to the original,
            and both outputs pass `ckpt verify`; its summary counts the tensors read and
            written by kind as `inspect` does ("read 84 tensors (21 model, ...), wrote ...")
  resume    `trainer --resume OUT` from the converted checkpoint (and from the round
            trip) continues steps 4..6 with losses bit-identical to resuming the original
  untrusted a data file replaced by a FIFO, or by a symlink to one: `verify` (and
            `inspect` of a unified checkpoint, which reads the data files'
            headers) exit 1 at once naming the file as "not a regular file (a
            FIFO)" (the open cannot block); `inspect` of a sharded one reads only
            its index and exits 0; an index whose weight_map names
            '../outside.safetensors' (a valid copy of the real file, outside the
            checkpoint) or '/etc/passwd': `verify` and `inspect` exit 1 naming the
            name as not a plain file name, and verify says it was not opened
  errors    `ckpt` with no arguments: the usage on stderr, exit 2;
            convert into an existing OUT, of a corrupted checkpoint, and bad arguments
            fail with exit 1 and one line naming the problem; a failed convert leaves no
            OUT and no temporary directory
Each check prints what it measured; a failure exits 1.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, fail, loss_by_step, mpirun, resum_marker, run  # noqa: E402

CONFIG = "configs/llama-tiny.yaml"
FORMATS = ("sharded", "unified")
OTHER = {"sharded": "unified", "unified": "sharded"}
TRAIN_NP = 2
STOP = 3
STEPS = 6
OPTIM_KINDS = ("exp_avg", "exp_avg_sq")


def llama_tiny_shapes():
    """FQN -> shape of configs/llama-tiny.yaml's model, from its dimensions."""
    vocab, hidden, inter, layers, heads, kv_heads = 256, 64, 172, 2, 4, 2
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden],
              "lm_head.weight": [vocab, hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
            p + "self_attn.q_proj.weight": [heads * head_dim, hidden],
            p + "self_attn.k_proj.weight": [kv_heads * head_dim, hidden],
            p + "self_attn.v_proj.weight": [kv_heads * head_dim, hidden],
            p + "self_attn.o_proj.weight": [hidden, heads * head_dim],
            p + "mlp.gate_proj.weight": [inter, hidden],
            p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter],
        })
    return shapes


# ---- safetensors and the two layouts, read independently ---------------------------

ITEMSIZE = {"F32": 4, "BF16": 2, "I32": 4}


def read_header(path):
    """name -> (dtype, shape, absolute data offset, nbytes)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {name: (e["dtype"], e["shape"], 8 + n + e["data_offsets"][0], e["data_offsets"][1] - e["data_offsets"][0])
            for name, e in header.items()}


def read_bytes(path, offset, nbytes):
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(nbytes)
    if len(data) != nbytes:
        fail(f"{path}: short read at {offset}")
    return data


def load_state(d):
    """(fqn, kind) -> (dtype, shape, bytes) of every tensor stored in checkpoint directory d.
    Unified: model-* -> "model", master_weights-* -> "master", optimizer-* "<fqn>.<kind>"."""
    state = {}
    if os.path.exists(os.path.join(d, "sharded.index.json")):
        with open(os.path.join(d, "sharded.index.json")) as f:
            index = json.load(f)
        headers = {}
        buffers = {}
        for fqn, kinds in index["tensors"].items():
            for kind, t in kinds.items():
                numel = int(np.prod(t["shape"], dtype=np.int64))
                buffers[(fqn, kind)] = (t["dtype"], t["shape"], bytearray(numel * ITEMSIZE[t["dtype"]]))
        for c in index["chunks"]:
            path = os.path.join(d, c["file"])
            if path not in headers:
                headers[path] = read_header(path)
            dtype, shape, offset, nbytes = headers[path][c["key"]]
            want_dtype, _, buf = buffers[(c["fqn"], c["kind"])]
            size = ITEMSIZE[want_dtype]
            if dtype != want_dtype or nbytes != c["numel"] * size:
                fail(f"{path}: chunk {c['key']} is {dtype} {nbytes} bytes, index says {want_dtype} x {c['numel']}")
            buf[c["begin"] * size:(c["begin"] + c["numel"]) * size] = read_bytes(path, offset, nbytes)
        for key, (dtype, shape, buf) in buffers.items():
            state[key] = (dtype, list(shape), bytes(buf))
        return state
    families = {"model.safetensors.index.json": "model", "master_weights.safetensors.index.json": "master",
                "optimizer.safetensors.index.json": None}
    for index_name, kind in families.items():
        path = os.path.join(d, index_name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        headers = {}
        for key, file in weight_map.items():
            fpath = os.path.join(d, file)
            if fpath not in headers:
                headers[fpath] = read_header(fpath)
            dtype, shape, offset, nbytes = headers[fpath][key]
            fqn, k = (key, kind) if kind else tuple(key.rsplit(".", 1))
            state[(fqn, k)] = (dtype, list(shape), read_bytes(fpath, offset, nbytes))
    if not state:
        fail(f"{d} holds neither sharded.index.json nor a unified index")
    return state


def training_state(d):
    """The state a resume loads: master weights (F32 model-* weights when no master copy
    is stored) and optimizer state."""
    state = load_state(d)
    has_master = any(k == "master" for _, k in state)
    out = {}
    for (fqn, kind), value in state.items():
        if kind == "model":
            if has_master:
                continue
            if value[0] != "F32":
                fail(f"{d}: {fqn} has {value[0]} model weights and no master copy")
            kind = "master"
        out[(fqn, kind)] = value
    return out


def compare_states(a, b, what):
    if set(a) != set(b):
        fail(f"{what}: tensors differ: only in the first {sorted(set(a) - set(b))[:5]}, "
             f"only in the second {sorted(set(b) - set(a))[:5]}")
    differ = [k for k in a if a[k] != b[k]]
    if differ:
        fail(f"{what}: {len(differ)} tensor(s) differ, e.g. {differ[0]} "
             f"({a[differ[0]][0]} {a[differ[0]][1]} vs {b[differ[0]][0]} {b[differ[0]][1]})")
    return sum(len(v[2]) for v in a.values())


# ---- the trainer and the tool ------------------------------------------------------------


class Env:
    def __init__(self, ckpt, trainer, tmp):
        self.ckpt, self.trainer, self.tmp = ckpt, trainer, tmp

    def train(self, name, extra, np_=TRAIN_NP):
        """Runs the trainer; returns {step: loss}."""
        metrics = os.path.join(self.tmp, name + ".jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        run(mpirun(np_) + [self.trainer, "--config", CONFIG, "--steps", str(STEPS), "--set",
                           f"logging.metrics_file={metrics}"] + extra)
        return loss_by_step(metrics)

    def checkpoint(self, fmt):
        """A checkpoint root with step-000003 in `fmt`, saved by TRAIN_NP ranks."""
        root = os.path.join(self.tmp, f"train-{fmt}")
        if not os.path.exists(root):
            self.train(f"save-{fmt}", ["--set", f"checkpoint.dir={root}", "--set", f"checkpoint.format={fmt}",
                                       "--stop-after", str(STOP)])
        return root

    def ckpt_cmd(self, *args, np_=None):
        return (mpirun(np_) if np_ else []) + [self.ckpt] + list(args)


def tensor_count(keys):
    """What inspect and convert say of a set of (fqn, kind): '84 tensors (21 model, 21 master, ...)'."""
    order = {"model": 0, "master": 1}
    kinds = sorted({k for _, k in keys}, key=lambda k: (order.get(k, 2), k))
    parts = ", ".join(f"{sum(1 for _, k2 in keys if k2 == k)} {k}" for k in kinds)
    return f"{len(keys)} tensors ({parts})"


def step_dir(root):
    return os.path.join(root, f"step-{STOP:06d}")


def check_inspect(env):
    shapes = llama_tiny_shapes()
    n_params = sum(int(np.prod(s)) for s in shapes.values())
    if n_params != 123712:
        fail(f"llama-tiny has {n_params} parameters by this script's count, the config says 123,712")
    for fmt in FORMATS:
        root = env.checkpoint(fmt)
        proc = run(env.ckpt_cmd("inspect", root, "--json"))
        info = json.loads(proc.stdout)
        if "step-000003" not in proc.stderr:
            fail(f"inspect of the root does not say which step it took: {proc.stderr!r}")
        if info["format"] != fmt or info["step"] != STOP or info["world_size"] != TRAIN_NP:
            fail(f"inspect says format {info['format']}, step {info['step']}, world size {info['world_size']}; "
                 f"expected {fmt}, {STOP}, {TRAIN_NP}")
        if not info["complete"]:
            fail(f"inspect says the checkpoint is incomplete: {info.get('incomplete_reason')}")
        listed = {(t["fqn"], t["kind"]): t for t in info["tensors"]}
        stored = load_state(step_dir(root))
        if set(listed) != set(stored):
            fail(f"inspect lists {sorted(set(listed) ^ set(stored))[:5]} differently from the index")
        for key, (dtype, shape, data) in stored.items():
            t = listed[key]
            if t["dtype"] != dtype or t["shape"] != shape or t["bytes"] != len(data):
                fail(f"inspect: {key}: {t['dtype']} {t['shape']} {t['bytes']} B, the files say "
                     f"{dtype} {shape} {len(data)} B")
        weights = {fqn for fqn, kind in listed if kind in ("master", "model")}
        if weights != set(shapes):
            fail(f"inspect's weights differ from llama-tiny's: {sorted(weights ^ set(shapes))[:5]}")
        for (fqn, kind), t in listed.items():
            if t["shape"] != shapes[fqn]:
                fail(f"inspect: {fqn} ({kind}) has shape {t['shape']}, llama-tiny's is {shapes[fqn]}")
            if kind in OPTIM_KINDS and (t["dtype"] != "F32" or t["bytes"] != 4 * int(np.prod(shapes[fqn]))):
                fail(f"inspect: {fqn} ({kind}) is {t['dtype']} {t['bytes']} B, expected F32")
        for kind in OPTIM_KINDS:
            if {fqn for fqn, k in listed if k == kind} != set(shapes):
                fail(f"inspect does not list {kind} for every weight")
        total = sum(t["bytes"] for t in listed.values())
        if total != info["total_bytes"]:
            fail(f"inspect: total_bytes {info['total_bytes']} != sum of tensor bytes {total}")
        text = run(env.ckpt_cmd("inspect", step_dir(root))).stdout
        count = tensor_count(listed).replace(" tensors", "", 1)  # inspect: "tensors      84 (21 model, ...)"
        if f"  tensors      {count}, " not in text:
            fail(f"the text form of inspect does not say '{count}': {text[:600]!r}")
        rows = [line.split() for line in text.splitlines()]
        text_keys = {(r[0], r[1]) for r in rows if len(r) >= 6 and (r[0], r[1]) in listed}
        if text_keys != set(listed):
            fail(f"the text form of inspect lists {len(text_keys)} of {len(listed)} tensors")
        print(f"inspect {fmt}: step {info['step']}, world size {info['world_size']}, {len(listed)} tensors "
              f"({len(weights)} weights x {len(listed) // len(weights)} kinds, {n_params} parameters), "
              f"{info['total_bytes']} bytes, all shapes/dtypes/bytes as the files say")
    # A plain Hugging Face folder (model-* files and config.json, no COMPLETE marker)
    # is a model directory, not an incomplete checkpoint.
    src = step_dir(env.checkpoint("unified"))
    hf = os.path.join(env.tmp, "hf-folder")
    os.makedirs(hf, exist_ok=True)
    for name in os.listdir(src):
        if name.startswith("model") or name == "config.json":
            shutil.copy(os.path.join(src, name), hf)
    # As Hugging Face writes it: total_size and weight_map, none of our metadata or checksums.
    index_path = os.path.join(hf, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    with open(index_path, "w") as f:
        json.dump({"metadata": {"total_size": index["metadata"]["total_size"]}, "weight_map": index["weight_map"]}, f)
    text = run(env.ckpt_cmd("inspect", hf)).stdout
    first = text.splitlines()[0]
    if first != f"Hugging Face model directory {hf}" or "complete     NO" in text or "incomplete" in text:
        fail(f"inspect of a Hugging Face folder: {text[:400]!r}")
    print(f"inspect huggingface: '{first}', no claim of an incomplete checkpoint")


def flip_byte(d, fqn):
    """Flips one byte in the middle of the data of one stored piece of `fqn`; returns the file name."""
    state_files = []
    if os.path.exists(os.path.join(d, "sharded.index.json")):
        with open(os.path.join(d, "sharded.index.json")) as f:
            chunks = [c for c in json.load(f)["chunks"] if c["fqn"] == fqn]
        state_files = [(c["file"], c["key"]) for c in chunks]
    else:
        for index in ("master_weights.safetensors.index.json", "model.safetensors.index.json"):
            path = os.path.join(d, index)
            if os.path.exists(path):
                with open(path) as f:
                    state_files.append((json.load(f)["weight_map"][fqn], fqn))
    file, key = state_files[0]
    path = os.path.join(d, file)
    _, _, offset, nbytes = read_header(path)[key]
    with open(path, "r+b") as f:
        f.seek(offset + nbytes // 2)
        b = f.read(1)
        f.seek(offset + nbytes // 2)
        f.write(bytes([b[0] ^ 0x10]))
    return file


def expect_failure(proc, needles, what, code=1):
    """One stderr line names all of `needles`; exit `code` (2: a mistake on the command line)."""
    if proc.returncode != code:
        sys.stderr.write(proc.stdout + proc.stderr)
        fail(f"{what}: exit code {proc.returncode}, expected {code}")
    lines = proc.stderr.splitlines()
    hit = [l for l in lines if all(n in l for n in needles)]
    if not hit:
        sys.stderr.write(proc.stderr)
        fail(f"{what}: no stderr line names all of {needles}")
    return hit[0].strip()


def check_verify(env):
    fqn = "model.layers.1.mlp.up_proj.weight"
    for fmt in FORMATS:
        root = env.checkpoint(fmt)
        proc = run(env.ckpt_cmd("verify", root))
        if ": OK" not in proc.stdout or "verified" not in proc.stdout:
            fail(f"verify of a good checkpoint printed {proc.stdout!r}")
        print(f"verify {fmt}: {proc.stdout.strip()}")

        bad = os.path.join(env.tmp, f"flipped-{fmt}")
        shutil.copytree(step_dir(root), bad)
        file = flip_byte(bad, fqn)
        line = expect_failure(run(env.ckpt_cmd("verify", bad), expect_ok=False), [file, fqn, "crc32c 0x", ", the index says 0x"],
                              "flipped byte")
        print(f"verify {fmt}, one byte flipped in {file}: exit 1: {line}")

        swapped = os.path.join(env.tmp, f"swapped-{fmt}")
        shutil.copytree(step_dir(root), swapped)
        file = swap_two_shapes(swapped)
        line = expect_failure(run(env.ckpt_cmd("verify", swapped), expect_ok=False),
                              [file, "its header fails its checksum in COMPLETE (crc32c 0x"], "swapped shapes")
        print(f"verify {fmt}, two shapes swapped in {file}'s header: exit 1: {line[:160]}")

        check_verify_root(env, root, fmt)

        missing = os.path.join(env.tmp, f"missing-{fmt}")
        shutil.copytree(step_dir(root), missing)
        data_files = sorted(f for f in os.listdir(missing) if f.endswith(".safetensors"))
        os.remove(os.path.join(missing, data_files[-1]))
        line = expect_failure(run(env.ckpt_cmd("verify", missing), expect_ok=False), [data_files[-1], "missing"],
                              "deleted file")
        print(f"verify {fmt}, {data_files[-1]} deleted: exit 1: {line}")

        if fmt == "unified":
            # Several problems at once are each reported: a broken header, a flipped byte, a missing file.
            several = os.path.join(env.tmp, "several")
            shutil.copytree(step_dir(root), several)
            with open(os.path.join(several, "model-00001-of-00002.safetensors"), "r+b") as f:
                f.seek(20)
                f.write(b"\0")
            flipped = flip_byte(several, fqn)
            os.remove(os.path.join(several, "optimizer-00002-of-00002.safetensors"))
            proc = run(env.ckpt_cmd("verify", several), expect_ok=False)
            for needles in (["model-00001-of-00002.safetensors", "header"], [flipped, fqn, "checksum"],
                            ["optimizer-00002-of-00002.safetensors", "missing"]):
                expect_failure(proc, needles, "several problems")
            print(f"verify {fmt}, a broken header, a flipped byte and a deleted file: exit 1, "
                  f"{len(proc.stderr.splitlines())} lines, each problem named")

        # A same-size edit of a JSON file (consumed_samples 36 -> 38): caught by its checksum in COMPLETE.
        edited = os.path.join(env.tmp, f"edited-{fmt}")
        shutil.copytree(step_dir(root), edited)
        state_path = os.path.join(edited, "trainer_state.json")
        with open(state_path) as f:
            text = f.read()
        key = '"consumed_samples": '
        at = text.index(key) + len(key)
        digit = text[at + len(text[at:].split(",")[0].strip()) - 1]
        edit = text[:at] + text[at:].replace(digit, str((int(digit) + 2) % 10), 1)
        if len(edit) != len(text) or edit == text:
            fail("could not make a same-size edit of consumed_samples")
        with open(state_path, "w") as f:
            f.write(edit)
        line = expect_failure(run(env.ckpt_cmd("verify", edited), expect_ok=False),
                              ["trainer_state.json", "fails its checksum in COMPLETE"], "same-size JSON edit")
        print(f"verify {fmt}, consumed_samples edited in place (same size): exit 1: {line[:140]}")

        short = os.path.join(env.tmp, f"short-{fmt}")
        shutil.copytree(step_dir(root), short)
        path = os.path.join(short, data_files[0])
        size = os.path.getsize(path)
        os.truncate(path, size - 100)
        line = expect_failure(run(env.ckpt_cmd("verify", short), expect_ok=False),
                              [data_files[0], f"{size - 100} bytes", str(size)], "truncated file")
        print(f"verify {fmt}, {data_files[0]} truncated by 100 bytes: exit 1: {line}")


def swap_two_shapes(d):
    """Swaps the shapes of two tensors of different shape in one data file's header, in place
    (the header keeps its size); returns the file's name."""
    name = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0]
    path = os.path.join(d, name)
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        text = f.read(n).decode()
        header = json.loads(text)
        shapes = sorted({json.dumps(v["shape"], separators=(",", ":")) for k, v in header.items()
                         if k != "__metadata__"})
        sa, sb = next((x, y) for x in shapes for y in shapes if x < y and len(x) == len(y))
        edited = text.replace(sa, "\0", 1).replace(sb, sa, 1).replace("\0", sb, 1)
        if len(edited) != len(text) or edited == text:
            fail(f"cannot swap the shapes {sa} and {sb} in {path} in place")
        f.seek(8)
        f.write(edited.encode())
    return name


def check_verify_root(env, root, fmt):
    """ckpt verify ROOT: a `latest` naming a step that is incomplete or not there fails it."""
    damaged = os.path.join(env.tmp, f"root-{fmt}")
    shutil.copytree(root, damaged)
    shutil.copytree(step_dir(damaged), os.path.join(damaged, "step-000004"))
    os.remove(os.path.join(damaged, "step-000004", "COMPLETE"))
    with open(os.path.join(damaged, "latest"), "w") as f:
        f.write("step-000004\n")
    proc = run(env.ckpt_cmd("verify", damaged), expect_ok=False)
    line = expect_failure(proc, ["latest names step-000004, which is incomplete (missing COMPLETE marker); using "
                                 "step-000003", "the root is damaged"], "verify ROOT with an incomplete latest")
    if "1 problem(s)" not in proc.stderr:
        fail(f"verify ROOT with an incomplete latest: {proc.stderr!r}")
    print(f"verify {fmt} ROOT whose latest names an incomplete step: exit 1: {line[:150]}")
    shutil.rmtree(os.path.join(damaged, "step-000004"))
    proc = run(env.ckpt_cmd("verify", damaged), expect_ok=False)
    expect_failure(proc, ["latest names step-000004, which does not exist"], "verify ROOT with a missing latest step")
    os.remove(os.path.join(damaged, "latest"))
    proc = run(env.ckpt_cmd("verify", damaged))
    print(f"verify {fmt} ROOT whose latest names a missing step: exit 1; without latest: exit 0")


def run_guarded(cmd, what):
    """run() with a hang guard: a tool that blocks is the failure this check looks for."""
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        fail(f"{what}: {' '.join(cmd)} did not return (blocked)")


def check_untrusted(env):
    for fmt in FORMATS:
        root = env.checkpoint(fmt)
        for kind in ("fifo", "symlink"):
            d = os.path.join(env.tmp, f"{kind}-{fmt}")
            shutil.copytree(step_dir(root), d)
            victim = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0]
            os.remove(os.path.join(d, victim))
            if kind == "fifo":
                os.mkfifo(os.path.join(d, victim))
            else:
                fifo = os.path.join(env.tmp, f"elsewhere-{fmt}.fifo")
                os.mkfifo(fifo)
                os.symlink(fifo, os.path.join(d, victim))
            for tool in ("verify", "inspect"):
                proc = run_guarded(env.ckpt_cmd(tool, d), f"{tool} with a {kind}")
                if tool == "inspect" and fmt == "sharded":
                    # The sharded index holds every shape and dtype: inspect opens no data file.
                    if proc.returncode != 0 or "exp_avg" not in proc.stdout:
                        fail(f"inspect of a sharded checkpoint with a {kind}: exit {proc.returncode}")
                    print(f"untrusted {fmt}: {victim} as a {kind}: inspect reads only the index: exit 0")
                    continue
                line = expect_failure(proc, [victim, "is not a regular file (a FIFO)"], f"{tool} with a {kind}")
                print(f"untrusted {fmt}: {victim} as a {kind}: {tool} exit 1: {line[:150]}")
    root = step_dir(env.checkpoint("unified"))
    d = os.path.join(env.tmp, "escape", "step")
    shutil.copytree(root, d)
    index_path = os.path.join(d, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    keys = sorted(index["weight_map"])
    real = index["weight_map"][keys[0]]
    shutil.copy(os.path.join(d, real), os.path.join(env.tmp, "escape", "outside.safetensors"))
    index["weight_map"][keys[0]] = "../outside.safetensors"
    index["weight_map"][keys[1]] = "/etc/passwd"
    with open(index_path, "w") as f:
        json.dump(index, f)
    for name in ("../outside.safetensors", "/etc/passwd"):
        proc = run_guarded(env.ckpt_cmd("verify", d), "verify of an escaping index")
        line = expect_failure(proc, [f"names file '{name}', which is not a plain file name"], "verify, escaping name")
        print(f"untrusted: weight_map names {name!r}: verify exit 1: {line[:160]}")
    proc = run_guarded(env.ckpt_cmd("inspect", d), "inspect of an escaping index")
    line = expect_failure(proc, ["which is not a plain file name"], "inspect, escaping name")
    print(f"untrusted: inspect exit 1: {line[:160]}")


def convert(env, src, fmt, out, np_):
    proc = run(env.ckpt_cmd("convert", src, "--to", fmt, out, np_=np_))
    return proc.stdout.strip()


def check_convert(env):
    for fmt in FORMATS:
        src = step_dir(env.checkpoint(fmt))
        original = training_state(src)
        other = os.path.join(env.tmp, f"{fmt}-to-{OTHER[fmt]}-np3")
        back = os.path.join(env.tmp, f"{fmt}-to-{OTHER[fmt]}-to-{fmt}-np1")
        for a, layout, b, np_ in ((src, OTHER[fmt], other, 3), (other, fmt, back, None)):
            summary = convert(env, a, layout, b, np_)
            print(f"convert: {summary}")
            # Counted as inspect counts them: every stored tensor by kind, read and written.
            want = f"read {tensor_count(load_state(a))}, wrote {tensor_count(load_state(b))}, "
            if want not in summary:
                fail(f"convert's summary does not say '{want}': {summary!r}")
        for d, layout in ((other, OTHER[fmt]), (back, fmt)):
            info = json.loads(run(env.ckpt_cmd("inspect", d, "--json")).stdout)
            with open(os.path.join(d, "trainer_state.json")) as f:
                state_format = json.load(f)["format"]
            if info["format"] != layout or state_format != layout:
                fail(f"{d}: inspect says {info['format']}, trainer_state.json {state_format}, expected {layout}")
            verified = run(env.ckpt_cmd("verify", d)).stdout.strip()
            if not verified.endswith(": OK"):
                fail(f"verify of {d}: {verified}")
        n1 = compare_states(original, training_state(other), f"{fmt} -> {OTHER[fmt]} (3 processes)")
        n2 = compare_states(original, training_state(back), f"{fmt} -> {OTHER[fmt]} -> {fmt} (1 process)")
        if fmt == "unified":
            # The round trip rewrites the model-* weights too: same bytes as the original's.
            a, b = load_state(src), load_state(back)
            models = [k for k in a if k[1] == "model"]
            if not models or any(a[k] != b.get(k) for k in models):
                fail("unified round trip: model-* weights differ from the original's")
        print(f"convert {fmt}: -> {OTHER[fmt]} at 3 processes -> {fmt} at 1 process: {len(original)} tensors, "
              f"{n1} bytes identical after one conversion, {n2} after the round trip; both verify OK")


def check_resume(env):
    for fmt in FORMATS:
        src = step_dir(env.checkpoint(fmt))
        other = os.path.join(env.tmp, f"resume-{fmt}-to-{OTHER[fmt]}")
        back = os.path.join(env.tmp, f"resume-{fmt}-round-trip")
        convert(env, src, OTHER[fmt], other, 2)
        convert(env, other, fmt, back, 3)
        base = env.train(f"resume-{fmt}-original", ["--set", f"checkpoint.format={fmt}", "--resume", src])
        if sorted(base) != list(range(STOP + 1, STEPS + 1)):
            fail(f"resume of the original ran steps {sorted(base)}")
        for d, layout in ((other, OTHER[fmt]), (back, fmt)):
            got = env.train(f"resume-{os.path.basename(d)}", ["--set", f"checkpoint.format={layout}", "--resume", d])
            same = got == base
            print(f"resume {fmt}: from {os.path.basename(d)} ({layout}): steps {min(got)}..{max(got)} losses "
                  f"{[got[s] for s in sorted(got)]}, bit-identical to resuming the original: {same}")
            if not same:
                fail(f"resuming {d} gives losses {got}, the original {base}")


def check_errors(env):
    root = env.checkpoint("sharded")
    src = step_dir(root)
    out = os.path.join(env.tmp, "exists")
    os.makedirs(out)
    line = expect_failure(run(env.ckpt_cmd("convert", src, "--to", "unified", out), expect_ok=False),
                          [out, "already exists"], "existing OUT")
    print(f"errors: convert into an existing directory: exit 1: {line}")

    bad = os.path.join(env.tmp, "corrupt")
    shutil.copytree(src, bad)
    fqn = "model.layers.0.self_attn.q_proj.weight"
    file = flip_byte(bad, fqn)
    parent = os.path.join(env.tmp, "outputs")
    os.makedirs(parent)
    for np_ in (None, 2):
        out = os.path.join(parent, f"from-corrupt-np{np_ or 1}")
        proc = run(env.ckpt_cmd("convert", bad, "--to", "unified", out, np_=np_), expect_ok=False)
        line = expect_failure(proc, [fqn], f"convert of a corrupted checkpoint at {np_ or 1} process(es)")
        if file not in proc.stderr:
            fail(f"the error does not name {file}: {proc.stderr!r}")
        if os.listdir(parent):
            fail(f"a failed convert left {os.listdir(parent)} behind")
        print(f"errors: convert of a checkpoint with a flipped byte at {np_ or 1} process(es): exit 1, "
              f"nothing left behind: {line}")

    # A failure after the data files are written (config.json, same size, no longer JSON): the
    # temporary directory goes too.
    broken = os.path.join(env.tmp, "broken-config")
    shutil.copytree(step_dir(env.checkpoint("unified")), broken)
    with open(os.path.join(broken, "config.json"), "r+b") as f:
        f.write(b"X")
    resum_marker(broken, "config.json")  # as a save that wrote this file would have: its checksum passes
    for np_ in (None, 2):
        out = os.path.join(parent, f"from-broken-config-np{np_ or 1}")
        proc = run(env.ckpt_cmd("convert", broken, "--to", "sharded", out, np_=np_), expect_ok=False)
        line = expect_failure(proc, ["config.json", "not valid JSON"], "convert with a broken config.json")
        if os.listdir(parent):
            fail(f"a convert that failed after writing left {os.listdir(parent)} behind")
        print(f"errors: convert failing after its data files were written, at {np_ or 1} process(es): exit 1, "
              f"nothing left behind: {line}")

    # No arguments at all: a usage error (the usage on stderr, nothing on stdout, exit 2); --help: stdout, exit 0.
    bare = run(env.ckpt_cmd(), expect_ok=False)
    if bare.returncode != 2 or bare.stdout or not bare.stderr.startswith("usage: ckpt inspect DIR [--json]\n"):
        fail(f"ckpt with no arguments: exit {bare.returncode}, stdout {bare.stdout[:80]!r}, "
             f"stderr {bare.stderr[:80]!r}; expected the usage on stderr and exit 2")
    helped = run(env.ckpt_cmd("--help"))
    if helped.stdout != bare.stderr:
        fail("ckpt --help prints another text than ckpt with no arguments")
    print(f"errors: ckpt with no arguments: exit 2, usage on stderr ({len(bare.stderr.splitlines())} lines)")

    for args, needle, code in ((["convert", src, "--to", "hdf5", out], "--to hdf5", 2),
                               (["convert", src, out], "--to", 2),
                               (["inspect", os.path.join(env.tmp, "nowhere")], "nowhere", 1),
                               (["frobnicate", src], "unknown command 'frobnicate'", 2),
                               (["verify", src, "--bogus"], "--bogus", 2)):
        line = expect_failure(run(env.ckpt_cmd(*args), expect_ok=False), [needle], " ".join(args), code)
        if len(run(env.ckpt_cmd(*args), expect_ok=False).stderr.splitlines()) != 1:
            fail(f"ckpt {' '.join(args)}: more than one line on stderr")
        print(f"errors: ckpt {args[0]} ...: exit {code}: {line}")


def main():
    ckpt, trainer, check = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    checks = {"inspect": check_inspect, "verify": check_verify, "convert": check_convert, "resume": check_resume,
              "errors": check_errors, "untrusted": check_untrusted}
    with tempfile.TemporaryDirectory() as tmp:
        checks[check](Env(ckpt, trainer, tmp))


if __name__ == "__main__":
    main()
