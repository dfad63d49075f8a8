#!/usr/bin/env python3
"""End-to-end checks of `plot` and `logging.plot` on real runs (standard library + numpy).

    check_plot.py TRAINER PLOT OUT_DIR

1. llama-tiny at 2 ranks, 60 steps uninterrupted, with logging.plot: the trainer
   leaves METRICS.svg beside its metrics file, naming the run.
2. The same run stopped after step 25 (checkpoints every 10 steps), then resumed
   from step 20 into the same metrics file: steps 21..25 appear twice. Read with
   "the later line counts", its 60 losses equal the uninterrupted run's.
3. `plot` overlays the two (OUT_DIR/run.svg); rsvg-convert renders it to
   OUT_DIR/run.png, decoded here (zlib + numpy): the image has the SVG's size,
   and inside every panel's plot area there are pixels of each run's colour.
   The SVG's text holds both legend names; a second `plot` gives the same bytes.
4. logging.run_name titles the trainer's plot and names its legend entry (the
   default is checkpoint.dir's name); a run stopped at step 20 and resumed
   from its step-20 checkpoint (the steps do not go back) leaves a resume line
   in the metrics file and a dotted mark in the plot; `plot` names the file by
   its recorded run name.
5. The toy model (no tokens): its plot's throughput panel is in samples/s; with a
   metrics file the plot cannot read, logging.plot warns and the run finishes.
6. Errors exit 1 with one line: a missing file, a line that is not JSON (named
   file:line), an empty file, no -o, an unknown option, -o naming an input,
   a log loss axis with a loss <= 0, and logging.plot without logging.metrics_file.
The PNG is kept (its path is printed) so that it can be looked at.
"""
import os
import re
import struct
import sys
import tempfile
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, expect, fail, metrics_lines, metrics_rows, mpirun, run, sets  # noqa: E402

TINY = "configs/llama-tiny.yaml"
# The first two colours of metrics/plot_svg.cpp's palette, in drawing order.
COLOURS = {"uninterrupted": (0x1F, 0x77, 0xB4), "resumed": (0xD6, 0x27, 0x28)}
# Anti-aliasing blends a line's edge with the white behind it; a pixel within
# this distance (per channel) of a colour counts as that colour.
TOLERANCE = 24
MIN_PIXELS = 20


def train(trainer, metrics, *extra):
    return run(mpirun(2) + [trainer, "--config", TINY, "--set", f"logging.metrics_file={metrics}"] + list(extra))


def later_lines_win(path):
    """{step: loss} with the last line of each step counting, as the plot reads a file."""
    return {row["step"]: row["loss"] for row in metrics_rows(path) if "loss" in row}


def steps_of(path):
    return [row["step"] for row in metrics_rows(path)]


def check_runs(trainer, tmp):
    full = os.path.join(tmp, "full.jsonl")
    proc = train(trainer, full, "--set", "logging.plot=true")
    svg = full + ".svg"
    expect(proc, 0, f"plot: {full}.svg", what="logging.plot")
    with open(svg) as f:
        text = f.read()
    if ">full</text>" not in text or ">loss (nats/token)</text>" not in text:
        fail(f"{svg} does not name the run 'full' or lacks the loss panel in nats/token")
    print(f"logging.plot: the trainer wrote {os.path.getsize(svg)} bytes of SVG beside its metrics file")

    resumed = os.path.join(tmp, "resumed.jsonl")
    ckpt = os.path.join(tmp, "ckpt")
    train(trainer, resumed, *sets(checkpoint__dir=ckpt, checkpoint__interval=10), "--stop-after", "25")
    train(trainer, resumed, "--set", "checkpoint.dir=", "--resume", os.path.join(ckpt, "step-000020"))
    steps = steps_of(resumed)
    if steps != list(range(1, 26)) + list(range(21, 61)):
        fail(f"the resumed run's metrics file holds steps {steps}, not 1..25 then 21..60")
    a, b = later_lines_win(full), later_lines_win(resumed)
    if a != b:
        fail("the resumed run's losses, later lines counting, differ from the uninterrupted run's")
    print("resumed: steps 1..25, then 21..60 from the step-20 checkpoint; later lines counting, "
          "all 60 losses equal the uninterrupted run's")
    return full, resumed


def read_png(path):
    """(height, width, channels) uint8 array of an 8-bit, non-interlaced RGB or RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        fail(f"{path}: PNG of depth {depth}, colour type {colour}, interlace {interlace}: not decoded here")
    bpp = 4 if colour == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    out = bytearray(height * stride)
    prev = bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = unfilter(raw[start], raw[start + 1:start + 1 + stride], prev, bpp)
        out[y * stride:(y + 1) * stride] = row
        prev = row
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(height, width, bpp)


def unfilter(kind, line, prev, bpp):
    """One row of PNG filter types 0-4 undone (RFC 2083, 6.2-6.6)."""
    if kind == 0:
        return bytes(line)
    if kind == 2:
        return ((np.frombuffer(line, np.uint8).astype(np.int32) + np.frombuffer(prev, np.uint8)) % 256).astype(
            np.uint8).tobytes()
    if kind == 1:  # Sub: a running sum per channel
        sums = np.cumsum(np.frombuffer(line, np.uint8).astype(np.int64).reshape(-1, bpp), axis=0) % 256
        return sums.astype(np.uint8).tobytes()
    out = bytearray(line)
    for i in range(len(out)):  # Average and Paeth depend on the byte just decoded
        left = out[i - bpp] if i >= bpp else 0
        up = prev[i]
        if kind == 3:
            out[i] = (out[i] + ((left + up) >> 1)) & 255
            continue
        corner = prev[i - bpp] if i >= bpp else 0
        p = left + up - corner
        pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
        out[i] = (out[i] + (left if pa <= pb and pa <= pc else (up if pb <= pc else corner))) & 255
    return bytes(out)


def check_decoder(out_dir):
    """read_png against an image whose every pixel is known: two colour halves rendered by rsvg-convert."""
    svg, png = os.path.join(out_dir, "halves.svg"), os.path.join(out_dir, "halves.png")
    with open(svg, "w") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="40" height="20">'
                '<rect x="0" y="0" width="20" height="20" fill="#1f77b4"/>'
                '<rect x="20" y="0" width="20" height="20" fill="#d62728"/></svg>')
    run(["rsvg-convert", "-o", png, svg])
    image = read_png(png)
    want = np.zeros((20, 40, 3), dtype=np.uint8)
    want[:, :20], want[:, 20:] = COLOURS["uninterrupted"], COLOURS["resumed"]
    if image.shape[:2] != (20, 40) or (image[..., :3] != want).any() or (image.shape[2] == 4 and
                                                                          (image[..., 3] != 255).any()):
        fail("the PNG decoder misreads a two-colour image rendered by rsvg-convert")


def plot_areas(svg_text):
    """The panels' plot areas, (left, top, right, bottom), from their frames."""
    frames = re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" fill="none" '
                        r'stroke="#999999"/>', svg_text)
    return [(float(x), float(y), float(x) + float(w), float(y) + float(h)) for x, y, w, h in frames]


def check_plot(plot, full, resumed, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    svg, png = os.path.join(out_dir, "run.svg"), os.path.join(out_dir, "run.png")
    cmd = [plot, full, resumed, "--label", "uninterrupted", "--label", "resumed", "-o", svg]
    expect(run(cmd), 0, f"plot: wrote {svg}", "resumed: steps 1..60, 1 restart(s)", what="plot")
    with open(svg, "rb") as f:
        first = f.read()
    run(cmd)
    with open(svg, "rb") as f:
        if f.read() != first:
            fail("two plots of the same files differ")
    text = first.decode()
    for name in COLOURS:
        if f">{name}</text>" not in text:
            fail(f"the legend lacks '{name}'")
    check_decoder(out_dir)
    run(["rsvg-convert", "-o", png, svg])
    image = read_png(png)
    size = re.search(r'<svg [^>]*width="(\d+)" height="(\d+)"', text)
    if (image.shape[1], image.shape[0]) != (int(size[1]), int(size[2])) or not image[..., :3].any():
        fail(f"{png} is {image.shape[1]}x{image.shape[0]}, not the SVG's {size[1]}x{size[2]}, or empty")
    areas = plot_areas(text)
    if len(areas) != 4:
        fail(f"found {len(areas)} panel frames in {svg}, not 4")
    counts = {}
    for name, rgb in COLOURS.items():
        near = (np.abs(image[..., :3].astype(np.int32) - np.array(rgb)) <= TOLERANCE).all(axis=2)
        counts[name] = [int(near[int(t) + 1:int(b), int(l) + 1:int(r)].sum()) for l, t, r, b in areas]
    print(f"pixels of each run's colour in the loss, lr, throughput and grad-norm panels: {counts}")
    for name, per_panel in counts.items():
        if min(per_panel) < MIN_PIXELS:
            fail(f"run '{name}' has fewer than {MIN_PIXELS} pixels of its colour in a panel: {per_panel}")
    print(f"plot: PNG rendered by rsvg-convert at {os.path.abspath(png)} ({image.shape[1]}x{image.shape[0]})")


def dotted_lines(svg_text):
    """The x of each dotted vertical line (resume marks and the legend's key)."""
    return [float(x) for x, x2 in re.findall(r'<line x1="([\d.]+)" y1="[\d.]+" x2="([\d.]+)" y2="[\d.]+" '
                                             r'stroke="[^"]+" stroke-width="1.0" stroke-dasharray="2,3"/>', svg_text)
            if x == x2]


def check_names_and_marks(trainer, plot, tmp):
    metrics = os.path.join(tmp, "named.jsonl")
    ckpt = os.path.join(tmp, "tiny-run")
    common = ["--steps", "30"] + sets(checkpoint__dir=ckpt, checkpoint__interval=10, logging__plot="true")
    train(trainer, metrics, *common, "--stop-after", "20")
    with open(metrics + ".svg") as f:
        if ">shardtrain: tiny-run</text>" not in f.read():
            fail("without logging.run_name the plot is not titled by checkpoint.dir's name 'tiny-run'")
    train(trainer, metrics, *common, *sets(logging__run_name="tiny-a"))
    events = [(r["event"], r["step"], r["run_name"]) for r in metrics_lines(metrics) if "event" in r]
    if events != [("start", 0, "tiny-run"), ("resume", 20, "tiny-a")]:
        fail(f"the metrics file's event lines are {events}")
    if [r["step"] for r in metrics_rows(metrics)] != list(range(1, 31)):
        fail("the resumed file does not hold steps 1..30 once each")
    with open(metrics + ".svg") as f:
        text = f.read()
    if ">shardtrain: tiny-a</text>" not in text or ">tiny-a</text>" not in text:
        fail("logging.run_name does not title the plot or name its legend entry")
    if ">resume (a redone step shows its later value)</text>" not in text or len(dotted_lines(text)) != 2:
        fail(f"the resume at step 20 has no mark: dotted lines at {dotted_lines(text)} (want the mark and its key)")
    out = os.path.join(tmp, "named.svg")
    expect(run([plot, metrics, "-o", out]), 0, "(tiny-a: steps 1..30, 1 restart(s))", what="plot by run name")
    print(f"run_name: default 'tiny-run' (checkpoint.dir), then 'tiny-a' titles and labels the plot; events {events}; "
          "the resume at step 20 (no step redone) is marked")


def check_toy(trainer, tmp):
    metrics = os.path.join(tmp, "toy.jsonl")
    run([trainer, "--config", "configs/toy.yaml", "--steps", "20"] +
        sets(logging__metrics_file=metrics, logging__plot="true", checkpoint__interval=0))
    with open(metrics + ".svg") as f:
        if ">throughput (samples/s, all ranks)</text>" not in f.read():
            fail("the toy model's plot does not show samples/s")
    print("toy: no tokens, so the throughput panel is in samples/s")
    # A metrics file with a line the plot cannot read (a killed run's half line): a warning, and training goes on.
    broken = os.path.join(tmp, "broken.jsonl")
    with open(broken, "w") as f:
        f.write('{"step": 1, "loss": \n')
    proc = run([trainer, "--config", "configs/toy.yaml", "--steps", "5"] +
               sets(logging__metrics_file=broken, logging__plot="true", checkpoint__interval=0))
    expect(proc, 0, f"logging.plot: {broken}.svg not redrawn: {broken}:1: not a JSON object", "done: steps 1..5",
           what="logging.plot with an unreadable metrics file")
    print("logging.plot: an unreadable metrics file is a warning; the run finishes")


def check_errors(trainer, plot, full, tmp):
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n')
    empty = os.path.join(tmp, "empty.jsonl")
    open(empty, "w").close()
    negative = os.path.join(tmp, "negative.jsonl")
    with open(negative, "w") as f:
        f.write('{"step": 1, "loss": -1.0}\n')
    out = os.path.join(tmp, "x.svg")
    cases = [
        ([plot, os.path.join(tmp, "missing.jsonl"), "-o", out], "does not exist"),
        ([plot, bad, "-o", out], f"{bad}:2: not a JSON object"),
        ([plot, empty, "-o", out], f"{empty}: no steps"),
        ([plot, full], "no output file: give -o OUT.svg", 2),
        ([plot, full, "-o", out, "--colour", "red"], "unknown argument '--colour'", 2),
        ([plot, full, "-o", full], "is the metrics file"),
        ([plot, full, full, "-o", out], "two runs are named 'full'"),
        ([plot, negative, "-o", out, "--log-loss"], "a log loss axis needs losses > 0, but run 'negative'"),
        ([trainer, "--config", TINY, "--set", "logging.plot=true"], "'logging.plot'"),
    ]
    # Exit 1 for a bad input, 2 for a mistake on the command line.
    for cmd, message, *code in cases:
        proc = run(cmd, expect_ok=False)
        out_text = expect(proc, code[0] if code else 1, message, what=" ".join(os.path.basename(c) for c in cmd))
        if len(proc.stderr.strip().splitlines()) != 1:
            fail(f"more than one error line: {out_text}")
    if "logging.metrics_file" not in run(cases[-1][0], expect_ok=False).stderr:
        fail("the logging.plot error does not name logging.metrics_file")
    print(f"errors: {len(cases)} bad inputs, each one line and exit 1 (2 for the command line)")


def main():
    trainer, plot, out_dir = (os.path.abspath(a) for a in sys.argv[1:4])
    with tempfile.TemporaryDirectory() as tmp:
        full, resumed = check_runs(trainer, tmp)
        check_plot(plot, full, resumed, out_dir)
        check_names_and_marks(trainer, plot, tmp)
        check_toy(trainer, tmp)
        check_errors(trainer, plot, full, tmp)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
