#!/usr/bin/env python3
"""Checks our safetensors files against an independent implementation.

Usage: safetensors_check.py PATH/TO/safetensors_fixture

1. C++ -> Python: the fixture writes a file; this script parses it with the
   standard library (json, struct) and numpy only, checks the format rules
   (8-byte little-endian length, space padding to a multiple of 8, exact
   field set, contiguous offsets covering the data section) and compares
   every tensor byte for byte with values recomputed here.
2. Python -> C++: this script writes a file with its own writer (tensors in a
   different order, keys in another order) and the fixture must read it back
   bit-exactly; a deliberately corrupted copy must be rejected by name.

Exits non-zero with a message naming the file and tensor on any mismatch.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np


def k_of(i):
    return (i * 7919) % 10007 - 5003


def bf16_rne(f32):
    """F32 -> BF16 bits, round to nearest even (no NaNs occur here)."""
    u = np.asarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype("<u2")


def expected_tensors():
    """name -> (dtype, shape, little-endian bytes), mirroring safetensors_fixture.cpp."""
    i15 = np.arange(15, dtype=np.int64)
    i37 = np.arange(37, dtype=np.int64)
    weight = (k_of(i15).astype(np.float64) / 3.0).astype("<f4")
    bias = bf16_rne((k_of(i37).astype(np.float64) / 7.0).astype(np.float32))
    ties_f32 = (((0x3F80 + np.arange(8, dtype=np.uint32)) << 16) | 0x8000).astype(np.uint32).view(np.float32)
    ties = bf16_rne(ties_f32)
    ids = ((np.arange(24, dtype=np.uint64) * 2654435761) & 0xFFFFFFFF).astype(np.uint32).view("<i4")
    return {
        "layers.0.weight": ("F32", [3, 5], weight.tobytes()),
        "layers.0.bias": ("BF16", [37], bias.tobytes()),
        "ties": ("BF16", [2, 4], ties.tobytes()),
        "ids": ("I32", [4, 6], ids.tobytes()),
        "scalar": ("F32", [], np.array([3.25], dtype="<f4").tobytes()),
        "empty": ("I32", [0], b""),
    }


class Mismatch(Exception):
    pass


def check(cond, path, msg):
    if not cond:
        raise Mismatch(f"{path}: {msg}")


def check_cpp_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    check(len(raw) >= 8, path, f"only {len(raw)} bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    check(8 + n <= len(raw), path, f"header length {n} past end of {len(raw)}-byte file")
    check((8 + n) % 8 == 0, path, f"8 + header length {n} is not a multiple of 8")
    text = raw[8 : 8 + n].decode("utf-8")
    header, end = json.JSONDecoder().raw_decode(text)
    check(text[end:] == " " * (n - end), path, f"header padding is not all spaces: {text[end:]!r}")
    check(isinstance(header, dict), path, "header is not an object")
    meta = header.pop("__metadata__", None)
    check(meta == {"format": "pt", "producer": "safetensors_fixture"}, path, f"metadata is {meta!r}")
    data = raw[8 + n :]
    want = expected_tensors()
    check(set(header) == set(want), path, f"tensors {sorted(header)} != expected {sorted(want)}")
    cursor = 0
    for name, entry in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        check(set(entry) == {"dtype", "shape", "data_offsets"}, path, f"tensor '{name}': fields {sorted(entry)}")
        dtype, shape, expected = want[name]
        check(entry["dtype"] == dtype, path, f"tensor '{name}': dtype {entry['dtype']} != {dtype}")
        check(entry["shape"] == shape, path, f"tensor '{name}': shape {entry['shape']} != {shape}")
        begin, stop = entry["data_offsets"]
        check(begin == cursor, path, f"tensor '{name}': begins at {begin}, previous tensor ends at {cursor}")
        got = data[begin:stop]
        if got != expected:
            first = next((i for i in range(min(len(got), len(expected))) if got[i] != expected[i]), None)
            raise Mismatch(
                f"{path}: tensor '{name}': {len(got)} bytes, expected {len(expected)}; first differing byte {first}")
        cursor = stop
    check(cursor == len(data), path, f"tensors cover {cursor} of {len(data)} data bytes")
    print(f"safetensors_check: {path}: {len(want)} tensors match")


def write_py_file(path, tensors, dtype_override=None):
    """Independent writer: reverse-sorted data layout, header keys in another order."""
    header = {}
    blobs = []
    cursor = 0
    for name in sorted(tensors, reverse=True):
        dtype, shape, blob = tensors[name]
        header[name] = {
            "data_offsets": [cursor, cursor + len(blob)],
            "shape": shape,
            "dtype": (dtype_override or {}).get(name, dtype),
        }
        blobs.append(blob)
        cursor += len(blob)
    header["__metadata__"] = {"producer": "safetensors_check.py"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def run(fixture, *args):
    return subprocess.run([fixture, *args], capture_output=True, text=True, check=False)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: safetensors_check.py PATH/TO/safetensors_fixture")
    fixture = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="st_safetensors_check_") as tmp:
        try:
            cpp_path = os.path.join(tmp, "cpp.safetensors")
            r = run(fixture, "write", cpp_path)
            check(r.returncode == 0, cpp_path, f"fixture write failed ({r.returncode}): {r.stderr.strip()}")
            check_cpp_file(cpp_path)

            py_path = os.path.join(tmp, "py.safetensors")
            write_py_file(py_path, expected_tensors())
            r = run(fixture, "verify", py_path)
            check(r.returncode == 0, py_path, f"C++ reader disagrees ({r.returncode}): {r.stderr.strip()}")
            print(r.stdout.strip())

            bad_path = os.path.join(tmp, "bad.safetensors")
            write_py_file(bad_path, expected_tensors(), dtype_override={"ties": "F16"})
            r = run(fixture, "verify", bad_path)
            want = f"unknown dtype 'F16' for tensor 'ties' in file '{bad_path}'"
            check(r.returncode == 1 and want in r.stderr, bad_path,
                  f"expected exit 1 with \"{want}\", got {r.returncode}: {r.stderr.strip()}")
            print(f"safetensors_check: corrupted file rejected: {r.stderr.strip()}")
        except Mismatch as e:
            print(f"safetensors_check: MISMATCH: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
