#!/usr/bin/env python3
"""A DeltaKV profile's reconstruction error by position, per layer, on recorded KV.

Record one long sequence's pre-RoPE KV first (the one-epoch training it also does is thrown
away):
  build/bin/deltactl calibrate --model M --text FILE --tokens 8192 --seq-len 8192 \\
      --steps deltakv --epochs 1 --keep-kv yes --out /tmp/kv8k
  python3 ops/calibrate/error_by_position.py --profile profiles/<model> --kv /tmp/kv8k/kv

Prints, per sparse-capable layer (1..n-1) and per block of --block positions, the relative
error of x^ = Dec(E(x) - E(r)) + r against x (MSE over the variance of x), with references
every stride-th token (the profile's) after the sinks and r the mean of the k nearest, as in training.
Latents are not rounded to int4 here.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_deltakv import nearest_ref_means, references, silu  # noqa: E402


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], np.float32).reshape(h["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", required=True, help="folder with deltakv.json and deltakv.safetensors")
    ap.add_argument("--kv", required=True, help="KV folder written by deltactl calibrate --keep-kv yes")
    ap.add_argument("--block", type=int, default=1024)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.profile, "deltakv.json")))
    w = load_safetensors(os.path.join(a.profile, cfg.get("weights", "deltakv.safetensors")))
    meta = json.load(open(os.path.join(a.kv, "meta.json")))
    d, n = meta["D"], meta["sequences"][0]
    sinks, stride, k = cfg["sinks"], cfg["stride"], cfg["k"]
    is_ref = np.zeros(n, bool)
    is_ref[references(n, sinks, stride)] = True
    comp = np.nonzero(~is_ref)[0]
    blocks = (n + a.block - 1) // a.block
    print("layer " + " ".join("%6d" % (b * a.block) for b in range(blocks)))
    total = np.zeros(blocks)
    for layer in range(1, meta["n_layers"]):
        x = np.fromfile(os.path.join(a.kv, f"layer_{layer:02d}.f32"), np.float32).reshape(-1, d)[:n]
        cx, r = nearest_ref_means(x, sinks, stride, k)
        w1, w2, w3, wd = (w[f"layers.{layer}.{t}"] for t in ("enc.w1", "enc.w2", "enc.w3", "dec.w"))

        def enc(u):
            return (silu(u @ w1.T) * (u @ w2.T)) @ w3.T

        err = (((enc(cx) - enc(r)) @ wd.T + r - cx) ** 2).sum(1)
        var = ((cx - cx.mean(0)) ** 2).sum(1).mean()
        row = np.array([err[(comp >= b * a.block) & (comp < (b + 1) * a.block)].mean() / var
                        for b in range(blocks)])
        total += row
        print("%5d " % layer + " ".join("%6.3f" % v for v in row))
    print("mean  " + " ".join("%6.3f" % v for v in total / (meta["n_layers"] - 1)))


if __name__ == "__main__":
    main()
