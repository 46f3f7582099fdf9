#!/usr/bin/env python3
"""Trains TRIM-KV retention gates, one per layer, on recorded attention inputs (NumPy, CPU).

Input (written by `deltactl calibrate`): DATA/meta.json (d_model, n_heads, n_kv_heads,
head_dim, sequence lengths) and per layer DATA/layer_XX.{h,q,k}.f32: the normed hidden states
entering attention [T, d_model], Q after RoPE [T, n_heads * head_dim], K after RoPE
[T, n_kv_heads * head_dim], sequence after sequence.

Gate (as ../shared/methods/eviction-methods.md, TRIM-KV): log beta = logsigmoid(W2 SiLU(W1 h +
b1) + b2), one per KV head, b2 initialised to 10 (keep everything). During training each
attention logit q_t . k_i / sqrt(d) gets + (t - i) log beta_i, i.e. the weight is multiplied
by beta_i^(t - i). Loss, per layer (a departure from the paper's end-to-end objective, which
needs gradients through the whole model): the KL divergence from the layer's full attention
distribution to the retention-weighted one, averaged over queries and heads (distillation at
the attention), plus capacity * mean_t relu(sum_i beta_i^(t - i) - M) / M (the capacity loss).
Gradients are written out by hand; Adam.

Output: OUT/trimkv.safetensors (F32; layers.{i}.gate.w1 [hidden, d_model], .b1 [hidden],
.w2 [n_kv_heads, hidden], .b2 [n_kv_heads]) and OUT/trimkv_train.json. Progress on stderr.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from train_deltakv import write_safetensors


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def log_sigmoid(x):
    return np.where(x >= 0, -np.log1p(np.exp(-x)), x - np.log1p(np.exp(x)))


class Gate:
    def __init__(self, d, hidden, kv, rng):
        self.p = {"w1": (rng.standard_normal((hidden, d)) / np.sqrt(d)).astype(np.float32),
                  "b1": np.zeros(hidden, np.float32),
                  "w2": (rng.standard_normal((kv, hidden)) * 0.01).astype(np.float32),
                  "b2": np.full(kv, 10.0, np.float32)}
        self.m1 = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.m2 = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.t = 0

    def forward(self, h):
        a = h @ self.p["w1"].T + self.p["b1"]
        u = a * sigmoid(a)
        z = u @ self.p["w2"].T + self.p["b2"]
        return log_sigmoid(z), (h, a, u, z)

    def backward(self, dlogb, cache):
        h, a, u, z = cache
        dz = dlogb * sigmoid(-z)
        g = {"w2": dz.T @ u, "b2": dz.sum(0)}
        du = dz @ self.p["w2"]
        s = sigmoid(a)
        da = du * s * (1.0 + a * (1.0 - s))
        g["w1"] = da.T @ h
        g["b1"] = da.sum(0)
        return g

    def adam(self, g, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.t += 1
        for k in self.p:
            self.m1[k] = b1 * self.m1[k] + (1 - b1) * g[k]
            self.m2[k] = b2 * self.m2[k] + (1 - b2) * g[k] ** 2
            self.p[k] -= lr * (self.m1[k] / (1 - b1 ** self.t)) / (np.sqrt(self.m2[k] / (1 - b2 ** self.t)) + eps)


def softmax_rows(x):
    m = x.max(1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(1, keepdims=True)


def sequence_loss(logb, q, k, meta, capacity_target, capacity_weight, dtype=np.float32):
    """Loss and d loss / d log beta [T, kv] for one sequence (computed in dtype)."""
    t_len = q.shape[0]
    logb, q, k = logb.astype(dtype), q.astype(dtype), k.astype(dtype)
    nh, nkv, hd = meta["n_heads"], meta["n_kv_heads"], meta["head_dim"]
    group = nh // nkv
    t_idx = np.arange(t_len)
    dist = (t_idx[:, None] - t_idx[None, :]).astype(dtype)  # t - i
    causal = dist >= 0
    dist_c = np.where(causal, dist, 0).astype(dtype)
    loss, grad = 0.0, np.zeros((t_len, nkv), dtype)
    for g in range(nkv):
        kg = k[:, g * hd:(g + 1) * hd]
        a = dist_c * logb[None, :, g]  # (t - i) log beta_i
        diff = np.zeros((t_len, t_len), dtype)
        for hh in range(group):
            h = g * group + hh
            s = (q[:, h * hd:(h + 1) * hd] @ kg.T) / dtype(np.sqrt(hd))
            s = np.where(causal, s, -np.inf)
            pf = softmax_rows(s)
            pr = softmax_rows(s + a)
            with np.errstate(divide="ignore", invalid="ignore"):
                kl = np.where(causal & (pf > 0), pf * (np.log(pf) - np.log(np.maximum(pr, 1e-30))), 0)
            loss += float(kl.sum(dtype=np.float64)) / (t_len * nh)
            diff += (pr - pf) / (t_len * nh)
        grad[:, g] += (diff * dist_c).sum(0)
        # Capacity: how many tokens are effectively retained at each step.
        e = np.where(causal, np.exp(a), 0).astype(dtype)
        cap = e.sum(1)
        over = cap > capacity_target
        loss += capacity_weight * float(np.maximum(cap - capacity_target, 0).sum()) / (t_len * capacity_target * nkv)
        grad[:, g] += capacity_weight * (over[:, None] * dist_c * e).sum(0) / (t_len * capacity_target * nkv)
    return loss, grad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--capacity", type=float, default=0.25, help="M as a share of the sequence length")
    ap.add_argument("--capacity-weight", type=float, default=1.0)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.data, "meta.json")))
    d, nkv, lengths = meta["d_model"], meta["n_kv_heads"], meta["sequences"]
    qd, kd = meta["n_heads"] * meta["head_dim"], nkv * meta["head_dim"]
    rng = np.random.default_rng(a.seed)
    tensors, report, t0 = {}, [], time.time()
    for layer in range(meta["n_layers"]):
        base = os.path.join(a.data, f"layer_{layer:02d}")
        h_all = np.fromfile(base + ".h.f32", np.float32).reshape(-1, d)
        q_all = np.fromfile(base + ".q.f32", np.float32).reshape(-1, qd)
        k_all = np.fromfile(base + ".k.f32", np.float32).reshape(-1, kd)
        gate = Gate(d, a.hidden, nkv, rng)
        starts = np.cumsum([0] + lengths[:-1])
        for epoch in range(a.epochs):
            total, mean_logb = 0.0, 0.0
            for s in rng.permutation(len(lengths)):
                at, n = starts[s], lengths[s]
                logb, cache = gate.forward(h_all[at:at + n])
                loss, dlogb = sequence_loss(logb, q_all[at:at + n], k_all[at:at + n], meta, a.capacity * n,
                                            a.capacity_weight)
                gate.adam(gate.backward(dlogb.astype(np.float32), cache), a.lr)
                total += loss / len(lengths)
                mean_logb += float(logb.mean()) / len(lengths)
            print(f"[trimkv] layer {layer + 1}/{meta['n_layers']} epoch {epoch + 1}/{a.epochs} loss {total:.5f} "
                  f"mean log beta {mean_logb:.4f} {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
        report.append({"layer": layer, "loss": total, "mean_log_beta": mean_logb})
        for k in ("w1", "b1", "w2", "b2"):
            tensors[f"layers.{layer}.gate.{k}"] = gate.p[k]
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "trimkv.safetensors"), tensors)
    with open(os.path.join(a.out, "trimkv_train.json"), "w") as f:
        json.dump({"hidden": a.hidden, "capacity": a.capacity, "capacity_weight": a.capacity_weight,
                   "epochs": a.epochs, "lr": a.lr, "seed": a.seed, "layers": report,
                   "seconds": time.time() - t0}, f, indent=1)


if __name__ == "__main__":
    main()
