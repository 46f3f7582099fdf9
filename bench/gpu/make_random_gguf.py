#!/usr/bin/env python3
"""Writes a Llama-shaped GGUF with random Q4_0 or Q8_0 weights, for speed measurements only.

The tokenizer (every tokenizer.* key) comes from another GGUF, so llama.cpp and deltaserve
load the file as they load a real model; its outputs mean nothing. The weights' scales keep
activations bounded (each matmul output about 0.6 of its input's RMS), so no NaN or inf
changes the work.

    make_random_gguf.py --tokenizer-from models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --shape 8b --out /tmp/llama-8b-shape.Q4_0.gguf
    make_random_gguf.py --tokenizer-from M.gguf --tokenizer-only --out tok.gguf  # carry this
    make_random_gguf.py --tokenizer-from M.gguf --shape 1b --type q8_0 --vocab 128256 \
        --out /tmp/llama-1b-shape.Q8_0.gguf     # Llama 3.2 1B's shape, Llama 3's vocab size
    # Q4_K_M: llama-quantize --allow-requantize that file into Q4_K_M (llama.cpp's own mix)

--vocab pads the source's vocabulary with unused tokens up to that size, so the embedding
and output matrices have the real model's shape (Llama 3's 128256 rows: a fifth of the
1B model's weights).

Needs numpy for the weights only (the device machines have it). The 8b shape is Llama 3
8B's layers with the source's vocabulary: about 4.3 GB.
"""
import argparse
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # the tokenizer alone needs none
    np = None

SHAPES = {
    # d_model, layers, heads, kv heads, d_ff, context, output tied to the embedding
    "8b": (4096, 32, 32, 8, 14336, 32768 + 1024, False),  # Llama 3.1 8B
    "3b": (3072, 28, 24, 8, 8192, 32768 + 1024, True),  # Llama 3.2 3B
    "1b": (2048, 16, 32, 8, 8192, 32768 + 1024, True),  # Llama 3.2 1B
    "tiny": (256, 2, 4, 2, 512, 2048, True),
}
GGML_F32, GGML_Q4_0, GGML_Q8_0 = 0, 2, 8
BLOCK_BYTES = {GGML_Q4_0: 18, GGML_Q8_0: 34}
TOKEN_TYPE_UNUSED = 5
ALIGN = 32
# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


class Reader:
    def __init__(self, path):
        self.f = open(path, "rb")

    def take(self, fmt):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            sys.exit("make_random_gguf: the source GGUF ends early")
        return struct.unpack(fmt, data)[0]

    def string(self):
        n = self.take("<Q")
        if n > 1 << 24:
            sys.exit("make_random_gguf: a string in the source GGUF is too long")
        return self.f.read(n)

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == STR:
            return self.string()
        if t == ARR:
            et, n = self.take("<I"), self.take("<Q")
            if n > 1 << 24:
                sys.exit("make_random_gguf: an array in the source GGUF is too long")
            return (et, [self.value(et) for _ in range(n)])
        sys.exit(f"make_random_gguf: unknown GGUF value type {t}")


def read_kvs(path):
    r = Reader(path)
    if r.f.read(4) != b"GGUF":
        sys.exit(f"make_random_gguf: {path} is not a GGUF file")
    version = r.take("<I")
    if version not in (2, 3):
        sys.exit(f"make_random_gguf: GGUF version {version} is not supported")
    r.take("<Q")  # tensors
    n_kv = r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        key = r.string().decode()
        t = r.take("<I")
        kvs.append((key, t, r.value(t)))
    return kvs


def pack_value(t, v):
    if t in SCALAR:
        return struct.pack(SCALAR[t], v)
    if t == STR:
        return struct.pack("<Q", len(v)) + v
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(pack_value(et, x) for x in items)


def pack_kv(key, t, v):
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + pack_value(t, v)


def q4_0_rows(rng, rows, cols):
    """rows x cols random Q4_0 blocks: nibbles uniform, d = 1 / (8 sqrt(cols))."""
    nb = cols // 32
    blocks = np.empty((rows * nb, 18), dtype=np.uint8)
    blocks[:, 2:] = rng.integers(0, 256, size=(rows * nb, 16), dtype=np.uint8)
    d = np.float16(1.0 / (8.0 * np.sqrt(cols)))
    blocks[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return blocks.tobytes()


def q8_0_rows(rng, rows, cols):
    """rows x cols random Q8_0 blocks: int8 uniform, d = 1 / (127 sqrt(cols))."""
    nb = cols // 32
    blocks = np.empty((rows * nb, 34), dtype=np.uint8)
    blocks[:, 2:] = rng.integers(-127, 128, size=(rows * nb, 32), dtype=np.int8).view(np.uint8)
    d = np.float16(1.0 / (127.0 * np.sqrt(cols)))
    blocks[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return blocks.tobytes()


def pad_vocab(tok, size):
    """The tokenizer keys with tokens, types and scores padded with unused tokens to size."""
    out = []
    for key, t, v in tok:
        if t == ARR and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                "tokenizer.ggml.scores"):
            et, items = v
            n = size - len(items)
            if n < 0:
                sys.exit(f"make_random_gguf: --vocab {size} is below the source's {len(items)}")
            if key == "tokenizer.ggml.tokens":
                items = items + [f"<|unused_{i}|>".encode() for i in range(n)]
            elif key == "tokenizer.ggml.token_type":
                items = items + [TOKEN_TYPE_UNUSED] * n
            else:
                items = items + [0.0] * n
            v = (et, items)
        out.append((key, t, v))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer is taken")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="write only the tokenizer keys (a small file to carry)")
    ap.add_argument("--type", choices=["q4_0", "q8_0"], default="q4_0")
    ap.add_argument("--vocab", type=int, default=0,
                    help="pad the vocabulary with unused tokens to this size")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    tok = [kv for kv in read_kvs(a.tokenizer_from) if kv[0].startswith("tokenizer.")]
    if a.vocab:
        tok = pad_vocab(tok, a.vocab)
    vocab = next((len(v[1]) for k, _, v in tok if k == "tokenizer.ggml.tokens"), 0)
    if vocab == 0:
        sys.exit(f"make_random_gguf: {a.tokenizer_from} has no tokenizer.ggml.tokens")
    d, n_layers, n_heads, n_kv, d_ff, n_ctx, tied = SHAPES[a.shape]
    wt = GGML_Q8_0 if a.type == "q8_0" else GGML_Q4_0
    kvs = [("general.architecture", STR, b"llama")]
    if not a.tokenizer_only:
        kvs += [
            ("general.name", STR, f"random-{a.shape}-{a.type}".encode()),
            ("llama.context_length", U32, n_ctx),
            ("llama.embedding_length", U32, d),
            ("llama.block_count", U32, n_layers),
            ("llama.feed_forward_length", U32, d_ff),
            ("llama.attention.head_count", U32, n_heads),
            ("llama.attention.head_count_kv", U32, n_kv),
            ("llama.rope.freq_base", F32, 500000.0),
            ("llama.rope.dimension_count", U32, d // n_heads),
            ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
            ("llama.vocab_size", U32, vocab),
            ("general.file_type", U32, 7 if wt == GGML_Q8_0 else 2),  # mostly Q8_0 / Q4_0
        ]
    kvs += tok

    # (name, ne0 = inputs, ne1 = rows, type); the output tied to the embedding or not.
    tensors = []
    if not a.tokenizer_only:
        kv_dim = d // n_heads * n_kv
        tensors += [("token_embd.weight", d, vocab, wt), ("output_norm.weight", d, 1, GGML_F32)]
        if not tied:
            tensors += [("output.weight", d, vocab, wt)]
        for i in range(n_layers):
            p = f"blk.{i}."
            tensors += [
                (p + "attn_norm.weight", d, 1, GGML_F32),
                (p + "attn_q.weight", d, d, wt),
                (p + "attn_k.weight", d, kv_dim, wt),
                (p + "attn_v.weight", d, kv_dim, wt),
                (p + "attn_output.weight", d, d, wt),
                (p + "ffn_norm.weight", d, 1, GGML_F32),
                (p + "ffn_gate.weight", d, d_ff, wt),
                (p + "ffn_up.weight", d, d_ff, wt),
                (p + "ffn_down.weight", d_ff, d, wt),
            ]

    def nbytes(ne0, ne1, t):
        return ne0 * ne1 * 4 if t == GGML_F32 else ne1 * (ne0 // 32) * BLOCK_BYTES[t]

    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    header += b"".join(pack_kv(*kv) for kv in kvs)
    offset = 0
    for name, ne0, ne1, t in tensors:
        n = name.encode()
        dims = [ne0] if ne1 == 1 else [ne0, ne1]
        header += struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims))
        header += b"".join(struct.pack("<Q", x) for x in dims) + struct.pack("<IQ", t, offset)
        offset += (nbytes(ne0, ne1, t) + ALIGN - 1) // ALIGN * ALIGN
    header += b"\0" * (-len(header) % ALIGN)

    if tensors and np is None:
        sys.exit("make_random_gguf: the weights need numpy")
    rng = np.random.default_rng(a.seed) if tensors else None
    with open(a.out + ".part", "wb") as f:
        f.write(header)
        for name, ne0, ne1, t in tensors:
            if t == GGML_F32:
                data = (1.0 + 0.1 * rng.standard_normal(ne0)).astype(np.float32).tobytes()
            else:
                rows = q8_0_rows if t == GGML_Q8_0 else q4_0_rows
                data = b"".join(rows(rng, min(4096, ne1 - r), ne0) for r in range(0, ne1, 4096))
            f.write(data + b"\0" * (-len(data) % ALIGN))
    os.replace(a.out + ".part", a.out)
    what = "the tokenizer only" if a.tokenizer_only else f"{a.shape} shape, {len(tensors)} tensors"
    print(f"make_random_gguf: {a.out}: {what}, vocab {vocab}, "
          f"{(len(header) + offset) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
