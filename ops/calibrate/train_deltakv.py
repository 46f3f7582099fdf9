#!/usr/bin/env python3
"""Trains DeltaKV compressors, one per layer, on recorded pre-RoPE KV (NumPy, CPU).

Input (written by `deltactl calibrate`): KV_DIR/meta.json with n_layers, D (= 2 * kv_dim),
the sequence lengths, the layers to train (all but a model's sliding-window layers), and
KV_DIR/layer_XX.f32 holding each of those layers' rows x = [K ; V] (pre-RoPE K, all KV heads)
of every token, sequence after sequence.

Per layer, as ../shared/methods/deltakv.md sections 1-4 describe (the per-layer MSE objective,
the paper's cheap first step for a small model):
  references  sinks (the first `sinks` tokens) and every `stride`-th token after them;
  r_t         the mean of the k references nearest to x_t by L2 among those at positions <= t;
  encoder     E(x) = W3 (SiLU(W1 x) * (W2 x))           (SwiGLU, D -> hidden -> m)
  decoder     Dec(z) = Wd z                             (bias-free linear, m -> D)
  residual    z_t = E(x_t) - E(r_t);  x^_t = Dec(z_t) + r_t
  loss        mean squared error of x^ against x over the tokens that get compressed
              (neither sinks nor references), Adam, gradients written out by hand.

Output: OUT/deltakv.safetensors (F32; layers.{i}.enc.w1 [hidden, D], .enc.w2 [hidden, D],
.enc.w3 [m, hidden], .dec.w [D, m]) and OUT/train.json (settings and per-layer errors).
Progress goes to stderr, one line per layer and epoch.
"""

import argparse
import json
import os
import struct
import sys
import time

import numpy as np


def references(n, sinks, stride):
    """Positions kept in full precision in a sequence of n tokens."""
    return np.array(sorted(set(range(min(sinks, n))) | set(range(sinks, n, stride))), dtype=np.int64)


def nearest_ref_means(x, sinks, stride, k):
    """For the compressed tokens of one sequence: their rows and the mean of their k nearest
    references (L2 on x, references at positions <= t only)."""
    n = x.shape[0]
    refs = references(n, sinks, stride)
    is_ref = np.zeros(n, dtype=bool)
    is_ref[refs] = True
    comp = np.nonzero(~is_ref)[0]
    if comp.size == 0:
        return np.zeros((0, x.shape[1]), np.float32), np.zeros((0, x.shape[1]), np.float32)
    rx = x[refs].astype(np.float64)
    cx = x[comp].astype(np.float64)
    d2 = (cx * cx).sum(1)[:, None] - 2.0 * cx @ rx.T + (rx * rx).sum(1)[None, :]
    d2[refs[None, :] > comp[:, None]] = np.inf  # only references at or before t
    kk = min(k, refs.size)
    nearest = np.argpartition(d2, kk - 1, axis=1)[:, :kk]
    valid = np.isfinite(np.take_along_axis(d2, nearest, axis=1))
    means = (rx[nearest] * valid[..., None]).sum(1) / np.maximum(valid.sum(1), 1)[:, None]
    return x[comp].astype(np.float32), means.astype(np.float32)


def silu(a):
    return a / (1.0 + np.exp(-a))


class Compressor:
    def __init__(self, d, hidden, m, rng):
        self.p = {
            "w1": (rng.standard_normal((hidden, d)) / np.sqrt(d)).astype(np.float32),
            "w2": (rng.standard_normal((hidden, d)) / np.sqrt(d)).astype(np.float32),
            "w3": (rng.standard_normal((m, hidden)) / np.sqrt(hidden)).astype(np.float32),
            "wd": np.zeros((d, m), np.float32),  # starts as the reference mean alone
        }
        self.m1 = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.m2 = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.t = 0

    def encode(self, u):
        a = u @ self.p["w1"].T
        b = u @ self.p["w2"].T
        s = silu(a)
        g = s * b
        return g @ self.p["w3"].T, (u, a, b, s, g)

    def encode_backward(self, de, cache, grads):
        u, a, b, s, g = cache
        grads["w3"] += de.T @ g
        dg = de @ self.p["w3"]
        ds = dg * b
        db = dg * s
        sig = 1.0 / (1.0 + np.exp(-a))
        da = ds * sig * (1.0 + a * (1.0 - sig))
        grads["w1"] += da.T @ u
        grads["w2"] += db.T @ u

    def loss_and_grads(self, x, r):
        ex, cx = self.encode(x)
        er, cr = self.encode(r)
        z = ex - er
        xhat = z @ self.p["wd"].T + r
        diff = xhat - x
        loss = float((diff * diff).mean())
        dxhat = (2.0 / diff.size) * diff
        grads = {k: np.zeros_like(v) for k, v in self.p.items()}
        grads["wd"] += dxhat.T @ z
        dz = dxhat @ self.p["wd"]
        self.encode_backward(dz, cx, grads)
        self.encode_backward(-dz, cr, grads)
        return loss, grads

    def mse(self, x, r, batch=4096):
        total = 0.0
        for i in range(0, x.shape[0], batch):
            ex, _ = self.encode(x[i:i + batch])
            er, _ = self.encode(r[i:i + batch])
            xhat = (ex - er) @ self.p["wd"].T + r[i:i + batch]
            total += float(((xhat - x[i:i + batch]) ** 2).sum())
        return total / x.size

    def adam(self, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.t += 1
        for k in self.p:
            self.m1[k] = b1 * self.m1[k] + (1 - b1) * grads[k]
            self.m2[k] = b2 * self.m2[k] + (1 - b2) * grads[k] ** 2
            mh = self.m1[k] / (1 - b1 ** self.t)
            vh = self.m2[k] / (1 - b2 ** self.t)
            self.p[k] -= lr * mh / (np.sqrt(vh) + eps)


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", required=True, help="folder written by deltactl calibrate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", type=int, default=0, help="latent size (default D/4)")
    ap.add_argument("--hidden", type=int, default=0, help="encoder width (default 1.5 D)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--stride", type=int, default=10)
    ap.add_argument("--sinks", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    meta = json.load(open(os.path.join(a.kv, "meta.json")))
    d, n_layers, lengths = meta["D"], meta["n_layers"], meta["sequences"]
    layers = meta.get("layers", list(range(n_layers)))  # a model's window layers get none
    m = a.m or d // 4
    hidden = a.hidden or (3 * d) // 2
    rng = np.random.default_rng(a.seed)
    tensors, report = {}, []
    t0 = time.time()
    for layer in layers:
        rows = np.fromfile(os.path.join(a.kv, f"layer_{layer:02d}.f32"), dtype=np.float32).reshape(-1, d)
        xs, rs, at = [], [], 0
        for n in lengths:
            x, r = nearest_ref_means(rows[at:at + n], a.sinks, a.stride, a.k)
            xs.append(x)
            rs.append(r)
            at += n
        x, r = np.concatenate(xs), np.concatenate(rs)
        var = float(x.var(axis=0).mean())
        base = float(((r - x) ** 2).mean())  # the reference mean alone, no latent
        comp = Compressor(d, hidden, m, rng)
        order = np.arange(x.shape[0])
        steps = a.epochs * ((x.shape[0] + a.batch - 1) // a.batch)
        step = 0
        for epoch in range(a.epochs):
            rng.shuffle(order)
            for i in range(0, x.shape[0], a.batch):
                idx = order[i:i + a.batch]
                _, grads = comp.loss_and_grads(x[idx], r[idx])
                lr = a.lr * min(1.0, (step + 1) / (0.02 * steps + 1)) * (1.0 - step / steps)  # warmup, linear decay
                comp.adam(grads, lr)
                step += 1
            print(f"[train] layer {layer + 1}/{n_layers} epoch {epoch + 1}/{a.epochs} "
                  f"mse {comp.mse(x, r):.5f} (reference mean alone {base:.5f}) {time.time() - t0:.0f}s",
                  file=sys.stderr, flush=True)
        mse = comp.mse(x, r)
        report.append({"layer": layer, "tokens": int(x.shape[0]), "mse": mse, "mse_ref_mean": base,
                       "variance": var, "relative_error": mse / var if var > 0 else 0.0})
        for k, name in (("w1", "enc.w1"), ("w2", "enc.w2"), ("w3", "enc.w3"), ("wd", "dec.w")):
            tensors[f"layers.{layer}.{name}"] = comp.p[k]
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "deltakv.safetensors"), tensors)
    settings = {"D": d, "m": m, "hidden": hidden, "k": a.k, "stride": a.stride, "sinks": a.sinks,
                "epochs": a.epochs, "batch": a.batch, "lr": a.lr, "seed": a.seed, "layers": report,
                "seconds": time.time() - t0}
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(settings, f, indent=1)
    print(f"[train] done in {time.time() - t0:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
