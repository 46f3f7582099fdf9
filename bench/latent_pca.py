#!/usr/bin/env python3
"""How wide DeltaKV's latent must be: a profile's compressors against the best linear code.

On KV recorded by `deltactl calibrate --keep-kv yes` (KV_DIR/meta.json + layer_XX.f32, pre-RoPE
[K; V] rows), per layer: the residual x - r of each compressed token against the mean r of its
k nearest earlier references (as ops/calibrate/train_deltakv.py builds it) is fitted with PCA on
the first 80% of the tokens, and the last 20% are reconstructed from the top m components.
Printed: relative error (MSE over the variance of x) of the reference mean alone, of PCA at each
m, and, with --profile, of that profile's compressors (at its own m and stride) on the same
held-out tokens. Where a trained compressor is no better than PCA at its m, more training will
not help; a wider latent will.

  ./build/bin/deltactl calibrate --model models/M.gguf --steps deltakv --objective mse \\
      --epochs 1 --keep-kv yes --out /tmp/rec
  python3 bench/latent_pca.py --kv /tmp/rec/kv --profile profiles/M.gguf/deltakv.json
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ops", "calibrate"))
from error_by_position import load_safetensors  # noqa: E402
from train_deltakv import Compressor, nearest_ref_means  # noqa: E402


def residual_rows(rows, lengths, sinks, stride, k):
    xs, rs, at = [], [], 0
    for n in lengths:
        x, r = nearest_ref_means(rows[at:at + n], sinks, stride, k)
        xs.append(x)
        rs.append(r)
        at += n
    return np.concatenate(xs), np.concatenate(rs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", required=True, help="KV folder written by deltactl calibrate --keep-kv yes")
    ap.add_argument("--profile", help="a profile's deltakv.json whose compressors to compare")
    ap.add_argument("--layers", default="3,10,17,22,27")
    ap.add_argument("--m", default="48,96,128,192", help="latent sizes for PCA")
    ap.add_argument("--stride", default="10,20,40", help="reference strides")
    ap.add_argument("--sinks", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()

    meta = json.load(open(os.path.join(a.kv, "meta.json")))
    d, lengths = meta["D"], meta["sequences"]
    ms = [int(v) for v in a.m.split(",")]
    prof, weights = None, None
    if a.profile:
        prof = json.load(open(a.profile))
        weights = load_safetensors(os.path.join(os.path.dirname(a.profile), prof["weights"]))
    print("layer stride  ref-mean  " + "  ".join(f"pca m={m:<4d}" for m in ms) +
          (f"  profile (m={prof['m']})" if prof else ""))
    for layer in (int(v) for v in a.layers.split(",")):
        rows = np.fromfile(os.path.join(a.kv, f"layer_{layer:02d}.f32"), dtype=np.float32).reshape(-1, d)
        for stride in (int(v) for v in a.stride.split(",")):
            x, r = residual_rows(rows, lengths, a.sinks, stride, a.k)
            var = float(x.var(axis=0).mean())
            split = int(0.8 * x.shape[0])
            res = (x - r).astype(np.float64)
            mean = res[:split].mean(axis=0)
            _, _, vt = np.linalg.svd(res[:split] - mean, full_matrices=False)
            held = res[split:] - mean
            cells = [f"{float((held ** 2).mean()) / var:8.3f}"]
            for m in ms:
                p = vt[:m]
                err = held - held @ p.T @ p
                cells.append(f"{float((err ** 2).mean()) / var:10.3f}")
            if prof and stride == prof["stride"]:
                c = Compressor(d, prof["hidden"], prof["m"], np.random.default_rng(0))
                for key, name in (("w1", "enc.w1"), ("w2", "enc.w2"), ("w3", "enc.w3"), ("wd", "dec.w")):
                    c.p[key] = weights[f"layers.{layer}.{name}"]
                cells.append(f"{c.mse(x[split:], r[split:]) / var:12.3f}")
            print(f"{layer:5d} {stride:6d}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
