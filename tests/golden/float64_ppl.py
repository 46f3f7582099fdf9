"""The float64 perplexity of a token sequence under a GGUF's weights (llama, qwen2 and
mistral layouts; every type the gguf package dequantizes, exactly): the reference beside
llama.cpp's in tests/data/llamacpp/*.json. No activation quantization, exact softmax."""
import numpy as np

import gguf


def _field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def float64_ppl(path, tokens):
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    if arch not in ("llama", "mistral"):
        raise SystemExit(f"float64_ppl: {arch} is not a llama-layout model")
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else a.reshape(-1)
    n_layer = int(_field(r, arch + ".block_count"))
    n_head = int(_field(r, arch + ".attention.head_count"))
    n_kv = int(_field(r, arch + ".attention.head_count_kv"))
    eps = float(_field(r, arch + ".attention.layer_norm_rms_epsilon"))
    base = float(_field(r, arch + ".rope.freq_base"))
    emb = w["token_embd.weight"]
    out = w.get("output.weight", emb)
    hd = emb.shape[1] // n_head
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    ang = pos[:, None] * base ** (-np.arange(0, hd, 2) / hd)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(z):  # GGUF llama weights are permuted for adjacent-pair rotation
        o = np.empty_like(z)
        o[..., 0::2] = z[..., 0::2] * cos - z[..., 1::2] * sin
        o[..., 1::2] = z[..., 0::2] * sin + z[..., 1::2] * cos
        return o

    mask = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, -np.inf)
    group = n_head // n_kv
    x = emb[tokens].copy()
    for layer in range(n_layer):
        p = f"blk.{layer}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, n_head, hd))
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, n_kv, hd))
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        att = np.empty((n, n_head, hd))
        for i in range(n_head):
            s = q[:, i] @ k[:, i // group].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(1, keepdims=True))
            att[:, i] = (s / s.sum(1, keepdims=True)) @ v[:, i // group]
        x = x + att.reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    logits = rms(x[:-1], w["output_norm.weight"]) @ out.T
    logits -= logits.max(1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    nll = -logp[np.arange(n - 1), np.asarray(tokens[1:])].sum()
    return float(np.exp(nll / (n - 1)))
