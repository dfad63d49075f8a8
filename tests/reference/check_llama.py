#!/usr/bin/env python3
"""Cross-check of st::models::Llama against a plain-PyTorch LLaMA.

    check_llama.py TORCH_REF_DUMP      # runs the dump tool into a temp dir, then checks
    check_llama.py --dir DIR           # checks an existing dump (DIR/manifest.json)

The dump (tests/reference/dump_llama.cpp) holds, for an untied and a tied
tiny LLaMA, the initial weights under their Hugging Face names, tokens and
targets, our logits, mean cross-entropy and every parameter gradient, then
the losses of 5 AdamW steps and the final weights. This script builds the
same model from scratch in PyTorch (tests/reference/torch_llama.py) (RMSNorm, rotary embeddings with
rotate_half as in Hugging Face's modeling_llama, grouped-query attention via
repeat_interleave of the KV heads, causal softmax attention, SwiGLU MLP, F32),
loads the weights, and compares:

  - logits, loss, every parameter gradient: ||ours - torch|| / ||torch||;
  - torch.optim.AdamW (two param groups: weight decay on >= 2-D parameters,
    none on the norms) for 5 steps: each loss and every final weight.

Every relative error must stay below 1e-4. Prints a table of the errors and
the maxima; exits 1 on a failure, 77 (CTest: skipped) without torch/numpy.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"check_llama.py: skipped, {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import LlamaForCausalLM  # noqa: E402

TOL = 1e-4


# --- comparison ------------------------------------------------------------------------

def load(root, entry):
    dtype = np.float32 if entry["dtype"] == "F32" else np.int32
    arr = np.fromfile(os.path.join(root, entry["file"]), dtype=dtype).reshape(entry["shape"])
    return torch.from_numpy(arr.copy())


def load_file(root, rel, shape):
    return torch.from_numpy(np.fromfile(os.path.join(root, rel), dtype=np.float32).reshape(shape).copy())


def rel_err(ours, ref):
    ours = torch.as_tensor(ours, dtype=torch.float64)
    ref = torch.as_tensor(ref, dtype=torch.float64)
    den = ref.norm().item()
    num = (ours - ref).norm().item()
    return num / den if den > 0 else num


def check_case(root, case, rows):
    c = case["config"]
    name = case["name"]
    torch.manual_seed(0)
    model = LlamaForCausalLM(c)
    ours_params = {p["name"]: p for p in case["params"]}
    torch_names = [n for n, _ in model.named_parameters()]
    if torch_names != [p["name"] for p in case["params"]]:
        rows.append((name, "parameter names", float("inf")))
        print(f"{name}: names differ\n  torch: {torch_names}\n  ours:  {[p['name'] for p in case['params']]}")
        return
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(load(root, ours_params[n]))

    tokens = load(root, case["tokens"]).long()
    targets = load(root, case["targets"]).long()
    ignore = case["ignore_index"]

    logits = model(tokens)
    v = logits.shape[-1]
    loss = F.cross_entropy(logits.view(-1, v), targets.view(-1), ignore_index=ignore)
    loss.backward()
    rows.append((name, "logits", rel_err(load(root, case["logits"]), logits.detach())))
    rows.append((name, "loss", abs(case["loss"] - loss.item()) / abs(loss.item())))
    grad_max = 0.0
    for n, p in model.named_parameters():
        e = ours_params[n]
        err = rel_err(load_file(root, e["grad"], e["shape"]), p.grad)
        rows.append((name, f"grad {n}", err))
        grad_max = max(grad_max, err)
    rows.append((name, "max grad", grad_max))

    # AdamW from the same initial weights, decay only on >= 2-D parameters.
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(load(root, ours_params[n]))
            p.grad = None
    h = case["adamw"]
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": h["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"])
    losses = []
    for _ in range(h["steps"]):
        opt.zero_grad(set_to_none=True)
        out = model(tokens)
        step_loss = F.cross_entropy(out.view(-1, v), targets.view(-1), ignore_index=ignore)
        step_loss.backward()
        losses.append(step_loss.item())
        opt.step()
    for i, (a, b) in enumerate(zip(h["losses"], losses)):
        rows.append((name, f"adamw loss {i + 1} ({b:.6f})", abs(a - b) / abs(b)))
    final_max = 0.0
    for n, p in model.named_parameters():
        e = ours_params[n]
        err = rel_err(load_file(root, e["final"], e["shape"]), p.detach())
        final_max = max(final_max, err)
    rows.append((name, "adamw final weights (max)", final_max))


def main(argv):
    if len(argv) == 3 and argv[1] == "--dir":
        root = argv[2]
        return check_dir(root)
    if len(argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="torch_ref_llama_") as root:
        subprocess.run([argv[1], root], check=True)
        return check_dir(root)


def check_dir(root):
    torch.set_num_threads(1)
    with open(os.path.join(root, "manifest.json")) as f:
        manifest = json.load(f)
    rows = []
    for case in manifest["cases"]:
        check_case(root, case, rows)
    failed = 0
    width = max(len(r[1]) for r in rows)
    print(f"{'case':<8} {'quantity':<{width}}  relative error")
    for case, what, err in rows:
        bad = not (err < TOL)
        failed += bad
        print(f"{case:<8} {what:<{width}}  {err:.3e}{'  FAIL' if bad else ''}")
    summary = {}
    for case, what, err in rows:
        key = "grad" if what.startswith("grad ") else what.split(" (")[0]
        key = "adamw loss" if key.startswith("adamw loss") else key
        summary[key] = max(summary.get(key, 0.0), err)
    print("maxima over both cases: " + ", ".join(f"{k} {v:.2e}" for k, v in summary.items() if k != "max grad"))
    if failed:
        print(f"check_llama.py: {failed} quantities above {TOL:g}")
        return 1
    print(f"check_llama.py: all {len(rows)} quantities below {TOL:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
