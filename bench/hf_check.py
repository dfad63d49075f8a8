#!/usr/bin/env python3
"""Our checkpoint in Hugging Face transformers, compared with our own forward.

    python3 bench/hf_check.py STEP_DIR --generate build/generate [--json OUT.json]
    /usr/bin/python3 bench/hf_check.py STEP_DIR --generate build/generate --reference local

STEP_DIR is a unified checkpoint saved by our trainer with F32 model weights
(fsdp.mixed_precision.param_dtype f32) and a SentencePiece tokenizer
(data.tokenizer). With --reference transformers (the default; the GPU
machine's python3 has it) the script
  - loads it with AutoTokenizer.from_pretrained and
    AutoModelForCausalLM.from_pretrained(dtype float32) exactly as a user
    would, recording every warning transformers prints or raises;
  - checks that the loaded weights equal our model-*.safetensors bit for bit;
  - encodes each prompt with both tokenizers as their users call them
    (`tokenizer(prompt)`, BOS first; generate's default), ids must match;
  - runs transformers' forward on one batch (the prompts cut to the shortest
    one's length) and compares every logit with what `generate --logits`
    wrote from our forward, within an F32 bound;
  - compares a greedy continuation: transformers' model.generate against
    `generate --temperature 0`, and the decoded text of both tokenizers.
--reference local swaps transformers for tests/reference/torch_llama.py's
HF-structured model (PyTorch 1.13 is enough), to try this script where
transformers is missing; the tokenizer checks are then skipped.

Prints one line per check and a JSON summary (also to --json); exits 1 when a
check fails, 2 when the reference cannot be loaded.
"""
import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from torch_llama import read_safetensors as read_tensors  # noqa: E402
PROMPTS = [
    "The checkpoint is written by every rank",
    "To resume a run on another number of ranks,",
    "shardtrain is a from-scratch trainer for",
    "The configuration file sets the model and",
]
# Our forward and the reference sum in different orders; in F32 the logits of
# a small model agree to a few units in the 6th digit of the largest logit.
LOGIT_TOLERANCE = 1e-4


def read_safetensors(path):
    """{name: numpy array} of a safetensors file, by the tests' reader of the published format."""
    return {name: t.numpy() for name, t in read_tensors(path)[1].items()}


def model_weights(step_dir):
    with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for file in files:
        state.update(read_safetensors(os.path.join(step_dir, file)))
    return state


def ours(generate, step_dir, prompt, new_tokens, tmp):
    """generate's prompt ids, logits [T, V] and greedy continuation for `prompt`."""
    logits_path = os.path.join(tmp, "logits.safetensors")
    cmd = [generate, "--checkpoint", step_dir, "--prompt", prompt, "--temperature", "0", "--max-new-tokens",
           str(new_tokens), "--json", "--logits", logits_path]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    t = read_safetensors(logits_path)
    if t["input_ids"].tolist() != out["prompt_ids"]:
        raise RuntimeError("generate --logits wrote other input_ids than --json's prompt_ids")
    return out, t["logits"]


class Recorder(logging.Handler):
    """Keeps every record transformers logs at WARNING and above."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(f"{record.name}: {record.getMessage()}")


def load_transformers(step_dir, notes):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recorder = Recorder()
    transformers.logging.set_verbosity_warning()
    transformers.logging.disable_default_handler()
    transformers.logging.add_handler(recorder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokenizer = AutoTokenizer.from_pretrained(step_dir)
        try:
            model = AutoModelForCausalLM.from_pretrained(step_dir, dtype=torch.float32)
        except TypeError:  # transformers before 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(step_dir, torch_dtype=torch.float32)
    notes["transformers"] = transformers.__version__
    notes["tokenizer_class"] = type(tokenizer).__name__
    notes["model_class"] = type(model).__name__
    notes["warnings"] = recorder.messages + [f"{w.category.__name__}: {w.message}" for w in caught]
    model.eval()
    return tokenizer, model, recorder


def load_local(step_dir, notes):
    from torch_llama import LlamaForCausalLM

    with open(os.path.join(step_dir, "config.json")) as f:
        config = json.load(f)
    model = LlamaForCausalLM(config)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model_weights(step_dir).items()}, strict=True)
    notes["model_class"] = "tests/reference/torch_llama.py LlamaForCausalLM"
    notes["warnings"] = []
    return None, model.eval()


def forward_logits(model, batch, reference):
    with torch.no_grad():
        out = model(torch.tensor(batch))
    return (out.logits if reference == "transformers" else out).float().numpy()


def greedy(model, ids, new_tokens, eos, reference):
    """The reference's greedy continuation of `ids` (ending at eos, like ours)."""
    with torch.no_grad():
        if reference == "transformers":
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos)
            return out[0, len(ids):].tolist()
        seq = list(ids)
        while len(seq) - len(ids) < new_tokens:
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
            if seq[-1] == eos:
                break
        return seq[len(ids):]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step_dir")
    ap.add_argument("--generate", required=True, help="our generate binary")
    ap.add_argument("--reference", choices=["transformers", "local"], default="transformers")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--json", help="also write the summary here")
    a = ap.parse_args()

    notes = {"step_dir": a.step_dir, "reference": a.reference, "checks": {}}
    failures = []

    def check(name, ok, detail):
        notes["checks"][name] = {"ok": bool(ok), "detail": detail}
        print(f"hf_check: {'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    try:
        if a.reference == "transformers":
            tokenizer, model, recorder = load_transformers(a.step_dir, notes)
        else:
            tokenizer, model = load_local(a.step_dir, notes)
            recorder = None
    except Exception as e:  # noqa: BLE001 - any failure to load is the finding
        print(f"hf_check: FAIL load: {type(e).__name__}: {e}")
        notes["load_error"] = f"{type(e).__name__}: {e}"
        if a.json:
            with open(a.json, "w") as f:
                json.dump(notes, f, indent=1)
        return 2
    print(f"hf_check: loaded {notes['model_class']} ({sum(p.numel() for p in model.parameters()):,} parameters)"
          f"{' with ' + notes['tokenizer_class'] if tokenizer is not None else ''}"
          f"{', transformers ' + notes['transformers'] if 'transformers' in notes else ''}")
    for w in notes["warnings"]:
        print(f"hf_check: warning: {w}")

    # The weights transformers holds are the checkpoint's model-* tensors, unchanged.
    ours_state = model_weights(a.step_dir)
    theirs = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    differ = [k for k, v in ours_state.items() if k not in theirs or not np.array_equal(theirs[k], v)]
    check("weights", not differ, f"{len(ours_state)} tensors of model-*.safetensors "
          f"{'equal the loaded ones bit for bit' if not differ else 'differ: ' + ', '.join(differ[:5])}")

    eos = 2
    config = json.load(open(os.path.join(a.step_dir, "config.json")))
    eos = config.get("eos_token_id", eos)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [ours(a.generate, a.step_dir, p, a.new_tokens, tmp) for p in PROMPTS]

    # Tokenizers: the same ids for each prompt, the same text for each continuation.
    if tokenizer is not None:
        for prompt, (out, _) in zip(PROMPTS, runs):
            hf_ids = tokenizer(prompt)["input_ids"]  # as a user calls it: BOS first (add_bos_token), as generate
            check(f"tokenize {prompt[:24]!r}", hf_ids == out["prompt_ids"],
                  f"{len(hf_ids)} ids" + ("" if hf_ids == out["prompt_ids"] else f": ours {out['prompt_ids']}, "
                                                                                  f"transformers {hf_ids}"))

    # One batch: the prompts cut to the shortest one's length (causal: a prefix's logits do not change).
    t = min(len(out["prompt_ids"]) for out, _ in runs)
    batch = [out["prompt_ids"][:t] for out, _ in runs]
    ref = forward_logits(model, batch, a.reference)  # [B, t, V]
    got = np.stack([logits[:t] for _, logits in runs])
    scale = float(np.abs(ref).max())
    err = float(np.abs(got - ref).max())
    notes["logits"] = {"batch": len(batch), "tokens": t, "vocab": int(ref.shape[-1]), "max_abs_diff": err,
                       "max_abs_logit": scale, "relative": err / max(scale, 1e-30)}
    check("logits", err <= LOGIT_TOLERANCE * max(scale, 1.0),
          f"batch {len(batch)} x {t} tokens x {ref.shape[-1]} logits: max |ours - reference| {err:.2e}, "
          f"{err / max(scale, 1e-30):.2e} of the largest |logit| {scale:.2f} (bound {LOGIT_TOLERANCE:.0e})")

    # Greedy continuations.
    for prompt, (out, logits) in zip(PROMPTS, runs):
        want = greedy(model, out["prompt_ids"], a.new_tokens, eos, a.reference)
        got_ids = out["ids"]
        same = got_ids == want
        detail = f"{len(got_ids)} new ids {'equal' if same else 'differ'}"
        if not same:
            first = next((i for i, (x, y) in enumerate(zip(got_ids, want)) if x != y), min(len(got_ids), len(want)))
            detail += f" from position {first}: ours {got_ids}, reference {want}"
        if tokenizer is not None:
            hf_text = tokenizer.decode(got_ids, skip_special_tokens=True)
            detail += f"; text {out['text']!r}" + ("" if hf_text.strip() == out["text"].strip() else
                                                   f" vs transformers' decode {hf_text!r}")
        check(f"greedy {prompt[:24]!r}", same, detail)
        notes.setdefault("samples", []).append({"prompt": prompt, "ours": out["text"], "ids": got_ids,
                                                "reference_ids": want})

    if recorder is not None:  # warnings raised while running, not only while loading
        notes["warnings"] += [m for m in recorder.messages if m not in notes["warnings"]]
    notes["failures"] = failures
    text = json.dumps(notes, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(f"hf_check: {'all checks passed' if not failures else 'FAILED: ' + ', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
