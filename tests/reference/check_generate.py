#!/usr/bin/env python3
"""build/generate end to end: trained checkpoints in, token ids out.

    check_generate.py GENERATE TRAINER CHECK

CHECK is one of:
  greedy-torch  A SentencePiece model (spm_train, vocab 512) on fortunes text,
                the text encoded into a tokens file, llama-tiny (128
                positions) trained on it in F32 (one process, unified
                checkpoint, the tokenizer copied in as tokenizer.model): for
                100 steps of 64 tokens, and for 3 steps from a wide init
                (varied tokens). For a short prompt (100 new tokens, past
                position 64) and three passages of the text (20 each), the
                ids of `generate --temperature 0` must be the ones a greedy decode in
                PyTorch picks (tests/reference/torch_llama.py's LLaMA, loading
                model-*.safetensors, recomputing the whole prefix each step):
                the same ids, or a first difference at a near-tie (top-2
                logits within 1e-4 in torch), reported. Both encode the
                prompt as a Hugging Face LlamaTokenizer with add_bos_token
                true does: BOS, then SentencePiece's ids (the trained
                model's directory holds a tokenizer_config.json saying so;
                the other has none, where generate follows training's BOS
                framing). The decoded text must be SentencePiece's. `--logits FILE`
                must hold the prompt's ids and, at every position, the logits
                of torch's forward within LOGITS_BOUND of the largest one.
  sharded       llama-tiny (BF16 compute, F32 masters) trained twice from one
                config: 2 ranks saving the sharded layout, 1 rank saving the
                unified one (found with --checkpoint auto --config FILE), every
                rank at one thread (results are fixed for a world size and a
                thread count, docs/DESIGN.md; oneDNN's GEMMs on some CPUs sum
                in another order at two threads). Both must give the same ids, greedy and sampled (same seed; another
                seed gives other ids); a Hugging Face copy of the unified one
                (config.json + model-* BF16 only) generates too.
  errors        A prompt longer than max_position_embeddings (both numbers
                named), a prompt that runs into the limit (a note, exit 0, the
                tokens that fit), a missing and an incomplete checkpoint (the
                directory named), a tokenizer of another vocabulary size (both
                sizes named), bad options (the option named); the default
                threads (1 for llama-tiny's hidden size 64) on the start-up line.
  prompt        A checkpoint of llama-tiny (vocabulary 300) trained on text
                with a SentencePiece data.tokenizer, which the trainer copies
                in with a tokenizer_config.json (add_bos_token true): the
                prompt's ids are BOS + SentencePiece's, the start-up line
                names that file; --no-bos, add_bos_token false beside
                --tokenizer FILE, and no file beside it (BOS: training's
                framing) each give the ids and line stated; a non-boolean
                add_bos_token is an error naming the file. --num-samples 3:
                three JSON lines, seeds S..S+2, each sample's ids those of a
                single run with that seed; streamed, each after its `---
                sample K of 3 (seed ...) ---` line, the whole stdout exact.
                --prompt-file: the same ids as --prompt with the file's text;
                a missing file, a non-UTF-8 one and an empty one with
                --no-bos are errors naming it; --prompt with --prompt-file is
                a usage error (exit 2); an empty file with BOS continues BOS.

Exits 1 on a failure, 77 (CTest: skipped) without torch or sentencepiece.
"""
import json
import os
import shutil
import sys
import tempfile

try:
    import numpy as np
    import sentencepiece as spm
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"check_generate.py: skipped, {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import ROOT, fail, mpirun, run  # noqa: E402
from torch_llama import LlamaForCausalLM, read_safetensors  # noqa: E402

FORTUNES = ["/usr/share/games/fortunes/cookie", "/usr/share/games/fortunes/computers"]  # 483 KB of English
NEAR_TIE = 1e-4
NEW_TOKENS = 100  # past position 64: the CPU attention's second key tile
LOGITS_BOUND = 1e-4  # F32 forwards that sum in other orders agree to ~1e-6 of the largest logit


def train(trainer, sets, np_=1, config="configs/llama-tiny.yaml"):
    cmd = []
    if np_ > 1:
        cmd = mpirun(np_)
    cmd += [trainer, "--config", config, "--set", "logging.interval=20"]
    for s in sets:
        cmd += ["--set", s]
    return run(cmd)


def generate(gen, args, expect_ok=True):
    proc = run([gen, "--json"] + args, expect_ok)
    if not expect_ok:
        return proc
    lines = proc.stdout.strip().splitlines()
    if len(lines) != 1:
        fail(f"--json printed {len(lines)} lines: {proc.stdout[:500]}")
    return json.loads(lines[0]), proc.stderr


def latest(root):
    with open(os.path.join(root, "latest")) as f:
        return os.path.join(root, f.read().strip())


# --- greedy-torch --------------------------------------------------------------------

def torch_model(step_dir):
    with open(os.path.join(step_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for file in files:
        state.update(read_safetensors(os.path.join(step_dir, file))[1])
    model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=True)
    if config["torch_dtype"] != "float32":
        fail(f"{step_dir}: model-* are {config['torch_dtype']}, the comparison needs float32")
    return model.eval(), config


def torch_greedy(model, prompt, new_tokens, context, eos):
    """Greedy decode recomputing the whole prefix; returns (ids, the top-2 gap at each step)."""
    ids, gaps = list(prompt), []
    with torch.no_grad():
        while len(ids) - len(prompt) < new_tokens and len(ids) < context:
            logits = model(torch.tensor([ids]))[0, -1]
            top = torch.topk(logits, 2)
            gaps.append((top.values[0] - top.values[1]).item())
            ids.append(int(top.indices[0]))
            if ids[-1] == eos:
                break
    return ids[len(prompt):], gaps


def prepare_tokens(tmp):
    text = b"".join(open(p, "rb").read() for p in FORTUNES)
    with open(os.path.join(tmp, "fortunes.txt"), "wb") as f:
        f.write(text)
    run(["spm_train", f"--input={tmp}/fortunes.txt", f"--model_prefix={tmp}/tok", "--vocab_size=512",
         "--model_type=unigram", "--character_coverage=1.0", "--byte_fallback=true",
         "--normalization_rule_name=identity", "--remove_extra_whitespaces=false", "--minloglevel=2"])
    sp = spm.SentencePieceProcessor(model_file=f"{tmp}/tok.model")
    ids = np.array(sp.encode(text.decode("utf-8", errors="replace")), dtype=np.uint16)
    ids.tofile(f"{tmp}/fortunes.bin")  # raw uint16 tokens: data.token_format headerless
    return sp, len(ids)


def compare_logits(path, model, prompt_ids):
    """generate --logits' file against torch's forward over the same ids."""
    tensors = read_safetensors(path)[1]
    if tensors["input_ids"].tolist() != prompt_ids:
        fail(f"{path}: input_ids {tensors['input_ids'].tolist()} != the prompt's {prompt_ids}")
    with torch.no_grad():
        want = model(torch.tensor([prompt_ids]))[0]
    got = tensors["logits"]
    if got.shape != want.shape:
        fail(f"{path}: logits of shape {list(got.shape)}, torch's are {list(want.shape)}")
    err = (got - want).abs().max().item() / want.abs().max().item()
    if not err <= LOGITS_BOUND:
        fail(f"--logits: {err:.2e} of the largest logit away from torch's forward (bound {LOGITS_BOUND})")
    return err


def hf_encode(sp, text):
    """A prompt's ids as Hugging Face's LlamaTokenizer (add_bos_token true, add_eos_token false) gives them."""
    return [sp.bos_id()] + sp.encode(text)


def compare_greedy(gen, step_dir, sp, model, config, prompt, new_tokens):
    """generate's greedy ids (and --logits) for `prompt` against PyTorch's; returns the ids."""
    logits_path = os.path.join(os.path.dirname(os.path.dirname(step_dir)), "logits.safetensors")
    out, err = generate(gen, ["--checkpoint", step_dir, "--prompt", prompt, "--temperature", "0",
                              "--max-new-tokens", str(new_tokens), "--logits", logits_path])
    print(f"greedy-torch: {prompt[-40:]!r} -> {out['text'][:80]!r}")
    want_prompt = hf_encode(sp, prompt)
    if out["prompt_ids"] != want_prompt:
        fail(f"prompt ids {out['prompt_ids']} != Hugging Face's encoding (BOS + SentencePiece's) {want_prompt}")
    logits_err = compare_logits(logits_path, model, out["prompt_ids"])
    print(f"greedy-torch:   --logits: {len(out['prompt_ids'])} positions within {logits_err:.1e} of the largest "
          f"logit of torch's forward")
    if out["text"].lstrip(" ") != sp.decode(out["ids"]).lstrip(" "):
        fail(f"text {out['text']!r} != SentencePiece's decode {sp.decode(out['ids'])!r}")
    want, gaps = torch_greedy(model, want_prompt, new_tokens, config["max_position_embeddings"], sp.eos_id())
    got = out["ids"]
    if got == want:
        print(f"greedy-torch:   {len(got)} ids equal PyTorch's greedy decode (smallest top-2 gap {min(gaps):.2e}; "
              f"stop: {out['stop']}; {err.strip().splitlines()[-1]})")
        return got
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    if first < len(gaps) and gaps[first] < NEAR_TIE:
        print(f"greedy-torch:   ids equal up to step {first}, where torch's top two logits are {gaps[first]:.1e} apart")
        return got
    fail(f"ids differ from step {first}: ours {got}, torch {want}")


def fortunes_checkpoint(trainer, tmp, name, sets, hf_tokenizer_config):
    """llama-tiny (vocab 512, 128 positions, F32) trained on the tokens file; its checkpoint with tokenizer.model
    (and, when `hf_tokenizer_config`, a tokenizer_config.json as Hugging Face's LlamaTokenizer writes it)."""
    root = os.path.join(tmp, name)
    train(trainer, ["model.vocab_size=512", "model.max_position_embeddings=128", "train.seq_len=64",
                    "data.kind=tokens", "data.token_format=headerless", f"data.path={tmp}/fortunes.bin",
                    "fsdp.mixed_precision.param_dtype=f32",
                    "fsdp.activation_checkpointing.mode=none", f"checkpoint.dir={root}", "checkpoint.interval=0"] + sets)
    step_dir = latest(root)
    shutil.copy(f"{tmp}/tok.model", os.path.join(step_dir, "tokenizer.model"))
    if hf_tokenizer_config:
        with open(os.path.join(step_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False}, f)
    return step_dir


def check_greedy_torch(gen, trainer, tmp):
    sp, n_tokens = prepare_tokens(tmp)
    text = open(f"{tmp}/fortunes.txt", encoding="utf-8", errors="replace").read()
    print(f"greedy-torch: {n_tokens} tokens of fortunes (SentencePiece, vocab 512)")
    # Trained for 100 steps (its greedy text soon repeats itself), and barely
    # trained from a wide init (init_std 0.25: spread logits, varied tokens).
    ids = []
    for name, sets in [("trained", ["train.steps=100"]), ("wide", ["train.steps=3", "model.init_std=0.25"])]:
        step_dir = fortunes_checkpoint(trainer, tmp, name, sets, hf_tokenizer_config=name == "trained")
        model, config = torch_model(step_dir)
        print(f"greedy-torch: model {name} ({', '.join(sets)})")
        # A short prompt run past position 64, and passages of the text, whose prefill covers varied contexts.
        ids += compare_greedy(gen, step_dir, sp, model, config, "The computer", NEW_TOKENS)
        for start in (1000, 200000, 400000):
            ids += compare_greedy(gen, step_dir, sp, model, config, text[start:start + 150], 20)
    print(f"greedy-torch: {len(ids)} ids compared, {len(set(ids))} distinct")
    if len(set(ids)) < 50:
        fail("fewer than 50 distinct ids: the comparison saw too little")


# --- sharded -------------------------------------------------------------------------

def check_sharded(gen, trainer, tmp):
    sharded, unified = os.path.join(tmp, "sharded"), os.path.join(tmp, "unified")
    config = os.path.join(tmp, "tiny.yaml")
    with open(os.path.join(ROOT, "configs/llama-tiny.yaml")) as f:
        text = f.read()
    if 'dir: ""' not in text:
        fail("configs/llama-tiny.yaml has no `dir: \"\"` line to point at a temp dir")
    with open(config, "w") as f:
        f.write(text.replace('dir: ""', f'dir: "{unified}"', 1))
    common = ["data.kind=text", "data.path=/usr/share/common-licenses/GPL-3", "train.steps=40", "checkpoint.interval=0",
              "train.threads=1"]
    train(trainer, common + ["checkpoint.format=sharded", f"checkpoint.dir={sharded}"], np_=2)
    train(trainer, common, config=config)
    prompt = ["--prompt", "the GNU "]
    runs = {}
    for name, where in [("sharded", ["--checkpoint", sharded]), ("unified", ["--checkpoint", "auto", "--config", config])]:
        for mode, opts in [("greedy", ["--temperature", "0"]), ("seed5", ["--temperature", "0.8", "--seed", "5"]),
                           ("seed6", ["--temperature", "0.8", "--seed", "6"])]:
            runs[name, mode] = generate(gen, where + prompt + opts)[0]
    for mode in ["greedy", "seed5", "seed6"]:
        a, b = runs["sharded", mode], runs["unified", mode]
        print(f"sharded: {mode}: 2-rank sharded {a['text']!r}, 1-rank unified {b['text']!r}")
        if a["ids"] != b["ids"] or not a["ids"]:
            fail(f"{mode}: sharded ids {a['ids']} != unified ids {b['ids']}")
    if runs["unified", "seed5"]["ids"] == runs["unified", "seed6"]["ids"]:
        fail("seeds 5 and 6 gave the same sampled ids")
    hf = os.path.join(tmp, "hf")
    os.makedirs(hf)
    step_dir = latest(unified)
    for name in os.listdir(step_dir):
        if name.startswith("model") or name == "config.json":
            shutil.copy(os.path.join(step_dir, name), hf)
    out, err = generate(gen, ["--checkpoint", hf] + prompt + ["--temperature", "0"])
    print(f"sharded: Hugging Face copy (BF16 model-*): {out['text']!r}")
    if len(out["ids"]) != 32 - len(out["prompt_ids"]) or out["stop"] != "max_position_embeddings":
        fail(f"the Hugging Face copy generated {len(out['ids'])} ids, stop {out['stop']}")


# --- errors --------------------------------------------------------------------------

def expect_error(gen, args, *parts, code=1):
    """An error line naming `parts`; exit `code` (2: a mistake on the command line)."""
    proc = run([gen] + args, expect_ok=False)
    line = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    if proc.returncode != code or not line.startswith("generate: error:") or not all(p in line for p in parts):
        fail(f"{args}: exit {proc.returncode}, stderr {proc.stderr!r}; expected an error naming {parts}")
    print(f"errors: {line}")


def check_errors(gen, trainer, tmp):
    root = os.path.join(tmp, "ck")
    train(trainer, ["train.steps=4", f"checkpoint.dir={root}", "checkpoint.interval=0"])
    step_dir = latest(root)
    expect_error(gen, ["--checkpoint", step_dir, "--prompt", "x" * 40], "40", "32", "max_position_embeddings")
    out, err = generate(gen, ["--checkpoint", step_dir, "--prompt", "x" * 30, "--max-new-tokens", "10"])
    if len(out["ids"]) != 2 or out["stop"] != "max_position_embeddings" or "note: stopped after 2 of 10" not in err:
        fail(f"a prompt of 30 bytes with 10 new tokens: {out}, stderr {err!r}")
    missing = os.path.join(tmp, "nowhere")
    expect_error(gen, ["--checkpoint", missing, "--prompt", "a"], missing)
    expect_error(gen, ["--checkpoint", "auto", "--root", missing, "--prompt", "a"], missing)
    broken = os.path.join(tmp, "broken")
    shutil.copytree(step_dir, broken)
    os.remove(os.path.join(broken, "COMPLETE"))
    expect_error(gen, ["--checkpoint", broken, "--prompt", "a"], broken, "incomplete")
    run(["spm_train", f"--input={FORTUNES[0]}", f"--model_prefix={tmp}/tok", "--vocab_size=300",
         "--model_type=unigram", "--minloglevel=2"])
    expect_error(gen, ["--checkpoint", step_dir, "--prompt", "a", "--tokenizer", f"{tmp}/tok.model"], "300", "256")
    expect_error(gen, ["--checkpoint", step_dir, "--prompt", "a", "--top-p", "0"], "--top-p 0", code=2)
    expect_error(gen, ["--checkpoint", step_dir, "--prompt", "a", "--temperature", "hot"], "--temperature hot", code=2)
    expect_error(gen, ["--prompt", "a"], "--checkpoint", code=2)
    for threads, said in ((None, 1), ("2", 2)):
        extra = ["--threads", threads] if threads else []
        err = generate(gen, ["--checkpoint", step_dir, "--prompt", "a", "--max-new-tokens", "1"] + extra)[1]
        want = f"(123712 parameters, tokenizer bytes, {said} thread(s)); prompt: no BOS (the tokenizer has none)"
        if want not in err:
            fail(f"--threads {threads or 'default'}: the start-up line does not say '{want}': {err!r}")
    print("errors: llama-tiny (hidden size 64) runs on 1 thread by default, on 2 with --threads 2")


# --- prompt --------------------------------------------------------------------------

def startup_line(err):
    return next((ln for ln in err.splitlines() if "parameters, tokenizer" in ln), "")


def check_bos(gen, step_dir, sp, tmp):
    """The BOS rules: the checkpoint's tokenizer_config.json, --no-bos, a config beside --tokenizer, none."""
    prompt = "The computer is"
    bare = sp.encode(prompt)
    own = os.path.join(step_dir, "tokenizer_config.json")
    with open(own) as f:
        if json.load(f)["add_bos_token"] is not True:
            fail(f"{own} does not say add_bos_token: true")
    beside = os.path.join(tmp, "beside")
    os.makedirs(beside)
    shutil.copy(f"{tmp}/tok.model", beside)
    alone = os.path.join(tmp, "alone")
    os.makedirs(alone)
    shutil.copy(f"{tmp}/tok.model", alone)
    with open(os.path.join(beside, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False}, f)
    cases = [([], [sp.bos_id()] + bare, f"BOS first ({own}: add_bos_token true)"),
             (["--no-bos"], bare, "no BOS (--no-bos)"),
             (["--tokenizer", f"{beside}/tok.model"], bare,
              f"no BOS ({beside}/tokenizer_config.json: add_bos_token false)"),
             (["--tokenizer", f"{alone}/tok.model"], [sp.bos_id()] + bare,
              "BOS first (training's framing; no tokenizer_config.json)")]
    for extra, ids, rule in cases:
        out, err = generate(gen, ["--checkpoint", step_dir, "--prompt", prompt, "--max-new-tokens", "3"] + extra)
        if out["prompt_ids"] != ids or not startup_line(err).endswith(f"prompt: {rule}"):
            fail(f"{extra}: prompt_ids {out['prompt_ids']} (expected {ids}), start-up line {startup_line(err)!r} "
                 f"(expected to end 'prompt: {rule}')")
        print(f"prompt: {' '.join(extra) or 'the checkpoint as saved'}: {ids[:4]}...: {rule}")
    with open(os.path.join(beside, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": "yes"}, f)
    expect_error(gen, ["--checkpoint", step_dir, "--prompt", "a", "--tokenizer", f"{beside}/tok.model"],
                 f"{beside}/tokenizer_config.json: add_bos_token is \"yes\", expected true or false")


def check_samples(gen, step_dir):
    """--num-samples 3: seeds S..S+2, each what a single run with that seed gives; the stream's exact form."""
    base = ["--checkpoint", step_dir, "--prompt", "The", "--max-new-tokens", "8", "--temperature", "1.0"]
    proc = run([gen, "--json", "--num-samples", "3", "--seed", "5"] + base)
    lines = [json.loads(ln) for ln in proc.stdout.strip().splitlines()]
    if [ln["seed"] for ln in lines] != [5, 6, 7]:
        fail(f"--num-samples 3 --seed 5 --json: seeds {[ln['seed'] for ln in lines]}, expected [5, 6, 7]")
    for line in lines:
        single = generate(gen, base + ["--seed", str(line["seed"])])[0]
        if single["ids"] != line["ids"]:
            fail(f"sample with seed {line['seed']}: {line['ids']}, a single run with that seed {single['ids']}")
    if len({tuple(ln["ids"]) for ln in lines}) < 2:
        fail("three seeds gave the same sample")
    streamed = run([gen, "--num-samples", "3", "--seed", "5"] + base)
    want = "".join(f"--- sample {k + 1} of 3 (seed {ln['seed']}) ---\nThe{ln['text']}\n" for k, ln in enumerate(lines))
    if streamed.stdout != want:
        fail(f"--num-samples 3 printed {streamed.stdout!r}, expected {want!r}")
    said = [ln for ln in streamed.stderr.splitlines() if ln.startswith("generate: sample ")]
    prefixes = [f"generate: sample {k} of 3 (seed {seed}): 8 tokens in " for k, seed in ((1, 5), (2, 6), (3, 7))]
    if len(said) != 3 or not all(ln.startswith(p) for ln, p in zip(said, prefixes)):
        fail(f"--num-samples 3: stderr lines {said}")
    print(f"prompt: --num-samples 3 --seed 5: seeds 5, 6, 7, each a single run's ids; stdout exactly "
          f"{len(want.splitlines())} lines with the separators")


def check_prompt_file(gen, step_dir, tmp):
    """--prompt-file: the file's text is the prompt; errors name the file."""
    path = os.path.join(tmp, "prompt.txt")
    with open(path, "w") as f:
        f.write("The computer\nis")
    from_file = generate(gen, ["--checkpoint", step_dir, "--prompt-file", path, "--temperature", "0"])[0]
    inline = generate(gen, ["--checkpoint", step_dir, "--prompt", "The computer\nis", "--temperature", "0"])[0]
    if from_file["prompt_ids"] != inline["prompt_ids"] or from_file["ids"] != inline["ids"]:
        fail(f"--prompt-file gave {from_file}, --prompt with its text {inline}")
    missing = os.path.join(tmp, "no-such-prompt.txt")
    expect_error(gen, ["--checkpoint", step_dir, "--prompt-file", missing],
                 f"cannot open prompt file '{missing}': No such file or directory")
    binary = os.path.join(tmp, "binary.txt")
    with open(binary, "wb") as f:
        f.write(b"ok \xff\xfe")
    expect_error(gen, ["--checkpoint", step_dir, "--prompt-file", binary],
                 f"prompt file '{binary}' is not UTF-8 text: an invalid byte at offset 3")
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    expect_error(gen, ["--checkpoint", step_dir, "--prompt-file", empty, "--no-bos"],
                 f"the prompt (file '{empty}') is empty, and with no BOS (--no-bos) there is nothing to continue")
    expect_error(gen, ["--checkpoint", step_dir, "--prompt-file", path, "--prompt", "x"],
                 f"--prompt and --prompt-file {path} both given: give one", code=2)
    out = generate(gen, ["--checkpoint", step_dir, "--prompt-file", empty, "--max-new-tokens", "4"])[0]
    if out["prompt_ids"] != [1] or len(out["ids"]) != 4:
        fail(f"an empty prompt file with BOS: {out}")
    print("prompt: --prompt-file gives --prompt's ids; missing, non-UTF-8, empty without BOS and with --prompt refused")


def check_prompt(gen, trainer, tmp):
    run(["spm_train", f"--input={FORTUNES[0]}", f"--model_prefix={tmp}/tok", "--vocab_size=300",
         "--model_type=unigram", "--minloglevel=2"])
    sp = spm.SentencePieceProcessor(model_file=f"{tmp}/tok.model")
    root = os.path.join(tmp, "ck")
    train(trainer, ["train.steps=4", f"checkpoint.dir={root}", "checkpoint.interval=0", "model.vocab_size=300",
                    "data.kind=text", f"data.path={FORTUNES[0]}", f"data.tokenizer={tmp}/tok.model"])
    step_dir = latest(root)
    check_bos(gen, step_dir, sp, tmp)
    check_samples(gen, step_dir)
    check_prompt_file(gen, step_dir, tmp)


CHECKS = {"greedy-torch": check_greedy_torch, "sharded": check_sharded, "errors": check_errors,
          "prompt": check_prompt}


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in CHECKS:
        sys.exit(f"usage: check_generate.py GENERATE TRAINER {'|'.join(CHECKS)}")
    gen, trainer = (os.path.abspath(p) for p in sys.argv[1:3])
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        CHECKS[sys.argv[3]](gen, trainer, tmp)
    print(f"check_generate.py {sys.argv[3]}: passed")


if __name__ == "__main__":
    main()
