#!/usr/bin/env python3
"""A Llama forward pass in JAX over a GGUF model's weights (dequantized to fp32).

DeltaKV's end-to-end objective (../shared/methods/deltakv.md section 4) trains the
compressors through the frozen model's next-token loss, which needs gradients through the
whole forward pass; the engine is C++ and has none, so the training tools carry this
differentiable twin. `kv_hook(layer, k, v)` sees each layer's K (before RoPE) and V and
returns what attention uses instead: the place the compressors go.

    python3 llama_jax.py --model M.gguf --check tests/data/smollm2_golden.json

compares it with llama.cpp's logits (the golden file's prompts: the probe logits of each
prompt's last token, and teacher-forced argmax along llama.cpp's greedy continuation).
Needs `jax[cpu]` and `gguf` from PyPI.
"""
import argparse
import json
import sys

import numpy as np

try:
    import gguf
    import jax
    import jax.numpy as jnp
except ImportError as e:  # the engine never needs these; only end-to-end training does
    sys.exit(f"error: {e.name} is missing: pip install 'jax[cpu]' gguf")


def load_gguf(path):
    """(config, params): fp32 weights of a llama-architecture GGUF, layers stacked."""
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch}, not llama")

    def f(name):
        return r.fields[f"llama.{name}"].contents()

    cfg = {"n_layers": int(f("block_count")), "d": int(f("embedding_length")),
           "n_heads": int(f("attention.head_count")), "n_kv_heads": int(f("attention.head_count_kv")),
           "eps": float(f("attention.layer_norm_rms_epsilon")), "rope_base": float(f("rope.freq_base"))}
    cfg["head_dim"] = cfg["d"] // cfg["n_heads"]
    tensors = {t.name: t for t in r.tensors}

    def w(name):
        t = tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

    names = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "ffn_norm": "ffn_norm", "wg": "ffn_gate", "wu": "ffn_up", "wd": "ffn_down"}
    layers = {k: np.stack([w(f"blk.{i}.{v}.weight") for i in range(cfg["n_layers"])]) for k, v in names.items()}
    embd = w("token_embd.weight")
    params = {"embd": embd, "out_norm": w("output_norm.weight"), "layers": layers,
              "out": w("output.weight") if "output.weight" in tensors else embd}
    return cfg, jax.tree_util.tree_map(jnp.asarray, params)


def rms_norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, base):
    """GGUF llama RoPE: neighbouring pairs (2i, 2i + 1) rotated by pos * base^(-2i / dim)."""
    dim = x.shape[-1]
    ang = pos[:, None] * (base ** (-np.arange(0, dim, 2, dtype=np.float32) / dim))[None, :]
    c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1).reshape(x.shape)


def forward(cfg, params, tokens, kv_hook=None, hook_params=None):
    """Logits [T, vocab] for tokens [T] (one sequence from position 0, causal).

    With a hook, (logits, outs): kv_hook(layer, k, v, hp) -> (k, v, out) replaces the K
    (pre-RoPE) and V attention uses; hp is layer `layer`'s slice of hook_params (a pytree
    stacked along layers, or None) and outs the hook's outs stacked along layers.
    """
    n, nh, nkv, hd = tokens.shape[0], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    pos = jnp.arange(n, dtype=jnp.float32)
    causal = jnp.tril(jnp.ones((n, n), dtype=bool))

    def layer(x, xs):
        i, lw, hp = xs
        h = rms_norm(x, lw["attn_norm"], cfg["eps"])
        q, k, v = h @ lw["wq"].T, h @ lw["wk"].T, h @ lw["wv"].T
        out = None
        if kv_hook is not None:
            k, v, out = kv_hook(i, k, v, hp)
        q = rope(q.reshape(n, nh, hd), pos, cfg["rope_base"])
        k = jnp.repeat(rope(k.reshape(n, nkv, hd), pos, cfg["rope_base"]), nh // nkv, axis=1)
        v = jnp.repeat(v.reshape(n, nkv, hd), nh // nkv, axis=1)
        s = jnp.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        p = jax.nn.softmax(jnp.where(causal[None], s, -jnp.inf), axis=-1)
        x = x + jnp.einsum("hts,shd->thd", p, v).reshape(n, nh * hd) @ lw["wo"].T
        h = rms_norm(x, lw["ffn_norm"], cfg["eps"])
        return x + (jax.nn.silu(h @ lw["wg"].T) * (h @ lw["wu"].T)) @ lw["wd"].T, out

    xs = (jnp.arange(cfg["n_layers"]), params["layers"], hook_params)
    x, outs = jax.lax.scan(layer, params["embd"][tokens], xs)
    logits = rms_norm(x, params["out_norm"], cfg["eps"]) @ params["out"].T
    return logits if kv_hook is None else (logits, outs)


def kv_rows(cfg, params, tokens):
    """(logits, rows): rows [n_layers, T, 2 * kv_dim] are each layer's pre-RoPE [K; V]."""
    return forward(cfg, params, tokens, lambda i, k, v, hp: (k, v, jnp.concatenate([k, v], axis=-1)))


def check(cfg, params, golden_path):
    """Largest |logit - llama.cpp's| over the probes, and teacher-forced greedy agreement."""
    g = json.load(open(golden_path))
    probes = np.asarray(g["probe_ids"])
    fwd = jax.jit(lambda t: forward(cfg, params, t))
    worst, agree, steps = 0.0, 0, 0
    for pr in g["prompts"]:
        seq = np.asarray(pr["tokens"] + pr["greedy"], dtype=np.int32)
        # Padded at the end to a multiple of 64 (causal: earlier rows do not see it), so a
        # few shapes are compiled instead of one per prompt.
        padded = np.zeros((len(seq) + 63) // 64 * 64, dtype=np.int32)
        padded[:len(seq)] = seq
        logits = np.asarray(fwd(jnp.asarray(padded)))
        n = len(pr["tokens"])
        worst = max(worst, float(np.max(np.abs(logits[n - 1, probes] - np.asarray(pr["probe_logits"])))))
        # Steps where llama.cpp's top two are near a tie may go either way.
        for i, tok in enumerate(pr["greedy"]):
            if pr["greedy_top2_gap"][i] >= 0.5:
                agree += int(np.argmax(logits[n - 1 + i]) == tok)
                steps += 1
    return worst, agree, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="llama-architecture GGUF")
    ap.add_argument("--check", required=True, help="golden logits from llama.cpp (tests/data/smollm2_golden.json)")
    ap.add_argument("--max-diff", type=float, default=1.5, help="largest |logit difference| accepted")
    a = ap.parse_args()
    cfg, params = load_gguf(a.model)
    worst, agree, steps = check(cfg, params, a.check)
    print(json.dumps({"max_logit_diff": worst, "greedy_agree": agree, "greedy_steps": steps}))
    if worst > a.max_diff or agree < 0.95 * steps:
        sys.exit(f"error: the JAX forward does not match llama.cpp (max |diff| {worst:.3f}, "
                 f"{agree}/{steps} confident greedy steps)")


if __name__ == "__main__":
    main()
