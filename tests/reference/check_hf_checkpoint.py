#!/usr/bin/env python3
"""A unified checkpoint read the way Hugging Face reads one, by code that is not ours.

    check_hf_checkpoint.py TRAINER

Trains llama-tiny on a text file (2 ranks, FULL_SHARD, BF16 weights) with a
unified checkpoint at the end. Then, with the standard library, numpy and
PyTorch only:
  - builds the Hugging Face-structured LlamaForCausalLM of torch_llama.py from
    the checkpoint's config.json alone (the fields LlamaConfig defines);
  - reads model.safetensors.index.json, parses each model-* file from the
    published format (no reader of ours), and loads the weights with
    load_state_dict(strict=True): every Hugging Face name and shape must match,
    nothing missing, nothing extra;
  - checks the files' "__metadata__" {"format": "pt"} (transformers refuses
    safetensors files without it) and the index's total_size;
  - evaluates the loaded model on windows of the text: its mean cross-entropy
    must be below the file's unigram byte entropy (only a model that uses
    context gets there; the same model with fresh weights is at ~ln 256 = 5.5).
Exits 1 on a failure, 77 (CTest: skipped) without torch/numpy.
"""
import collections
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy  # noqa: F401 (torch_llama reads safetensors with it)
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"check_hf_checkpoint.py: skipped, {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import ROOT, TEXT, fail, mpirun  # noqa: E402
from torch_llama import LlamaForCausalLM, read_safetensors  # noqa: E402


def main():
    trainer = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        cmd = mpirun(2) + [trainer, "--config", "configs/llama-tiny.yaml", "--set", "data.kind=text", "--set", f"data.path={TEXT}",
                "--set", f"checkpoint.dir={ckpt}"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            fail("training failed")
        with open(os.path.join(ckpt, "latest")) as f:
            step_dir = os.path.join(ckpt, f.read().strip())
        with open(os.path.join(step_dir, "config.json")) as f:
            config = json.load(f)
        with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
            index = json.load(f)

        state = {}
        total = 0
        for file in sorted(set(index["weight_map"].values())):
            meta, tensors = read_safetensors(os.path.join(step_dir, file))
            if meta.get("format") != "pt":
                fail(f"{file}: __metadata__ {meta} lacks format=pt")
            for name, t in tensors.items():
                if index["weight_map"].get(name) != file:
                    fail(f"{file} holds {name}, which the index places in {index['weight_map'].get(name)}")
                state[name] = t
                total += t.numel() * (2 if config["torch_dtype"] == "bfloat16" else 4)
        if total != index["metadata"]["total_size"]:
            fail(f"index total_size {index['metadata']['total_size']} != {total} bytes of tensors")

        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        fresh = LlamaForCausalLM(config)
        missing, unexpected = model.load_state_dict(state, strict=True)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"hf: config.json {config['architectures']} {config['torch_dtype']}: {len(state)} tensors, "
              f"{n_params} parameters, load_state_dict(strict=True) ok; total_size {total} bytes")

        data = open(TEXT, "rb").read()
        counts = collections.Counter(data)
        entropy = -sum(c / len(data) * math.log(c / len(data)) for c in counts.values())
        seq = 32
        starts = range(0, len(data) - seq - 1, (len(data) - seq - 1) // 64)
        tokens = torch.tensor([list(data[s:s + seq]) for s in starts], dtype=torch.long)
        targets = torch.tensor([list(data[s + 1:s + seq + 1]) for s in starts], dtype=torch.long)
        with torch.no_grad():
            losses = [F.cross_entropy(m(tokens).reshape(-1, config["vocab_size"]), targets.reshape(-1)).item()
                      for m in (model, fresh)]
        print(f"hf: mean cross-entropy on {len(starts)} windows of the text: loaded {losses[0]:.3f}, "
              f"fresh weights {losses[1]:.3f}; the file's unigram byte entropy {entropy:.3f}")
        if not losses[0] < entropy < losses[1]:
            fail("the loaded model does not beat the unigram entropy (or fresh weights do)")


if __name__ == "__main__":
    main()
