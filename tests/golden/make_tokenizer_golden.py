#!/usr/bin/env python3
"""Writes tests/data/smollm2_tokenize.json: llama.cpp's token ids for a varied set of texts.

    .venv/bin/python tests/golden/make_tokenizer_golden.py [model.gguf] [out.json]

Uses llama-cpp-python with vocab_only=True (no weights are loaded). Each entry holds the
text, parse_special, the ids from llama_tokenize(add_special=False), and the concatenated
pieces with and without special tokens rendered (llama_token_to_piece, lstrip 0).
"""
import ctypes
import json
import os
import sys

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "smollm2_tokenize.json")

CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n")

TEXTS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple     spaces    between   words",
    "tabs\tand\t\ttabs",
    "new\nline\n\nand\r\nwindows\r\n",
    "\n\n\n",
    "   \n  \t  \n",
    "Numbers: 0 7 42 123 4567 1234567890 3.14159 -12,345.67",
    "Year 2024, 1st place, 100%",
    "I'm sure they'll say it's fine, but we'd've known. You're right, isn't it?",
    "DON'T SHOUT, I'M HERE. WE'LL SEE. THEY'RE OK.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "https://example.com/path?query=value&x=1#frag",
    "café naïve résumé Zoë façade jalapeño",
    "Grüße aus München! Ærø, Øresund, Åland",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな",
    "한국어 텍스트입니다",
    "مرحبا بالعالم",
    "שלום עולם",
    "हिन्दी पाठ",
    "Emoji: 😀🎉👍🏽 ❤️ 🇫🇷 👨‍👩‍👧‍👦",
    "Math: ∑ ∫ √2 ≈ 1.414, α+β=γ, x² + y³, ½ ¾",
    "Fullwidth ＡＢＣ１２３ and ①②③ and Ⅻ",
    "\u00a0non-breaking\u00a0space and\u2003em space and\u3000ideographic",
    "Zero\u200bwidth and soft\u00adhyphen",
    "Punctuation!!! ??? ... --- ;;; ::: @@@ ### $$$",
    "'quoted' \"double\" `backtick` «guillemets» „low“",
    "a'b 's 'S x'LL y'Re",
    "ALLCAPS lowercase MixedCase camelCaseWord snake_case_word kebab-case-word",
    "The quick brown fox jumps over the lazy dog. " * 4,
    CHAT,
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    "text<|im_end|>more<|endoftext|><|im_start|>",
    "<|im_start|><|im_start|>",
    "<|im_start",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
]

# A few texts tokenized without parsing special tokens: the markers become plain text.
TEXTS_NO_SPECIAL = [
    CHAT,
    "text<|im_end|>more<|endoftext|>",
]


def tokenize(vocab, text, parse_special):
    data = text.encode("utf-8")
    n_max = len(data) + 16
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n_max, False, parse_special)
    assert n >= 0, n
    return [buf[i] for i in range(n)]


def piece(vocab, token, special):
    size = 256
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, special)
    assert 0 <= n <= size, n
    return buf.raw[:n]


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    out = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_OUT
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    entries = []
    for parse_special, texts in ((True, TEXTS), (False, TEXTS_NO_SPECIAL)):
        for text in texts:
            ids = tokenize(vocab, text, parse_special)
            plain = b"".join(piece(vocab, t, False) for t in ids)
            special = b"".join(piece(vocab, t, True) for t in ids)
            entries.append({
                "text": text,
                "parse_special": parse_special,
                "ids": ids,
                "decoded": plain.decode("utf-8"),
                "decoded_special": special.decode("utf-8"),
            })
    doc = {
        "model": os.path.basename(model),
        "generator": "tests/golden/make_tokenizer_golden.py",
        "llama_cpp_python": llama_cpp.__version__,
        "add_bos": False,
        "entries": entries,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(entries)} entries to {out}")


if __name__ == "__main__":
    main()
