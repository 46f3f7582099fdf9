#!/usr/bin/env python3
"""Small random-weight models in each architecture's exact tensor layout, and their oracle.

    make_test_models.py write --tokenizer-from models/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR
    make_test_models.py oracle DIR/qwen3-f32.gguf --tokens 1,2,3 --greedy 8 --logits-out L.f64

`write` makes, with the tokenizer (every tokenizer.* key) of another GGUF:
  qwen3-{f32,f16,q8_0}.gguf    qwen3: head_dim 32 with d_model 64 (q_dim != d_model), QK norm,
                               no qkv bias, NeoX RoPE, tied output (as Qwen3's small models)
  llama3-{f32,f16,q8_0}.gguf   llama with rope_freqs.weight (llama3 RoPE scaling, factors as
                               llama.cpp's convert_hf_to_gguf.py makes them; original context 64
                               so that they matter at test lengths), q/k permuted as convert does
  llama-linear-f32.gguf        llama with rope.scaling.type linear, factor 4
  gemma3-{f32,f16,q8_0}.gguf   gemma3: embedding times sqrt(d), GeGLU (tanh GELU), pre and post
                               norms, QK norm, 5 sliding-window layers (window 48, RoPE base
                               1e4) then a global one (base 1e6); norms stored + 1 as convert
  hf-{llama3,qwen3,gemma3}-{f32,f16}/   the same weights as Hugging Face directories:
                               config.json, model.safetensors, tokenizer.json and
                               tokenizer_config.json made from the GGUF's tokenizer
  bad-*.gguf                   files deltaserve must refuse, one reason each (no tokenizer)
The GGUFs carry the keys and tensor names llama.cpp's converter writes for these
architectures, so llama.cpp loads them too.

`oracle` is an independent float64 numpy forward pass of a model file (GGUF or HF directory):
JSON {"n_vocab": n, "greedy": [ids], "gaps": [top-2 gap per step]} on stdout, and with
--logits-out every prompt token's logits (float64, little-endian, token after token).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

D, LAYERS, HEADS, KV_HEADS, FF, CTX = 64, 2, 4, 2, 128, 512
QWEN3 = dict(arch="qwen3", head_dim=32, base=1000000.0, eps=1e-6, tied=True)
LLAMA3 = dict(arch="llama", head_dim=16, base=10000.0, eps=1e-5, tied=False,
              llama3=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64))
LINEAR = dict(arch="llama", head_dim=16, base=10000.0, eps=1e-5, tied=False, linear=4.0)
# Gemma 3: 6 layers (5 local of sliding-window attention, then a global one), head_dim 32.
GEMMA3 = dict(arch="gemma3", head_dim=32, base=1000000.0, eps=1e-6, tied=True, layers=6,
              window=48, local_base=10000.0)
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7}


# --- weights, in the Hugging Face layout -------------------------------------------------

def random_weights(spec, vocab, seed):
    """Every tensor as Hugging Face names it, float32, scaled so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    hd = spec["head_dim"]
    q_dim, kv_dim = HEADS * hd, KV_HEADS * hd

    def mat(rows, cols, gain=1.0):
        return (gain * rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((vocab, D)).astype(np.float32)}
    gemma = spec["arch"] == "gemma3"
    if gemma:  # Gemma scales the embedding by sqrt(d) and stores its norms as w - 1
        w["model.embed_tokens.weight"] /= math.sqrt(D)
        norm_ = norm
        norm = lambda n: norm_(n) - 1.0  # noqa: E731
    for i in range(spec.get("layers", LAYERS)):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(D)
        w[p + "self_attn.q_proj.weight"] = mat(q_dim, D, 2.0)
        w[p + "self_attn.k_proj.weight"] = mat(kv_dim, D, 2.0)
        w[p + "self_attn.v_proj.weight"] = mat(kv_dim, D)
        w[p + "self_attn.o_proj.weight"] = mat(D, q_dim)
        if spec["arch"] in ("qwen3", "gemma3"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(D)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(D)
            w[p + "post_feedforward_layernorm.weight"] = norm(D)
        w[p + "mlp.gate_proj.weight"] = mat(FF, D)
        w[p + "mlp.up_proj.weight"] = mat(FF, D)
        w[p + "mlp.down_proj.weight"] = mat(D, FF)
    w["model.norm.weight"] = norm(D)
    if not spec["tied"]:
        w["lm_head.weight"] = mat(vocab, D, 3.0)
    return w


def llama3_factors(base, head_dim, s):
    """convert_hf_to_gguf.py's rope_factors (LlamaModel.generate_extra_tensors), in float32
    as torch computes them there."""
    f32 = np.float32
    freqs = f32(1.0) / np.power(f32(base), np.arange(0, head_dim, 2, dtype=f32) / f32(head_dim))
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = f32(old / s["low_freq_factor"]), f32(old / s["high_freq_factor"])
    out = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(f32(1))
        elif wavelen > low_wavelen:
            out.append(f32(s["factor"]))
        else:
            smooth = (f32(old) / wavelen - f32(s["low_freq_factor"])) / \
                f32(s["high_freq_factor"] - s["low_freq_factor"])
            out.append(f32(1) / ((f32(1) - smooth) / f32(s["factor"]) + smooth))
    return np.array(out, dtype=np.float32)


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: split-half rows to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


# --- GGUF --------------------------------------------------------------------------------

def tokenizer_fields(path):
    r = gguf.GGUFReader(path)
    out = []
    for key, f in r.fields.items():
        if key.startswith("tokenizer."):
            sub = f.types[1] if f.types[0] == VT.ARRAY else None
            out.append((key, f.contents(), f.types[0], sub))
    return out


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


GEMMA_NAMES = dict(GGUF_NAMES, **{
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
})


def gguf_tensors(spec, w):
    """(name, float32 array) in llama.cpp's names and layout."""
    out = []
    gemma = spec["arch"] == "gemma3"
    names = GEMMA_NAMES if gemma else GGUF_NAMES
    for name, t in w.items():
        if gemma and name.endswith("norm.weight"):
            t = t + np.float32(1)  # convert_hf_to_gguf.py's Gemma3Model adds the 1
        if name == "model.embed_tokens.weight":
            out.append(("token_embd.weight", t))
        elif name == "model.norm.weight":
            out.append(("output_norm.weight", t))
        elif name == "lm_head.weight":
            out.append(("output.weight", t))
        else:
            i, rest = name[len("model.layers."):].split(".", 1)
            if spec["arch"] == "llama" and rest == "self_attn.q_proj.weight":
                t = permute(t, HEADS)
            if spec["arch"] == "llama" and rest == "self_attn.k_proj.weight":
                t = permute(t, KV_HEADS)
            out.append((f"blk.{i}.{names[rest]}", t))
    if "llama3" in spec:
        out.insert(0, ("rope_freqs.weight", llama3_factors(spec["base"], spec["head_dim"],
                                                           spec["llama3"])))
    return out


def write_gguf(path, spec, w, dtype, tok, extra_keys=(), extra_tensors=(), arch=None):
    a = arch or spec["arch"]
    g = gguf.GGUFWriter(path, a)
    g.add_name(os.path.basename(path))
    g.add_file_type(FILE_TYPE[dtype])
    g.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocab = w["model.embed_tokens.weight"].shape[0]
    g.add_vocab_size(vocab)
    g.add_context_length(CTX)
    g.add_embedding_length(D)
    g.add_block_count(spec.get("layers", LAYERS))
    g.add_feed_forward_length(FF)
    g.add_head_count(HEADS)
    g.add_head_count_kv(KV_HEADS)
    g.add_rope_freq_base(spec["base"])
    g.add_layer_norm_rms_eps(spec["eps"])
    if spec["arch"] != "gemma3":  # Gemma3Model writes none
        g.add_rope_dimension_count(spec["head_dim"])
    if "window" in spec:
        g.add_sliding_window(spec["window"])
    if spec["head_dim"] != D // HEADS or spec["arch"] in ("qwen3", "gemma3"):
        g.add_key_length(spec["head_dim"])
        g.add_value_length(spec["head_dim"])
    if "linear" in spec:
        g.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        g.add_rope_scaling_factor(spec["linear"])
    for key, val, vt, sub in extra_keys:
        g.add_key_value(key.replace("{arch}", a), val, vt, sub)
    for key, val, vt, sub in tok:
        g.add_key_value(key, val, vt, sub)
    if dtype == "f16":  # what an f16 checkpoint holds: its norms' f16 values, in F32 here
        w = {k: v.astype(np.float16).astype(np.float32) if v.ndim == 1 else v
             for k, v in w.items()}
    for name, t in list(gguf_tensors(spec, w)) + list(extra_tensors):
        if t.ndim == 1 or dtype == "f32":
            g.add_tensor(name, t.astype(np.float32))
        elif dtype == "f16":
            g.add_tensor(name, t.astype(np.float16))
        else:
            g.add_tensor(name, gguf.quants.quantize(t, QT.Q8_0), raw_dtype=QT.Q8_0)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


# --- Hugging Face ------------------------------------------------------------------------

def write_safetensors(path, tensors, dtype):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].astype(np.float16 if dtype == "f16" else np.float32).tobytes()
        header[name] = {"dtype": "F16" if dtype == "f16" else "F32",
                        "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_hf_tokenizer(out, tok):
    """tokenizer.json (byte-level BPE, SmolLM2's pre-tokenizer) from a GGUF's tokenizer."""
    f = {key: val for key, val, _, _ in tok}
    tokens, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": f["tokenizer.ggml.merges"]},
    }
    if f.get("tokenizer.ggml.pre") != "smollm":
        sys.exit("make_test_models: the tokenizer source must be SmolLM2's (pre 'smollm')")
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, ensure_ascii=False)
    cfg = {"bos_token": tokens[f["tokenizer.ggml.bos_token_id"]],
           "eos_token": tokens[f["tokenizer.ggml.eos_token_id"]], "add_bos_token": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh, ensure_ascii=False)


def write_hf(out, spec, w, dtype, tok, cfg_extra=None, tensors_extra=None):
    os.makedirs(out, exist_ok=True)
    qwen3 = spec["arch"] == "qwen3"
    vocab = w["model.embed_tokens.weight"].shape[0]
    cls = {"qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
    cfg = {
        "architectures": [cls.get(spec["arch"], "LlamaForCausalLM")],
        "model_type": spec["arch"], "hidden_size": D, "intermediate_size": FF,
        "num_hidden_layers": spec.get("layers", LAYERS), "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": spec["head_dim"], "vocab_size": vocab,
        "max_position_embeddings": CTX, "rms_norm_eps": spec["eps"], "rope_theta": spec["base"],
        "tie_word_embeddings": spec["tied"], "hidden_act": "silu", "attention_bias": False,
        "torch_dtype": "float16" if dtype == "f16" else "float32",
    }
    if qwen3:
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=LAYERS)
    if spec["arch"] == "gemma3":
        del cfg["hidden_act"]
        cfg.update(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=spec["head_dim"], sliding_window=spec["window"],
                   sliding_window_pattern=6, rope_local_base_freq=spec["local_base"],
                   final_logit_softcapping=None, attn_logit_softcapping=None)
        if dtype == "f16":  # newer transformers list the layers' types instead
            del cfg["sliding_window_pattern"]
            cfg["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                  for i in range(spec["layers"])]
    if "llama3" in spec:
        cfg["rope_scaling"] = dict(rope_type="llama3", **spec["llama3"])
        # convert_hf_to_gguf.py reads this one from the top level.
        cfg["original_max_position_embeddings"] = spec["llama3"]["original_max_position_embeddings"]
    cfg.update(cfg_extra or {})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(os.path.join(out, "model.safetensors"), dict(w, **(tensors_extra or {})),
                      dtype)
    if tok:
        write_hf_tokenizer(out, tok)


# --- the files ---------------------------------------------------------------------------

def write_bad(out, vocab_small):
    """One reason each to refuse; small vocabulary, no tokenizer (refused before it)."""
    w = random_weights(QWEN3, vocab_small, 7)
    wl = random_weights(LLAMA3, vocab_small, 8)
    one = np.ones(1, dtype=np.float32)
    cases = {
        "bad-unused-tensor": (QWEN3, w, [], [("blk.0.attn_rot_embd", one)], None),
        "bad-extra-layer": (QWEN3, w, [], [("blk.2.attn_norm.weight", np.ones(D, np.float32))],
                            None),
        "bad-qwen3-rope-freqs": (QWEN3, w, [], [("rope_freqs.weight",
                                                 np.ones(16, np.float32))], None),
        "bad-yarn": (QWEN3, w, [("{arch}.rope.scaling.type", "yarn", VT.STRING, None),
                                ("{arch}.rope.scaling.factor", 4.0, VT.FLOAT32, None)], [], None),
        "bad-scaling-type": (QWEN3, w, [("{arch}.rope.scaling.type", "ntk", VT.STRING, None)],
                             [], None),
        "bad-softcap": (QWEN3, w, [("{arch}.final_logit_softcapping", 30.0, VT.FLOAT32, None)],
                        [], None),
        "bad-attn-softcap": (QWEN3, w, [("{arch}.attn_logit_softcapping", 50.0, VT.FLOAT32,
                                         None)], [], None),
        "bad-sliding-window": (QWEN3, w, [("{arch}.attention.sliding_window", 16, VT.UINT32,
                                           None)], [], None),
        "bad-experts": (QWEN3, w, [("{arch}.expert_count", 8, VT.UINT32, None),
                                   ("{arch}.expert_used_count", 2, VT.UINT32, None)], [], None),
        "bad-unknown-key": (QWEN3, w, [("{arch}.attention.temperature_scale", 0.5, VT.FLOAT32,
                                        None)], [], None),
        "bad-factor-nan": (QWEN3, w, [("{arch}.rope.scaling.factor", float("nan"), VT.FLOAT32,
                                       None)], [], None),
        "bad-qwen3moe": (QWEN3, w, [], [], "qwen3moe"),
        "bad-rope-freqs-nan": (None, wl, [], [], None),
        "bad-rope-freqs-shape": (None, wl, [], [], None),
    }
    hf_cases = {
        "hf-bad-yarn": (QWEN3, w, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 64}}, {}),
        "hf-bad-dynamic": (QWEN3, w, {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, {}),
        "hf-bad-partial-rotary": (QWEN3, w, {"partial_rotary_factor": 0.5}, {}),
        "hf-bad-softcap": (QWEN3, w, {"final_logit_softcapping": 30.0}, {}),
        "hf-bad-experts": (QWEN3, w, {"num_experts": 8}, {}),
        "hf-bad-unused-tensor": (QWEN3, w, {}, {"model.layers.0.mlp.gate_proj.scales": one}),
        "hf-bad-llama3-span": (LLAMA3, wl, {"rope_scaling": dict(
            LLAMA3["llama3"], rope_type="llama3", high_freq_factor=1.0)}, {}),
    }
    for name, (spec, weights, cfg, tensors) in hf_cases.items():
        write_hf(os.path.join(out, name), spec, weights, "f32", None, cfg, tensors)
    for name, (spec, weights, keys, tensors, arch) in cases.items():
        if spec is None:  # llama3 with a broken rope_freqs.weight
            spec = dict(LLAMA3)
            spec.pop("llama3")
            bad = np.ones(LLAMA3["head_dim"] // 2 + (1 if "shape" in name else 0), np.float32)
            if "nan" in name:
                bad[3] = np.nan
            tensors = [("rope_freqs.weight", bad)]
        write_gguf(os.path.join(out, name + ".gguf"), spec, weights, "f32", [], keys, tensors,
                   arch)


def write_all(a):
    os.makedirs(a.out, exist_ok=True)
    if a.only_bad:
        write_bad(a.out, 256)
        print(f"make_test_models: wrote the refused files into {a.out}")
        return
    tok = tokenizer_fields(a.tokenizer_from)
    vocab = len(next(v for k, v, _, _ in tok if k == "tokenizer.ggml.tokens"))
    specs = {"qwen3": (QWEN3, 1), "llama3": (LLAMA3, 2), "gemma3": (GEMMA3, 4)}
    for name, (spec, seed) in specs.items():
        w = random_weights(spec, vocab, seed)
        for dtype in ("f32", "f16", "q8_0"):
            write_gguf(os.path.join(a.out, f"{name}-{dtype}.gguf"), spec, w, dtype, tok)
        for dtype in ("f32", "f16"):
            write_hf(os.path.join(a.out, f"hf-{name}-{dtype}"), spec, w, dtype, tok)
    write_gguf(os.path.join(a.out, "llama-linear-f32.gguf"), LINEAR,
               random_weights(LINEAR, vocab, 3), "f32", tok)
    print(f"make_test_models: wrote {a.out}")


# --- the oracle: a float64 forward pass --------------------------------------------------

def load_gguf(path):
    r = gguf.GGUFReader(path)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    arch = kv["general.architecture"]
    t = {x.name: gguf.quants.dequantize(x.data, x.tensor_type).astype(np.float64)
         for x in r.tensors}
    hd = kv.get(f"{arch}.attention.key_length",
                kv[f"{arch}.embedding_length"] // kv[f"{arch}.attention.head_count"])
    scale = 1.0
    if kv.get(f"{arch}.rope.scaling.type", "linear") == "linear":
        scale = 1.0 / kv.get(f"{arch}.rope.scaling.factor", 1.0)
    gemma = arch == "gemma3"
    window = kv.get(f"{arch}.attention.sliding_window", 0) if gemma else 0
    m = dict(arch=arch, head_dim=hd, heads=kv[f"{arch}.attention.head_count"],
             gemma=gemma, window=window, local_base=kv.get(f"{arch}.rope.freq_base_swa", 1e4),
             local=[window > 0 and i % 6 < 5 for i in range(kv[f"{arch}.block_count"])],
             attn_scale=1 / math.sqrt(hd),
             kv_heads=kv[f"{arch}.attention.head_count_kv"], layers=kv[f"{arch}.block_count"],
             eps=kv[f"{arch}.attention.layer_norm_rms_epsilon"],
             base=kv[f"{arch}.rope.freq_base"], freq_scale=scale,
             factors=t.get("rope_freqs.weight"), neox=arch != "llama",
             embed=t["token_embd.weight"], out_norm=t["output_norm.weight"],
             output=t.get("output.weight", t["token_embd.weight"]), blocks=[])
    for i in range(m["layers"]):
        p = f"blk.{i}."
        m["blocks"].append({k: t.get(p + v) for k, v in dict(
            attn_norm="attn_norm.weight", wq="attn_q.weight", wk="attn_k.weight",
            wv="attn_v.weight", wo="attn_output.weight", q_norm="attn_q_norm.weight",
            k_norm="attn_k_norm.weight", ffn_norm="ffn_norm.weight", gate="ffn_gate.weight",
            attn_post="post_attention_norm.weight", ffn_post="post_ffw_norm.weight",
            up="ffn_up.weight", down="ffn_down.weight").items()})
    return m


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dt = {"F32": np.float32, "F16": np.float16}[e["dtype"]]
        out[name] = np.frombuffer(data[b:end], dtype=dt).reshape(e["shape"]).astype(np.float64)
    return out


def load_hf(path):
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    t = read_safetensors(os.path.join(path, "model.safetensors"))
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    factors, scale = None, 1.0
    s = c.get("rope_scaling") or {}
    if s.get("rope_type") == "llama3":
        factors = llama3_factors(c["rope_theta"], hd, s).astype(np.float64)
    elif s.get("rope_type") == "linear":
        scale = 1.0 / s["factor"]
    gemma = c["model_type"] == "gemma3_text"
    window = c.get("sliding_window") or 0 if gemma else 0
    pattern = c.get("sliding_window_pattern", 6)
    types = c.get("layer_types") or ["full_attention" if (i + 1) % pattern == 0 else
                                     "sliding_attention" for i in range(c["num_hidden_layers"])]
    m = dict(arch=c["model_type"], head_dim=hd, heads=c["num_attention_heads"],
             gemma=gemma, window=window, local_base=c.get("rope_local_base_freq", 1e4),
             local=[window > 0 and t == "sliding_attention" for t in types],
             attn_scale=1 / math.sqrt(c.get("query_pre_attn_scalar", hd)),
             kv_heads=c["num_key_value_heads"], layers=c["num_hidden_layers"],
             eps=c["rms_norm_eps"], base=c["rope_theta"], freq_scale=scale, factors=factors,
             neox=True, embed=t["model.embed_tokens.weight"], out_norm=t["model.norm.weight"],
             output=t.get("lm_head.weight", t["model.embed_tokens.weight"]), blocks=[])
    for i in range(m["layers"]):
        p = f"model.layers.{i}."
        m["blocks"].append({k: t.get(p + v) for k, v in dict(
            attn_norm="input_layernorm.weight", wq="self_attn.q_proj.weight",
            wk="self_attn.k_proj.weight", wv="self_attn.v_proj.weight",
            wo="self_attn.o_proj.weight", q_norm="self_attn.q_norm.weight",
            k_norm="self_attn.k_norm.weight",
            ffn_norm="pre_feedforward_layernorm.weight" if gemma else
            "post_attention_layernorm.weight",
            attn_post="post_attention_layernorm.weight" if gemma else "-",
            ffn_post="post_feedforward_layernorm.weight" if gemma else "-",
            gate="mlp.gate_proj.weight", up="mlp.up_proj.weight",
            down="mlp.down_proj.weight").items()})
    if gemma:  # Gemma's RMSNorm multiplies by 1 + weight
        m["out_norm"] = m["out_norm"] + 1
        for b in m["blocks"]:
            for k in ("attn_norm", "q_norm", "k_norm", "ffn_norm", "attn_post", "ffn_post"):
                b[k] = b[k] + 1
    return m


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, m, local=False):
    """x: [n, heads, hd]; theta_j = pos * base^(-2j/hd) / factors[j] * freq_scale (a local
    layer: its own base, unscaled)."""
    hd = m["head_dim"]
    theta = (m["local_base"] if local else m["base"]) ** (-np.arange(0, hd, 2) / hd)
    if m["factors"] is not None and not local:
        theta = theta / m["factors"]
    ang = pos[:, None, None] * theta[None, None, :] * (1.0 if local else m["freq_scale"])
    c, s = np.cos(ang), np.sin(ang)
    if m["neox"]:
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


def forward(m, tokens):
    """Logits of every position, float64, causal attention over all tokens."""
    n, hd, nh, nkv = len(tokens), m["head_dim"], m["heads"], m["kv_heads"]
    x = m["embed"][tokens] * (math.sqrt(m["embed"].shape[1]) if m["gemma"] else 1.0)
    pos = np.arange(n, dtype=np.float64)
    causal = np.triu(np.full((n, n), -np.inf), 1)
    # A local layer's query at p sees the keys at p - window + 1 .. p.
    windowed = causal + np.tril(np.full((n, n), -np.inf), -m["window"]) if m["window"] else causal
    for b, local in zip(m["blocks"], m["local"]):
        mask = windowed if local else causal
        h = rms_norm(x, b["attn_norm"], m["eps"])
        q = (h @ b["wq"].T).reshape(n, nh, hd)
        k = (h @ b["wk"].T).reshape(n, nkv, hd)
        v = (h @ b["wv"].T).reshape(n, nkv, hd)
        if b["q_norm"] is not None:
            q, k = rms_norm(q, b["q_norm"], m["eps"]), rms_norm(k, b["k_norm"], m["eps"])
        q, k = rope(q, pos, m, local), rope(k, pos, m, local)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) * m["attn_scale"] + mask
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", p, v).reshape(n, nh * hd) @ b["wo"].T
        x = x + (rms_norm(a, b["attn_post"], m["eps"]) if m["gemma"] else a)
        h = rms_norm(x, b["ffn_norm"], m["eps"])
        g = h @ b["gate"].T
        if m["gemma"]:  # GeGLU, tanh GELU
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        else:
            act = g / (1 + np.exp(-g))
        f = (act * (h @ b["up"].T)) @ b["down"].T
        x = x + (rms_norm(f, b["ffn_post"], m["eps"]) if m["gemma"] else f)
    return rms_norm(x, m["out_norm"], m["eps"]) @ m["output"].T


def oracle(a):
    m = load_hf(a.model) if os.path.isdir(a.model) else load_gguf(a.model)
    if a.plain_rope:
        m["factors"], m["freq_scale"] = None, 1.0
    tokens = [int(t) for t in a.tokens.split(",")]
    logits = forward(m, tokens)
    greedy, gaps, seq = [], [], list(tokens)
    last = logits[-1]
    for _ in range(a.greedy):
        top2 = np.argsort(last)[-2:]
        greedy.append(int(top2[1]))
        gaps.append(float(last[top2[1]] - last[top2[0]]))
        seq.append(greedy[-1])
        last = forward(m, seq)[-1]
    if a.logits_out:
        logits.astype("<f8").tofile(a.logits_out)
    json.dump({"n_vocab": logits.shape[1], "greedy": greedy, "gaps": gaps}, sys.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the test models")
    w.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer is taken")
    w.add_argument("--out", required=True)
    w.add_argument("--only-bad", action="store_true", help="only the files to refuse")
    o = sub.add_parser("oracle", help="float64 logits and greedy continuation, as JSON")
    o.add_argument("model")
    o.add_argument("--tokens", required=True, help="comma-separated token ids")
    o.add_argument("--greedy", type=int, default=0, help="greedy steps after the prompt")
    o.add_argument("--plain-rope", action="store_true", help="ignore the RoPE scaling")
    o.add_argument("--logits-out", help="every token's logits, float64 little-endian, here")
    a = ap.parse_args()
    write_all(a) if a.cmd == "write" else oracle(a)


if __name__ == "__main__":
    main()
