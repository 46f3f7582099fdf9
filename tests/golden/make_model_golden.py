#!/usr/bin/env python3
"""Writes tests/data/smollm2_golden.json: reference outputs of SmolLM2-135M-Instruct (Q4_1).

For each prompt it records what llama.cpp does with it, so deltaserve's tests can check the
tokenizer, the forward pass and greedy decoding without llama.cpp installed:

  - the prompt text and its token ids (llama_tokenize, flags recorded per prompt);
  - the next-token logits after the prompt, compactly: the top-40 (id, logit) pairs, the
    logits at 200 fixed vocab ids (`probe_ids`, drawn once for the whole file by a seeded
    RNG), and the mean and standard deviation of the full logit vector;
  - the 64-token greedy continuation (argmax at every step, no sampling, no penalties, no
    stop at end-of-generation tokens) plus, per step, the gap between the best and the
    second-best logit, so a test can tell a real divergence from a near-tie flipping.

The top-level fields of each prompt record come from llama.cpp with its default settings
(flash attention "auto", which is enabled on the CPU backend; f16 KV cache; 2 threads).
`variants` repeats the same measurements for
  - `llamacpp_flash_attn_off`: llama.cpp with flash attention disabled. The two llama.cpp runs
    differ by up to ~1.5 logits, which shows how much of the difference is llama.cpp's own
    rounding (Q8 activations, f16 attention) rather than a bug;
  - `numpy_f64`: a float64 NumPy forward pass over the same GGUF weights (dequantized
    exactly, no activation quantization). An engine that keeps activations in f32 should be
    much closer to this than to llama.cpp. Skip it with --skip-reference.

Uses the low-level llama_cpp API (one context per variant, memory cleared between prompts) so
nothing in the high-level wrapper (sampling, prompt cache, stop at EOS) gets in the way.

Usage (from the repository root, with the venv described in tests/golden/README.md):
  .venv/bin/python tests/golden/make_model_golden.py \
      [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out tests/data/smollm2_golden.json]
"""

import argparse
import ctypes
import datetime
import glob
import json
import os
import random
import struct
import sys

import numpy as np
import llama_cpp as lc

kTopK = 40
kNumProbes = 200
kProbeSeed = 20240601
kGenTokens = 64
kThreads = 2
kCtx = 1024
kBatch = 512

kSystem = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

kLongParagraph = (
    "The history of computing stretches back thousands of years, from the abacus used by "
    "merchants in ancient Mesopotamia to the mechanical calculators of the seventeenth "
    "century. Blaise Pascal built a machine that could add and subtract, and Gottfried "
    "Leibniz improved on it with a design that could also multiply. In the nineteenth "
    "century Charles Babbage designed the Analytical Engine, a general-purpose machine "
    "programmed with punched cards, and Ada Lovelace wrote what many consider the first "
    "computer program for it. The twentieth century brought electronic computers: Colossus "
    "helped break codes during the Second World War, and ENIAC filled a large room with "
    "vacuum tubes. The invention of the transistor in 1947 and the integrated circuit a "
    "decade later made machines smaller, faster and cheaper, leading to the personal "
    "computers of the 1970s and 1980s and, eventually, to the smartphones that billions of "
    "people carry today. In summary,"
)


def chatml(turns):
    """Renders [(role, text), ...] with SmolLM2's ChatML template plus the generation prompt."""
    out = f"<|im_start|>system\n{kSystem}<|im_end|>\n"
    for role, text in turns:
        out += f"<|im_start|>{role}\n{text}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def prompts():
    """(name, category, text, add_special, parse_special) for the 24 prompts."""
    plain = [
        ("capital_france", "The capital of France is"),
        ("story_village", "Once upon a time, in a small village nestled between two mountains, "
                          "there lived a"),
        ("photosynthesis", "Photosynthesis is the process by which plants"),
        ("planets_list", "Here is a list of the planets in our solar system, in order from the "
                         "Sun:"),
        ("repetition_fox", "The quick brown fox jumps over the lazy dog. The quick brown fox "
                           "jumps over the lazy dog. The quick brown fox"),
        ("long_history", kLongParagraph),
    ]
    code = [
        ("py_fibonacci", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
        ("c_hello", "#include <stdio.h>\n\nint main(void) {\n    printf(\""),
        ("sql_groupby", "SELECT name, COUNT(*) AS n\nFROM orders\n"
                        "WHERE created_at >= '2024-01-01'\nGROUP BY"),
        ("rust_sum", "fn main() {\n    let v: Vec<i32> = (1..=10).collect();\n"
                     "    let sum: i32 ="),
        ("json_object", '{"name": "Alice", "age": 30, "languages": ['),
    ]
    uni = [
        ("latin_accents", "Café, naïve, résumé, and jalapeño are words with"),
        ("japanese", "日本の首都は"),
        ("russian", "Привет! Как дела? Сегодня"),
        ("emoji", "Emoji test: 🎉🚀🔥 — the party rocket is on fire! 😀 means"),
        ("whitespace", "  Leading spaces\tand\ttabs\n\n\nand newlines   "),
    ]
    digits = [
        ("count_up", "1, 2, 3, 4, 5, 6, 7, 8,"),
        ("numbers_mixed", "The year 1969 was when humans first landed on the Moon. 3.14159 is "
                          "pi, and 2^10 ="),
        ("big_addition", "12345678901234567890 + 98765432109876543210 ="),
    ]
    chat = [
        ("chat_capital", [("user", "What is the capital of France?")]),
        ("chat_haiku", [("user", "Write a haiku about the ocean.")]),
        ("chat_recursion", [("user", "Explain recursion to a five-year-old.")]),
        ("chat_arith", [("user", "What is 17 * 23?")]),
        ("chat_multiturn", [("user", "Hi!"),
                            ("assistant", "Hello! How can I help you today?"),
                            ("user", "Tell me a fun fact about octopuses.")]),
    ]
    out = []
    for cat, items in (("plain", plain), ("code", code), ("unicode", uni), ("digits", digits)):
        # The model's GGUF says add_bos_token=false, so add_special adds nothing; kept True
        # to mirror llama.cpp's CLI default.
        out += [(name, cat, text, True, False) for name, text in items]
    out += [(name, "chatml", chatml(turns), False, True) for name, turns in chat]
    return out


class Quiet:
    """Captures llama.cpp's log lines instead of printing them (some are recorded)."""

    def __init__(self):
        self.lines = []

        @lc.llama_log_callback
        def cb(level, text, user_data):
            self.lines.append(text.decode("utf-8", errors="replace"))

        self._cb = cb  # keep the ctypes thunk alive
        lc.llama_log_set(cb, ctypes.c_void_p(0))

    def grep(self, word, start=0):
        text = "".join(self.lines[start:])
        return [l.strip() for l in text.splitlines() if word in l]


class LlamaEngine:
    """One llama.cpp context over a shared model; decode() returns the last token's logits."""

    def __init__(self, model, flash_attn_type, quiet):
        cp = lc.llama_context_default_params()
        cp.n_ctx = kCtx
        cp.n_batch = kBatch
        cp.n_ubatch = kBatch
        cp.n_threads = kThreads
        cp.n_threads_batch = kThreads
        if flash_attn_type is not None:
            cp.flash_attn_type = flash_attn_type
        mark = len(quiet.lines)
        self.ctx = lc.llama_init_from_model(model, cp)
        if not self.ctx:
            sys.exit("cannot create llama.cpp context")
        self.flags = {
            "n_ctx": kCtx, "n_batch": kBatch, "n_ubatch": kBatch,
            "n_threads": kThreads, "n_threads_batch": kThreads,
            "flash_attn_type": int(cp.flash_attn_type),
            "flash_attn_log": quiet.grep("flash_attn", mark),
            "type_k": int(cp.type_k), "type_v": int(cp.type_v),
        }
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        self.batch = lc.llama_batch_init(kBatch, 0, 1)

    def clear(self):
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)

    def decode(self, toks, pos0):
        """Evaluates toks at positions pos0.., returns the logits after the last one."""
        assert 0 < len(toks) <= kBatch
        b = self.batch
        for i, t in enumerate(toks):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(toks) - 1
        b.n_tokens = len(toks)
        rc = lc.llama_decode(self.ctx, b)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")
        ptr = lc.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)

    def free(self):
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)


class Vocab:
    def __init__(self, model):
        self.vocab = lc.llama_model_get_vocab(model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text, add_special, parse_special):
        raw = text.encode("utf-8")
        buf = (lc.llama_token * (len(raw) + 16))()
        n = lc.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), add_special,
                              parse_special)
        if n < 0:
            sys.exit(f"tokenize failed for {text!r}")
        return list(buf[:n])

    def text(self, toks):
        out = b""
        for t in toks:
            buf = ctypes.create_string_buffer(256)
            n = lc.llama_token_to_piece(self.vocab, t, buf, len(buf), 0, True)
            out += buf.raw[:n]
        return out.decode("utf-8", errors="replace")

    def is_eog(self, tok):
        return bool(lc.llama_vocab_is_eog(self.vocab, tok))


# ---------------------------------------------------------------------------------------------
# float64 NumPy reference: the same GGUF weights, dequantized exactly, run in double precision
# with no activation quantization and an exact softmax. llama.cpp differs from this by ~0.1-0.4
# rms in the logits (Q8 activations, f16 KV/attention); an f32 engine should sit much closer.


def read_gguf(path):
    """Returns (metadata, {tensor name: float64 array shaped [ne1, ne0]}); F32/Q4_1/Q8_0 only."""
    data = open(path, "rb").read()
    off = 0

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)[0]
        off += struct.calcsize("<" + fmt)
        return v

    def rstr():
        nonlocal off
        n = rd("Q")
        off += n
        return data[off - n:off].decode("utf-8", errors="replace")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
              12: "d"}

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [rval(et) for _ in range(n)]
        return rd(scalar[t])

    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    off = 8  # magic + version
    n_tensors, n_kv = rd("Q"), rd("Q")
    meta = {}
    for _ in range(n_kv):
        key, t = rstr(), rd("I")
        meta[key] = rval(t)
    infos = []
    for _ in range(n_tensors):
        name, nd = rstr(), rd("I")
        dims = [rd("Q") for _ in range(nd)]
        infos.append((name, dims, rd("I"), rd("Q")))
    align = meta.get("general.alignment", 32)
    base = (off + align - 1) // align * align
    tensors = {}
    for name, dims, t, o in infos:
        n = int(np.prod(dims))
        if t == 0:  # F32
            a = np.frombuffer(data, np.float32, n, base + o).astype(np.float64)
        elif t == 3:  # Q4_1: f16 d, f16 m, 16 bytes of nibbles (low nibbles = first 16 values)
            b = np.frombuffer(data, np.uint8, n // 32 * 20, base + o).reshape(-1, 20)
            d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
            m = b[:, 2:4].copy().view(np.float16).astype(np.float64)
            q = np.concatenate([b[:, 4:] & 15, b[:, 4:] >> 4], axis=1).astype(np.float64)
            a = (q * d + m).reshape(-1)
        elif t == 8:  # Q8_0: f16 d, 32 int8
            b = np.frombuffer(data, np.uint8, n // 32 * 34, base + o).reshape(-1, 34)
            d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
            a = (b[:, 2:].copy().view(np.int8).astype(np.float64) * d).reshape(-1)
        else:
            sys.exit(f"{name}: ggml type {t} not supported by the NumPy reference")
        tensors[name] = a.reshape(list(reversed(dims)))
    return meta, tensors


class ReferenceEngine:
    """Llama-architecture forward pass in float64 with a KV cache (NORM rope, GQA, SwiGLU)."""

    def __init__(self, path):
        meta, self.w = read_gguf(path)
        self.n_layer = meta["llama.block_count"]
        self.n_head = meta["llama.attention.head_count"]
        self.n_head_kv = meta["llama.attention.head_count_kv"]
        self.eps = meta["llama.attention.layer_norm_rms_epsilon"]
        self.rope_base = meta["llama.rope.freq_base"]
        self.embd = self.w["token_embd.weight"]
        self.out = self.w.get("output.weight", self.embd)  # tied embeddings
        self.n_vocab, self.n_embd = self.out.shape
        self.head_dim = self.n_embd // self.n_head
        self.flags = {"dtype": "float64", "weights": "dequantized from the GGUF exactly",
                      "rope": "NORM (adjacent pairs)", "tied_output": "output.weight" not in self.w}
        self.clear()

    def clear(self):
        self.k = [None] * self.n_layer
        self.v = [None] * self.n_layer

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, z, pos):
        hd = self.head_dim
        ang = pos[:, None] * self.rope_base ** (-np.arange(0, hd, 2) / hd)[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = np.empty_like(z)
        out[..., 0::2] = z[..., 0::2] * c - z[..., 1::2] * s
        out[..., 1::2] = z[..., 0::2] * s + z[..., 1::2] * c
        return out

    def decode(self, toks, pos0):
        n, hd, w = len(toks), self.head_dim, self.w
        pos = np.arange(pos0, pos0 + n, dtype=np.float64)
        x = self.embd[toks].copy()
        n_past = pos0 + n
        mask = np.where(np.arange(n_past)[None, :] <= (pos0 + np.arange(n))[:, None], 0.0, -np.inf)
        group = self.n_head // self.n_head_kv
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(n, self.n_head, hd), pos)
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, hd), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, hd)
            self.k[l] = k if self.k[l] is None else np.concatenate([self.k[l], k])
            self.v[l] = v if self.v[l] is None else np.concatenate([self.v[l], v])
            att = np.empty((n, self.n_head, hd))
            for hh in range(self.n_head):
                sc = q[:, hh, :] @ self.k[l][:, hh // group, :].T / np.sqrt(hd) + mask
                sc = np.exp(sc - sc.max(1, keepdims=True))
                att[:, hh, :] = (sc / sc.sum(1, keepdims=True)) @ self.v[l][:, hh // group, :]
            x = x + att.reshape(n, -1) @ w[p + "attn_output.weight"].T
            h = self.rms(x, w[p + "ffn_norm.weight"])
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
        return self.out @ self.rms(x[-1], w["output_norm.weight"])

    def free(self):
        pass


# ---------------------------------------------------------------------------------------------


def top2_gap(logits):
    a, b = np.partition(logits, -2)[-2:]
    return float(max(a, b) - min(a, b))


def run_prompt(eng, vocab, probe_ids, toks):
    """Prompt logits (compact) and the greedy continuation for one engine."""
    eng.clear()
    logits = eng.decode(toks, 0)
    order = np.argsort(-logits, kind="stable")[:kTopK]
    rec = {
        "top_k": [[int(i), round(float(logits[i]), 5)] for i in order],
        "probe_logits": [round(float(logits[i]), 5) for i in probe_ids],
        "logits_mean": round(float(logits.mean()), 6),
        "logits_std": round(float(logits.std()), 6),
    }
    gen, gaps, pos = [], [], len(toks)
    while True:
        tok = int(np.argmax(logits))  # first index wins ties, like std::max_element
        gen.append(tok)
        gaps.append(round(top2_gap(logits), 5))
        if len(gen) == kGenTokens:
            break
        logits = eng.decode([tok], pos)
        pos += 1
    eog = [i for i, t in enumerate(gen) if vocab.is_eog(t)]
    rec["greedy"] = gen
    rec["greedy_top2_gap"] = gaps
    rec["greedy_text"] = vocab.text(gen)
    rec["greedy_hit_eog"] = bool(eog)
    rec["greedy_first_eog_step"] = eog[0] if eog else None
    return rec


def lib_versions():
    libdir = os.path.join(os.path.dirname(lc.__file__), "lib")
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(libdir, "lib*.so.*.*")))


def to_json(doc):
    """Compact JSON with one top-level key, and one prompt record, per line (diffable)."""
    def dump(v):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    lines = []
    for k, v in doc.items():
        if k == "prompts":
            body = ",\n".join("  " + dump(r) for r in v)
            lines.append(f"{dump(k)}:[\n{body}\n]")
        else:
            lines.append(f"{dump(k)}:{dump(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(root, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data",
                                                  "smollm2_golden.json"))
    ap.add_argument("--skip-reference", action="store_true",
                    help="leave out the float64 NumPy variant (saves a few minutes)")
    args = ap.parse_args()

    quiet = Quiet()
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(args.model.encode(), lc.llama_model_default_params())
    if not model:
        sys.exit(f"cannot load {args.model}")
    vocab = Vocab(model)
    primary = LlamaEngine(model, None, quiet)  # llama.cpp's default: flash_attn auto
    engines = {"llamacpp_flash_attn_off": LlamaEngine(model, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                                                      quiet)}
    if not args.skip_reference:
        engines["numpy_f64"] = ReferenceEngine(args.model)
    probe_ids = sorted(random.Random(kProbeSeed).sample(range(vocab.n_vocab), kNumProbes))

    records = []
    for name, cat, text, add_special, parse_special in prompts():
        toks = vocab.tokenize(text, add_special, parse_special)
        rec = {"name": name, "category": cat, "text": text, "add_special": add_special,
               "parse_special": parse_special, "tokens": toks}
        rec.update(run_prompt(primary, vocab, probe_ids, toks))
        rec["variants"] = {k: run_prompt(e, vocab, probe_ids, toks) for k, e in engines.items()}
        records.append(rec)
        agree = {k: next((i for i, (a, b) in enumerate(zip(v["greedy"], rec["greedy"]))
                          if a != b), kGenTokens) for k, v in rec["variants"].items()}
        print(f"{name:16s} n_prompt={len(toks):4d} eog_step={rec['greedy_first_eog_step']} "
              f"greedy_agree={agree} {rec['greedy_text'][:40]!r}", file=sys.stderr)

    doc = {
        "description": "llama.cpp reference outputs for SmolLM2-135M-Instruct Q4_1; "
                       "see tests/golden/README.md",
        "generator": "tests/golden/make_model_golden.py",
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"),
        "model_file": os.path.basename(args.model),
        "model_size_bytes": os.path.getsize(args.model),
        "llama_cpp_python_version": lc.__version__,
        "llama_cpp_libs": lib_versions(),
        "system_info": lc.llama_print_system_info().decode().strip(),
        "method": {
            "api": "low-level llama_cpp: llama_tokenize, llama_decode, llama_get_logits_ith",
            "prompt_eval": "whole prompt in one llama_decode, logits of the last token only",
            "greedy": "argmax (lowest id on ties), no sampler, no penalties, no stop at EOG; "
                      "one decode per generated token; greedy_top2_gap[i] is the gap between "
                      "the two best logits at step i",
            "memory_cleared_between_prompts": True,
            "tokens": "from llama.cpp for every variant",
        },
        "flags": primary.flags,
        "variant_flags": {k: e.flags for k, e in engines.items()},
        "n_vocab": vocab.n_vocab,
        "top_k": kTopK,
        "gen_tokens": kGenTokens,
        "probe_seed": kProbeSeed,
        "probe_ids": probe_ids,
        "prompts": records,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(to_json(doc))
    n_eog = sum(r["greedy_hit_eog"] for r in records)
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(records)} prompts, "
          f"{n_eog} hit EOG within {kGenTokens} tokens (primary); flags {primary.flags}",
          file=sys.stderr)

    for e in [primary, *engines.values()]:
        e.free()
    lc.llama_model_free(model)


if __name__ == "__main__":
    main()
