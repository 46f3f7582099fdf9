#!/usr/bin/env python3
"""Writes tests/data/tokenizers/*.json: Hugging Face `tokenizers` ids and decodes of a corpus.

    .venv-tools/bin/pip install tokenizers==0.23.3 transformers==5.23.0
    .venv-tools/bin/python tests/golden/make_hf_tokenizer_goldens.py [--models DIR] [--only NAME]

The oracle for tests/model/hf_parity_tokenizer_test.cpp. Each vocabulary's GGUF metadata is
read with the `gguf` package and turned into a `tokenizers.Tokenizer` by transformers' GGUF
converter (`convert_gguf_tokenizer`, the code behind `from_pretrained(..., gguf_file=...)`),
then set to the shape of the model's published tokenizer.json where the converter's differs
(`OFFICIAL_SHAPE` says what and why). That tokenizer is saved beside the GGUF as
<GGUF name less .gguf>.tokenizer.json (models/ is not committed; the C++ test loads it when
present).

cases.json: the texts, in order: every non-empty line of corpus.txt (split at "\\n" only, so
CRLF lines keep their "\\r"; the "§§ title" lines excepted), then every section of it whole,
then the synthetic texts of `extra_cases` (NUL, long runs, seeded random code points).
<name>.json, one entry per text:
  ids          encode(text, add_special_tokens=False): no BOS; special tokens written in the
               text are matched (the HF default; deltaserve's parse_special=true)
  plain        the same with encode_special_tokens=True (special tokens as plain text;
               deltaserve's parse_special=false); left out when equal to ids
  decode       decode(ids, skip_special_tokens=False); left out when equal to the text
  decode_skip  decode(ids, skip_special_tokens=True); left out when equal to decode
and "decodes": both decodes of seeded id sequences no text encodes to (broken UTF-8 from
single-byte and byte-fallback tokens, special tokens, any ids). Tokens that are not special
but added (llama.cpp's user-defined ones) are matched in the text in both modes.
"""
import argparse
import hashlib
import json
import os
import random
import sys

import gguf
import tokenizers
import transformers
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")

# name -> the vocabulary's path under the models folder.
VOCABS = {
    "llama_bpe": "vocab/ggml-vocab-llama-bpe.gguf",
    "qwen2": "vocab/ggml-vocab-qwen2.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
}


def llama3_shape(doc):
    # Meta-Llama-3's tokenizer.json: "ignore_merges": true (a word that is a token is taken
    # whole; tokenizers >= 0.19). The converter leaves the BPE default, false.
    doc["model"]["ignore_merges"] = True


def qwen2_shape(doc):
    # Qwen2's tokenizer.json (and transformers' Qwen2Tokenizer) normalize to NFC first; the
    # GGUF converter keeps GPT2Tokenizer's none.
    doc["normalizer"] = json.loads(normalizers.NFC().__getstate__())


def smollm_shape(doc):
    # SmolLM2's tokenizer.json: every digit alone, then GPT-2's ByteLevel regex. The converter
    # knows no "smollm" pre-tokenizer and keeps the plain ByteLevel one.
    seq = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    doc["pre_tokenizer"] = json.loads(seq.__getstate__())


# Gemma 3: the converter's shape is the published one (Replace " " -> U+2581, no prefix, BPE
# with byte fallback, merges in vocabulary order, Replace/ByteFallback/Fuse decoder).
OFFICIAL_SHAPE = {"llama_bpe": llama3_shape, "qwen2": qwen2_shape, "smollm2": smollm_shape}


def field(reader, key):
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def hf_tokenizer(name, path):
    """transformers' GGUF converter on the file's metadata, then the published shape.

    The metadata is read with `gguf` because transformers' own GGUF reader imports torch.
    """
    reader = gguf.GGUFReader(path)
    tokenizer_dict = {
        renamed: field(reader, "tokenizer." + key)
        for key, renamed in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if "tokenizer." + key in reader.fields
    }
    backend, _ = convert_gguf_tokenizer(field(reader, "general.architecture"), tokenizer_dict)
    doc = json.loads(backend.to_str())
    # GPT2Tokenizer adds its default "<|endoftext|>" (bos, eos, unk) past the end of a
    # vocabulary that lacks it (Llama 3's): the model has no such token, so it goes.
    n_tokens = len(tokenizer_dict["tokens"])
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["id"] < n_tokens]
    if name in OFFICIAL_SHAPE:
        OFFICIAL_SHAPE[name](doc)
    text = json.dumps(doc, ensure_ascii=False)
    return Tokenizer.from_str(text), text


def corpus_cases():
    with open(os.path.join(DATA, "corpus.txt"), encoding="utf-8", newline="") as f:
        corpus = f.read()
    lines = corpus.split("\n")
    cases = [line for line in lines if line and not line.startswith("§§ ")]
    section = []
    for line in lines + ["§§ end"]:
        if line.startswith("§§ "):
            if section:
                cases.append("\n".join(section))
            section = []
        else:
            section.append(line)
    return corpus, cases


def extra_cases():
    cases = ["", " ", "\n", "\r", "\r\n", "\t", "\x00", "a\x00b", "  ", "\n\n\n\n", " \n \n",
             " " * 300 + "x", "x" + " " * 301, "\t" * 40, "\n" * 40 + "end",
             "9" * 200, "1234567890" * 12 + ".5", "a1b22c333d4444e55555",
             "😀" * 30, "ab" * 150, "'s" * 40, "<|endoftext|>" * 3]
    # Seeded random code points: ASCII, the corpus's scripts, marks, emoji parts, astral
    # and private-use planes (no surrogates: they are not UTF-8).
    pools = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
             (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
             (0x2000, 0x206F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
             (0xE000, 0xF8FF), (0xFE00, 0xFE0F), (0xFF00, 0xFFFF), (0x1F300, 0x1FAFF),
             (0x1F3FB, 0x1F3FF), (0x10000, 0x10FFFF)]
    rng = random.Random(57)
    for _ in range(120):
        n = rng.randint(1, 80)
        chars = []
        for _ in range(n):
            lo, hi = rng.choice(pools)
            cp = rng.randint(lo, hi)
            chars.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "?")
            if rng.random() < 0.15:
                chars.append(rng.choice([" ", "  ", "\n", "\u200d", "'", "'S", "1"]))
        cases.append("".join(chars))
    # For NFC: bases with shuffled combining marks, and conjoining Hangul jamo.
    bases = "aeiouAEIOUnNcCsSzZkKyYwWαεηιουωΑеигאשकनกあかカᄀ가"
    marks = [0x300, 0x301, 0x302, 0x303, 0x304, 0x306, 0x307, 0x308, 0x309, 0x30A, 0x30B, 0x30C,
             0x30F, 0x311, 0x313, 0x314, 0x31B, 0x323, 0x324, 0x325, 0x327, 0x328, 0x32D, 0x330,
             0x331, 0x338, 0x342, 0x345, 0x5B4, 0x5BC, 0x5C1, 0x93C, 0x94D, 0xE31, 0xE48, 0x3099,
             0x309A, 0x1161, 0x1175, 0x11A8, 0x11AB]
    for _ in range(60):
        text = []
        for _ in range(rng.randint(1, 12)):
            text.append(rng.choice(bases))
            text.extend(chr(rng.choice(marks)) for _ in range(rng.randint(0, 3)))
            if rng.random() < 0.3:
                text.append(rng.choice([" ", "  ", "'s", "1", ".", "\n"]))
        cases.append("".join(text))
    return cases


def golden(tok, cases):
    plain_tok = Tokenizer.from_str(tok.to_str())
    plain_tok.encode_special_tokens = True
    entries = []
    for text in cases:
        ids = tok.encode(text, add_special_tokens=False).ids
        entry = {"ids": ids}
        plain = plain_tok.encode(text, add_special_tokens=False).ids
        if plain != ids:
            entry["plain"] = plain
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            entry["decode"] = decoded
        skipped = tok.decode(ids, skip_special_tokens=True)
        if skipped != decoded:
            entry["decode_skip"] = skipped
        entries.append(entry)
    return entries


def id_sequences(tok, name, n_tokens, count=60):
    """Seeded id sequences that no text encodes to: single-byte tokens (lead and continuation
    bytes, so broken UTF-8), byte-fallback tokens, special tokens and any others, mixed."""
    vocab = tok.get_vocab(with_added_tokens=True)
    byte_level = json.loads(tok.to_str())["decoder"]["type"] == "ByteLevel"
    if byte_level:
        alphabet = {c for c in vocab if len(c) == 1}
        singles = sorted(vocab[c] for c in alphabet)
    else:
        singles = sorted(i for t, i in vocab.items() if len(t) == 6 and t.startswith("<0x"))
    specials = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    rng = random.Random("decode-" + name)
    out = []
    for _ in range(count):
        ids = []
        for _ in range(rng.randint(1, 12)):
            pool = rng.choice([singles, singles, specials or singles, None])
            ids.append(rng.choice(pool) if pool else rng.randrange(n_tokens))
        out.append(ids)
    return out


def decodes(tok, sequences):
    return [{"ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
             "decode_skip": tok.decode(ids, skip_special_tokens=True)} for ids in sequences]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path, doc):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=os.environ.get("DELTASERVE_MODELS_DIR",
                                                       os.path.join(ROOT, "models")))
    ap.add_argument("--only", choices=sorted(VOCABS), action="append")
    args = ap.parse_args()
    corpus, cases = corpus_cases()
    cases += extra_cases()
    write_json(os.path.join(DATA, "cases.json"), {
        "corpus_sha256": hashlib.sha256(corpus.encode("utf-8")).hexdigest(),
        "cases": cases,
    })
    for name in args.only or VOCABS:
        path = os.path.join(args.models, VOCABS[name])
        if not os.path.exists(path):
            sys.exit(f"{path} not found (deploy/setup.sh fetches it)")
        tok, text = hf_tokenizer(name, path)
        with open(os.path.splitext(path)[0] + ".tokenizer.json", "w", encoding="utf-8") as f:
            f.write(text)
        write_json(os.path.join(DATA, name + ".json"), {
            "vocab": VOCABS[name],
            "vocab_bytes": os.path.getsize(path),
            "vocab_sha256": sha256(path),
            "tokenizers_version": tokenizers.__version__,
            "transformers_version": transformers.__version__,
            "cases": golden(tok, cases),
            "decodes": decodes(tok, id_sequences(tok, name, tok.get_vocab_size())),
        })
        print(f"{name}: {len(cases)} texts", file=sys.stderr)


if __name__ == "__main__":
    main()
