#!/usr/bin/env python3
"""End-to-end checks of `prepare` and of the trainer's data.tokenizer (Python's
sentencepiece module, Debian's python3-sentencepiece, is the independent encoder).

    check_prepare.py PREPARE TRAINER CKPT CHECK

CHECK is one of:
  shards      prepare --train-tokenizer on a small tree of English text files (plus a
              binary file, an empty file, a hidden directory and a symlink, all skipped):
              llm.c uint16 shards whose headers count their tokens; with --val-fraction 0
              the train tokens are exactly, file by file in path order, BOS + Python
              sentencepiece's ids of the file + EOS; with --val-fraction 0.1 the val
              shards hold round(0.1 x total) tokens; 1 and 2 threads write identical bytes
  errors      an empty input folder, a folder without text files and a missing input are
              errors naming the path; an output directory with shards is refused without
              --overwrite, and --overwrite replaces the shards but no other file; a
              --vocab-size too small for byte fallback, or for the text (SentencePiece's
              real minimum, which the message names: that size trains, one less is
              refused), is a usage error (exit 2) before anything is written; one too
              large for the text fails inside SentencePiece and leaves no output
              directory; a --tokenizer that is no model is an error naming it; --train-tokenizer on a file of only whitespace is
              refused naming the file (before SentencePiece runs); a shard that cannot
              be written (its path a link to /dev/full) is an error with the reason
  long-line   a 3 MB file of one line (the fortunes joined by spaces): --train-tokenizer
              trains on it (the line cut into sentences), and --tokenizer encodes it
              in 64 KiB chunks to exactly Python sentencepiece's ids of the whole line,
              with a peak RSS far below the ~120 bytes per input byte of one call
  trainer     llama-tiny trains on prepare's shards (data.kind tokens, data.tokenizer) and
              on a text file encoded with data.tokenizer; a model.vocab_size that differs
              from the tokenizer's is an error naming the file and both sizes; the unified
              checkpoint holds tokenizer.model byte for byte, tokenizer_config.json
              (LlamaTokenizer, model_max_length = max_position_embeddings) and
              special_tokens_map.json, and `ckpt verify` accepts it
Each check prints what it measured; a failure exits 1.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, fail  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"
# About 1 MB of English (the tutorial's text): a 512-token tokenizer trains in seconds.
TEXTS = ["computers", "cookie", "definitions", "art", "knghtbrd", "humorists"]
VOCAB = 512
MAGIC_U16 = 20240520


def run(cmd, expect_code=0, what=""):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if expect_code is not None and proc.returncode != expect_code:
        sys.stderr.write((proc.stdout + proc.stderr)[-4000:])
        fail(f"{what or ' '.join(cmd)}: exit {proc.returncode}, expected {expect_code}")
    return proc.stdout + proc.stderr


def expect_error(cmd, *texts, what):
    out = run(cmd, expect_code=1, what=what)
    missing = [t for t in texts if t not in out]
    if missing:
        sys.stderr.write(out[-2000:])
        fail(f"{what}: the error lacks {missing}")
    print(f"{what}: {out.strip().splitlines()[-1]}")


def read_shard(path):
    """(magic, version, tokens) of an llm.c shard; the header must count the file's tokens."""
    data = open(path, "rb").read()
    magic, version, count = struct.unpack("<3i", data[:12])
    if magic != MAGIC_U16 or len(data) != 1024 + 2 * count:
        fail(f"{path}: magic {magic}, {count} tokens, {len(data)} bytes: not an llm.c uint16 shard")
    return magic, version, list(struct.unpack(f"<{count}H", data[1024:]))


def shard_tokens(directory, split):
    names = sorted(n for n in os.listdir(os.path.join(directory, split)) if n.endswith(".bin"))
    if not names or names[0] != f"{split}_000000.bin":
        fail(f"{directory}/{split}: shards {names}, expected {split}_000000.bin ...")
    tokens = []
    for n in names:
        _, version, t = read_shard(os.path.join(directory, split, n))
        if version != 1:
            fail(f"{n}: version {version}, expected 1 (llm.c's uint16 shards)")
        tokens += t
    return tokens


def make_inputs(tmp):
    """A tree of text files, with things prepare must skip; returns (dir, the text files in path order)."""
    src = os.path.join(tmp, "in")
    os.makedirs(os.path.join(src, "more", "deeper"))
    os.makedirs(os.path.join(src, ".hidden"))
    places = ["", "more", "more/deeper"]
    files = []
    for i, name in enumerate(TEXTS):
        dest = os.path.join(src, places[i % 3], name + ".txt")
        shutil.copyfile(os.path.join(FORTUNES, name), dest)
        files.append(dest)
    open(os.path.join(src, "image.bin"), "wb").write(bytes(range(256)) * 4)
    open(os.path.join(src, "empty.txt"), "w").close()
    shutil.copyfile(os.path.join(FORTUNES, "food"), os.path.join(src, ".hidden", "food.txt"))
    os.symlink(files[0], os.path.join(src, "zz-link.txt"))  # the same file again: read once
    return src, sorted(files)


def prepare_cmd(prepare, src, out, *extra):
    return [prepare, src, "--out", out, *extra]


def check_shards(prepare, tmp):
    import sentencepiece
    src, files = make_inputs(tmp)
    out1 = os.path.join(tmp, "out1")
    log = run(prepare_cmd(prepare, src, out1, "--train-tokenizer", "--vocab-size", str(VOCAB),
                          "--val-fraction", "0.1", "--threads", "2"))
    for text in ["skipped 2 file(s)", "read once: 1 file(s) reached a second time", "unknown 0.000%", "byte fallback",
                 f"--set model.vocab_size={VOCAB}"]:
        if text not in log:
            sys.stderr.write(log)
            fail(f"prepare's summary lacks '{text}'")
    model = os.path.join(out1, "tokenizer.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    if sp.vocab_size() != VOCAB or sp.bos_id() != 1 or sp.eos_id() != 2 or sp.unk_id() != 0:
        fail(f"tokenizer: vocab {sp.vocab_size()}, bos/eos/unk {sp.bos_id()}/{sp.eos_id()}/{sp.unk_id()}")
    expected = []
    for f in files:
        expected += [sp.bos_id()] + sp.encode(open(f, encoding="utf-8").read()) + [sp.eos_id()]

    # Without a split the train shards are exactly the documents, in path order.
    out0 = os.path.join(tmp, "out0")
    run(prepare_cmd(prepare, src, out0, "--tokenizer", model, "--val-fraction", "0", "--threads", "3",
                    "--shard-tokens", "100000"))
    whole = shard_tokens(out0, "train")
    if os.path.exists(os.path.join(out0, "val")):
        fail("--val-fraction 0 wrote a val directory")
    if whole != expected:
        first = next((i for i, (a, b) in enumerate(zip(whole, expected)) if a != b), min(len(whole), len(expected)))
        fail(f"train tokens differ from Python sentencepiece's at token {first} ({len(whole)} vs {len(expected)})")
    n_shards = len(os.listdir(os.path.join(out0, "train")))
    print(f"shards: {len(files)} files -> {len(whole):,} tokens = BOS + Python sentencepiece ids + EOS per file, "
          f"in {n_shards} shards of <= 100,000 tokens")

    train, val = shard_tokens(out1, "train"), shard_tokens(out1, "val")
    if len(train) + len(val) != len(expected) or len(val) != round(0.1 * len(expected)):
        fail(f"split: train {len(train)} + val {len(val)}, expected {len(expected)} with val "
             f"{round(0.1 * len(expected))}")
    if sorted(train + val) != sorted(expected) or max(train + val) >= VOCAB:
        fail("train + val do not hold the same tokens as the documents")
    print(f"shards: --val-fraction 0.1 -> train {len(train):,} + val {len(val):,} tokens "
          f"({len(val) / len(expected):.4f} of {len(expected):,})")

    out2 = os.path.join(tmp, "out2")
    run(prepare_cmd(prepare, src, out2, "--tokenizer", model, "--val-fraction", "0.1", "--threads=1"))
    for split in ("train", "val"):
        for n in os.listdir(os.path.join(out1, split)):
            if open(os.path.join(out1, split, n), "rb").read() != open(os.path.join(out2, split, n), "rb").read():
                fail(f"{split}/{n} differs between 2 threads and 1 thread")
    print("shards: 1 and 2 threads write identical shards")


def check_vocab_minimum(prepare, tmp):
    """--vocab-size below what SentencePiece needs for the text is a usage error before anything is written;
    the minimum it names trains, one less does not; a failure inside SentencePiece leaves no output behind."""
    text = os.path.join(FORTUNES, "goedel")
    out = os.path.join(tmp, "vocab-out")
    cmd = [prepare, text, "--out", out, "--train-tokenizer", "--vocab-size"]
    log = run(cmd + ["100"], 2, what="--vocab-size 100")
    if "--vocab-size 100 is too small: byte fallback alone takes 259 ids" not in log or os.path.exists(out):
        fail(f"--vocab-size 100: {log.strip()} (output left: {os.path.exists(out)})")
    log = run(cmd + ["260"], 2, what="--vocab-size 260")
    prefix = f"prepare: error: --vocab-size 260 is too small for the input '{text}': SentencePiece needs at least "
    if not log.startswith(prefix) or os.path.exists(out):
        fail(f"--vocab-size 260: {log.strip()} (output left: {os.path.exists(out)})")
    least = int(log[len(prefix):].split(",")[0])
    run(cmd + [str(least - 1)], 2, what=f"--vocab-size {least - 1}")
    run(cmd + [str(least)], 0, what=f"--vocab-size {least}, the minimum named")
    # Python's sentencepiece, with prepare's settings, names the same minimum for the same text.
    import io
    import sentencepiece
    try:
        sentencepiece.SentencePieceTrainer.train(
            input=text, model_writer=io.BytesIO(), vocab_size=least - 1, model_type="bpe", byte_fallback=True,
            character_coverage=0.99995, normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True, unk_id=0,
            bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
        fail(f"Python sentencepiece trained --vocab-size {least - 1}, below the minimum prepare named")
    except RuntimeError as e:
        if f"{least - 1} vs {least}." not in str(e):
            fail(f"Python sentencepiece's minimum differs from prepare's {least}: {e}")
    print(f"errors: --vocab-size 260 refused up front naming {least} (Python sentencepiece's minimum too); "
          f"{least} trains, {least - 1} is refused")
    # Too large for the text: SentencePiece itself refuses, and the output directory it was to fill is gone.
    big = os.path.join(tmp, "big-out")
    log = run([prepare, text, "--out", big, "--train-tokenizer", "--vocab-size", "60000"], 1, what="too large")
    if "training the tokenizer (--vocab-size 60000) failed" not in log or os.path.exists(big):
        fail(f"--vocab-size 60000: {log.strip()} (output left: {os.path.exists(big)})")
    print("errors: --vocab-size 60000 fails inside SentencePiece and leaves no output directory")


def check_errors(prepare, tmp):
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    out = os.path.join(tmp, "out")
    expect_error([prepare, empty, "--out", out], f"input directory '{empty}' holds no UTF-8 text files (it is empty)",
                 what="empty folder")
    binary = os.path.join(tmp, "binary")
    os.makedirs(binary)
    open(os.path.join(binary, "x.bin"), "wb").write(b"\0\1\2" * 100)
    expect_error([prepare, binary, "--out", out], f"input directory '{binary}' holds no UTF-8 text files",
                 "1 other files skipped", what="no text files")
    missing = os.path.join(tmp, "missing")
    expect_error([prepare, missing, "--out", out], f"input '{missing}' does not exist", what="missing input")
    run([prepare, os.path.join(FORTUNES, "goedel"), "--out", out, "--train-tokenizer", "--vocab-size", "100"], 2,
        what="small vocabulary")
    check_vocab_minimum(prepare, tmp)
    not_model = os.path.join(tmp, "notes.txt")
    open(not_model, "w").write("not a model\n")
    expect_error([prepare, os.path.join(FORTUNES, "goedel"), "--out", out, "--tokenizer", not_model],
                 f"tokenizer '{not_model}' is not a SentencePiece model", what="not a model")

    text = os.path.join(FORTUNES, "goedel")
    run([prepare, text, "--out", out])
    for keep in (os.path.join(out, "notes.txt"), os.path.join(out, "train", "keep.txt")):
        open(keep, "w").write("mine\n")
    expect_error([prepare, text, "--out", out], f"--out '{out}' already holds shards",
                 os.path.join(out, "train", "train_000000.bin"), "--overwrite", what="existing shards")
    run([prepare, text, "--out", out, "--overwrite", "--val-fraction", "0"])
    left = sorted(os.listdir(os.path.join(out, "train"))) + sorted(os.listdir(out))
    if left != ["keep.txt", "train_000000.bin", "notes.txt", "train"]:
        fail(f"after --overwrite the output holds {left}")
    print("errors: --overwrite replaced the shards (val/ removed with its shard) and kept notes.txt, train/keep.txt")

    blank = os.path.join(tmp, "blank.txt")
    open(blank, "w").write("   \n\t\n\n  \r\n")
    expect_error([prepare, blank, "--out", os.path.join(tmp, "blank-out"), "--train-tokenizer", "--vocab-size", "512"],
                 f"cannot train a tokenizer on the input '{blank}': it holds no text (every line is empty or only "
                 "whitespace)", "--tokenizer PATH", what="whitespace only")
    full = os.path.join(tmp, "full")
    os.makedirs(os.path.join(full, "train"))
    tmp_shard = os.path.join(full, "train", "train_000000.bin.tmp")
    os.symlink("/dev/full", tmp_shard)
    expect_error([prepare, text, "--out", full, "--val-fraction", "0"],
                 f"writing shard '{tmp_shard}' failed: No space left on device", what="write failure")


def run_peak_rss(cmd):
    """(exit code, output, peak RSS in MB) of `cmd` alone (os.wait4: its own rusage)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return proc.returncode, out.read().decode(errors="replace"), usage.ru_maxrss / 1024


def check_long_line(prepare, tmp):
    import sentencepiece
    words = " ".join(" ".join(open(os.path.join(FORTUNES, n), encoding="utf-8").read().split("\n")) for n in TEXTS)
    line = (words + " ") * (3_000_000 // len(words) + 1)
    line = line[:3_000_000].rstrip()
    src = os.path.join(tmp, "line.txt")
    open(src, "w", encoding="utf-8").write(line)
    trained = os.path.join(tmp, "trained")
    run([prepare, src, "--out", trained, "--train-tokenizer", "--vocab-size", str(VOCAB), "--val-fraction", "0",
         "--tokenizer-sentences", "20000"], what="--train-tokenizer on one line")
    model = os.path.join(trained, "tokenizer.model")
    out = os.path.join(tmp, "out")
    code, log, rss = run_peak_rss([prepare, src, "--out", out, "--tokenizer", model, "--val-fraction", "0",
                                   "--threads", "2"])
    if code != 0:
        sys.stderr.write(log[-3000:])
        fail(f"prepare --tokenizer on one line of {len(line):,} bytes: exit {code}")
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    expected = [sp.bos_id()] + sp.encode(line) + [sp.eos_id()]
    tokens = shard_tokens(out, "train")
    if tokens != expected:
        first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), min(len(tokens), len(expected)))
        fail(f"one-line tokens differ from Python sentencepiece's at token {first} ({len(tokens)} vs {len(expected)})")
    # One SentencePiece call on the whole line needed ~120 bytes per byte (360 MB here).
    if rss > 150:
        fail(f"prepare --tokenizer on one line of {len(line) / 1e6:.1f} MB peaked at {rss:.0f} MB RSS (> 150 MB)")
    print(f"long-line: one line of {len(line) / 1e6:.1f} MB -> {len(tokens):,} tokens = Python sentencepiece's, "
          f"peak RSS {rss:.0f} MB")


def trainer_cmd(trainer, *sets):
    cmd = [trainer, "--config", "configs/llama-tiny.yaml", "--set", "train.steps=4", "--set", "logging.interval=4"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def check_trainer(prepare, trainer, ckpt, tmp):
    data = os.path.join(tmp, "data")
    log = run([prepare, os.path.join(FORTUNES, "computers"), os.path.join(FORTUNES, "cookie"), "--out", data,
               "--train-tokenizer", "--vocab-size", str(VOCAB)])
    model = os.path.join(data, "tokenizer.model")
    train_tokens = len(shard_tokens(data, "train"))
    ckdir = os.path.join(tmp, "ckpt")
    out = run(trainer_cmd(trainer, "data.kind=tokens", f"data.path={data}/train", f"data.tokenizer={model}",
                          f"model.vocab_size={VOCAB}", f"checkpoint.dir={ckdir}"), what="training on prepare's shards")
    if f"{train_tokens:,} llm.c v1 uint16 tokens" not in out or "step 4/4" not in out:
        sys.stderr.write(out)
        fail(f"the trainer did not read {train_tokens:,} tokens of prepare's shards")
    print(f"trainer: 4 steps on prepare's shards ({train_tokens:,} tokens)")

    step = os.path.join(ckdir, "step-000004")
    if open(os.path.join(step, "tokenizer.model"), "rb").read() != open(model, "rb").read():
        fail("the checkpoint's tokenizer.model differs from data.tokenizer")
    config = json.load(open(os.path.join(step, "tokenizer_config.json")))
    want = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "add_bos_token": True, "add_eos_token": False, "model_max_length": 32}
    if any(config.get(k) != v for k, v in want.items()):
        fail(f"tokenizer_config.json: {config}")
    special = json.load(open(os.path.join(step, "special_tokens_map.json")))
    if special != {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}:
        fail(f"special_tokens_map.json: {special}")
    hf = json.load(open(os.path.join(step, "config.json")))
    if hf["vocab_size"] != VOCAB:
        fail(f"config.json vocab_size {hf['vocab_size']}")
    run([ckpt, "verify", step], what="ckpt verify")
    print("trainer: the checkpoint holds tokenizer.model (identical), tokenizer_config.json, special_tokens_map.json; "
          "ckpt verify passes")

    text = os.path.join(FORTUNES, "goedel")
    out = run(trainer_cmd(trainer, "data.kind=text", f"data.path={text}", f"data.tokenizer={model}",
                          f"model.vocab_size={VOCAB}"), what="training on text with data.tokenizer")
    if f"tokens of {model} (vocab {VOCAB})" not in out or "step 4/4" not in out:
        sys.stderr.write(out)
        fail("data.kind text with data.tokenizer did not train on tokens")
    print("trainer: 4 steps on a text file encoded with data.tokenizer")

    out = run(trainer_cmd(trainer, "data.kind=text", f"data.path={text}", f"data.tokenizer={model}"),
              expect_code=1, what="vocabulary mismatch")
    msg = f"data.tokenizer '{model}' has a vocabulary of {VOCAB} tokens but model.vocab_size is 256"
    if msg not in out:
        sys.stderr.write(out)
        fail("the vocabulary mismatch error does not name the file and both sizes")
    print(f"trainer: {msg}")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    prepare, trainer, ckpt, check = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="st_prepare_") as tmp:
        if check == "shards":
            check_shards(prepare, tmp)
        elif check == "errors":
            check_errors(prepare, tmp)
        elif check == "long-line":
            check_long_line(prepare, tmp)
        elif check == "trainer":
            check_trainer(prepare, trainer, ckpt, tmp)
        else:
            fail(f"unknown check {check}")


if __name__ == "__main__":
    main()
