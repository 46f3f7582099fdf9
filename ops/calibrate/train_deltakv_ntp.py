#!/usr/bin/env python3
"""Fine-tunes DeltaKV compressors end to end through the frozen model (JAX, CPU).

The paper's objective (../shared/methods/deltakv.md section 4): a clean forward pass records
every layer's pre-RoPE [K; V]; a second pass replaces each layer's KV after the sinks by the
compressors' reconstruction x^ (references: sinks and every `stride`-th token, each other
token against the mean of its k nearest earlier references), with full causal attention;
loss = next-token cross-entropy + sum over layers of MSE(x^, clean x). Only the compressors
train. Layer 0 stays full in this fine-tune (the engine may compress it).

Starts from the per-layer MSE profile (train_deltakv.py) in PROFILE/deltakv.safetensors and
writes the result back there (PROFILE/train_ntp.json: settings, losses, per-layer errors).
Tokens come from `deltactl calibrate` (TOKENS/tokens.i32, TOKENS/meta.json with the
sequence lengths); the last piece of --seq-len tokens is held out to report the objective
before and after. Progress goes to stderr. Needs `jax[cpu]` and `gguf` (deploy/setup.sh puts
them in .venv-tools).
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np

from llama_jax import forward, jax, jnp, kv_rows, load_gguf
from train_deltakv import write_safetensors


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(t["shape"]).copy()
    return out


NAMES = (("w1", "enc.w1"), ("w2", "enc.w2"), ("w3", "enc.w3"), ("wd", "dec.w"))


def encode(c, u):
    return (jax.nn.silu(u @ c["w1"].T) * (u @ c["w2"].T)) @ c["w3"].T


def make_hook(n, sinks, stride, k):
    """The KV hook of the second pass for sequences of n tokens: (k, v, squared error sum)."""
    is_ref = np.zeros(n, dtype=bool)
    is_ref[:sinks] = True
    is_ref[sinks::stride] = True
    refs, comp = np.nonzero(is_ref)[0], np.nonzero(~is_ref)[0]
    later = refs[None, :] > comp[:, None]  # references after the token are not yet there
    kk = min(k, refs.size)

    def hook(i, kx, vx, hp):
        c, clean = hp
        kv = kx.shape[-1]
        x = jnp.concatenate([kx, vx], axis=-1)
        xr, xc = x[refs], x[comp]
        d2 = (xc * xc).sum(1)[:, None] - 2.0 * xc @ xr.T + (xr * xr).sum(1)[None, :]
        _, nearest = jax.lax.top_k(-jnp.where(later, jnp.inf, jax.lax.stop_gradient(d2)), kk)
        r = xr[nearest].mean(axis=1)
        xhat = (encode(c, xc) - encode(c, r)) @ c["wd"].T + r
        err = ((xhat - clean[comp]) ** 2).sum()
        x = jnp.where(i > 0, x.at[comp].set(xhat), x)
        return x[:, :kv], x[:, kv:], err

    return hook, comp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="llama-architecture GGUF")
    ap.add_argument("--profile", required=True, help="folder with deltakv.json + deltakv.safetensors (MSE-trained)")
    ap.add_argument("--tokens", required=True, help="folder with tokens.i32 and meta.json from deltactl calibrate")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--mse-weight", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.time()

    prof = json.load(open(os.path.join(a.profile, "deltakv.json")))
    sinks, stride, k = prof["sinks"], prof["stride"], prof["k"]
    weights = read_safetensors(os.path.join(a.profile, prof.get("weights", "deltakv.safetensors")))
    cfg, params = load_gguf(a.model)
    n_layers = cfg["n_layers"]
    comp = {key: jnp.asarray(np.stack([weights[f"layers.{i}.{name}"] for i in range(n_layers)]))
            for key, name in NAMES}
    if comp["wd"].shape[1] != 2 * cfg["n_kv_heads"] * cfg["head_dim"]:
        sys.exit(f"error: the profile's D {comp['wd'].shape[1]} does not fit the model")

    meta = json.load(open(os.path.join(a.tokens, "meta.json")))
    stream = np.fromfile(os.path.join(a.tokens, "tokens.i32"), dtype=np.int32)
    pieces, at = [], 0
    for n in meta["sequences"]:
        pieces += [stream[at + s:at + s + a.seq_len] for s in range(0, n - a.seq_len + 1, a.seq_len)]
        at += n
    if len(pieces) < 2:
        sys.exit(f"error: need at least two pieces of {a.seq_len} tokens (one held out), have {len(pieces)}")
    held_out, train = pieces[-1], pieces[:-1]
    n = a.seq_len
    hook, comp_pos = make_hook(n, sinks, stride, k)
    n_comp = comp_pos.size
    d = comp["wd"].shape[1]

    @jax.jit
    def clean_rows(tokens):
        return kv_rows(cfg, params, tokens)

    def ntp(logits, tokens):
        lp = jax.nn.log_softmax(logits[:-1], axis=-1)
        return -jnp.take_along_axis(lp, tokens[1:, None], axis=1).mean()

    def losses(c, tokens, clean):
        logits, err = forward(cfg, params, tokens, hook, (c, clean))
        mse = err / (n_comp * d)  # per layer: mean over the compressed tokens' elements
        return ntp(logits, tokens), mse

    @jax.jit
    def objective(c, tokens, clean):
        nt, mse = losses(c, tokens, clean)
        return nt + a.mse_weight * mse[1:].sum(), (nt, mse)  # layer 0 stays full

    grad_fn = jax.jit(jax.value_and_grad(objective, has_aux=True))

    def evaluate(c):
        tokens = jnp.asarray(held_out)
        logits_full, clean = clean_rows(tokens)
        _, (nt, mse) = objective(c, tokens, clean)
        var = np.asarray(clean[:, comp_pos].var(axis=1).mean(axis=-1))
        return float(ntp(logits_full, tokens)), float(nt), np.asarray(mse), var

    full_nt, init_nt, init_mse, var = evaluate(comp)
    print(f"[ntp] held-out {n} tokens: NTP loss full KV {full_nt:.4f}, MSE-trained compressors {init_nt:.4f} "
          f"({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)

    m1 = jax.tree_util.tree_map(jnp.zeros_like, comp)
    m2 = jax.tree_util.tree_map(jnp.zeros_like, comp)
    rng = np.random.default_rng(a.seed)
    order = rng.permutation(len(train))
    b1, b2, eps = 0.9, 0.999, 1e-8
    for step in range(a.steps):
        tokens = jnp.asarray(train[order[step % len(train)]])
        _, clean = clean_rows(tokens)
        (_, (nt, mse)), g = grad_fn(comp, tokens, clean)
        norm = float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g))))
        scale = min(1.0, 1.0 / (norm + 1e-12))  # clip the gradient norm at 1
        lr = a.lr * min(1.0, (step + 1) / (0.02 * a.steps + 1)) * (1.0 - step / a.steps)  # warmup, linear decay
        t = step + 1
        for key in comp:
            gk = g[key] * scale
            m1[key] = b1 * m1[key] + (1 - b1) * gk
            m2[key] = b2 * m2[key] + (1 - b2) * gk * gk
            comp[key] = comp[key] - lr * (m1[key] / (1 - b1 ** t)) / (jnp.sqrt(m2[key] / (1 - b2 ** t)) + eps)
        print(f"[ntp] step {step + 1}/{a.steps} NTP loss {float(nt):.4f} MSE sum {float(mse[1:].sum()):.4f} "
              f"grad norm {norm:.3f} {time.time() - t0:.0f}s", file=sys.stderr, flush=True)

    _, final_nt, final_mse, _ = evaluate(comp)
    print(f"[ntp] held-out NTP loss: full KV {full_nt:.4f}, before {init_nt:.4f}, after {final_nt:.4f}",
          file=sys.stderr, flush=True)
    tensors = {f"layers.{i}.{name}": np.asarray(comp[key][i]) for i in range(n_layers) for key, name in NAMES}
    write_safetensors(os.path.join(a.profile, prof.get("weights", "deltakv.safetensors")), tensors)
    layers = [{"layer": i, "tokens": int(n_comp), "mse": float(final_mse[i]), "variance": float(var[i]),
               "relative_error": float(final_mse[i] / var[i]) if var[i] > 0 else 0.0} for i in range(n_layers)]
    report = {"objective": "ntp+mse", "seq_len": n, "steps": a.steps, "lr": a.lr, "mse_weight": a.mse_weight,
              "seed": a.seed, "train_tokens": a.steps * n, "held_out_tokens": n,
              "held_out_ntp_full": full_nt, "held_out_ntp_before": init_nt, "held_out_ntp_after": final_nt,
              "held_out_mse_before": float(init_mse[1:].sum()), "held_out_mse_after": float(final_mse[1:].sum()),
              "layers": layers, "seconds": time.time() - t0}
    with open(os.path.join(a.profile, "train_ntp.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"[ntp] done in {time.time() - t0:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
