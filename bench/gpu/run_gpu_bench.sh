#!/usr/bin/env bash
# The GPU benchmark, run on a lent device from the bundle (tests/gpu/bundle.sh puts this
# script, the bench programs and the tokenizer the random model takes into BUNDLE/bench):
#   1. the kernels' bandwidth against the HBM peak (deltaserve-bench-kernels --device cuda);
#   2. an 8B-shaped Llama with random Q4_0 weights, written there (make_random_gguf.py,
#      about 4.3 GB, half a minute);
#   3. prefill and decode tokens/s of deltaserve-bench-runtime --device cuda on that model
#      and on SmolLM2-135M (when the bundle's model parts were joined): decode at 1k, 8k and
#      32k of context (SmolLM2: to its 8k), batch 1 and 32, full KV, and DeltaKV at batch 32
#      on SmolLM2 (the only model with a profile);
#   4. beside each, llama.cpp's CUDA build (llama-bench -ngl 99 -fa 1) when the bundle
#      carries one (BUNDLE/llama/llama-bench.xz, bench/build_llama_server.sh --cuda);
#   5. DeltaKV's perplexity on the GPL-3 text at 2k tokens, keep 0.3, on the CPU and on
#      cuda (deltaserve-bench-fidelity): the issue asks for them within 0.5%.
# Output under $OUT/bench (default ./gpu-out/bench); one summary on stdout.
#   bash BUNDLE/bench/run_gpu_bench.sh [PEAK_GBS]     # default 4800, the H200's HBM3e
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$here")
out=${OUT:-$PWD/gpu-out}/bench
mkdir -p "$out"
peak=${1:-4800}
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
models=${DELTASERVE_MODELS_DIR:-$bundle/models}
smol=$models/SmolLM2-135M-Instruct.Q4_1.gguf
profile=${DELTASERVE_PROFILES_DIR:-$bundle/profiles}/SmolLM2-135M-Instruct.Q4_1.gguf/deltakv.json
big=${TMPDIR:-/tmp}/llama-8b-shape.Q4_0.gguf
llama=${TMPDIR:-/tmp}/llama-bench

step() { echo "== $*" | tee -a "$out/summary.txt"; }
if ! nvidia-smi -L >/dev/null 2>&1; then
    step "no GPU here (nvidia-smi -L): the benchmark needs one"
    exit 0
fi

# llama.cpp's llama-bench comes compressed; it loads CUDA 13's libcudart, cuBLAS and NCCL
# from the toolkit or from the image's Python packages (nvidia-*).
if [ -s "$bundle/llama/llama-bench.xz" ]; then
    python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
        "$bundle/llama/llama-bench.xz" "$llama" && chmod +x "$llama"
    for d in /usr/local/cuda/lib64 $(python3 -c 'import glob, nvidia, os
for p in nvidia.__path__: print(" ".join(glob.glob(os.path.join(p, "*", "lib"))))' 2>/dev/null); do
        LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
    done
    export LD_LIBRARY_PATH
    ldd "$llama" | grep "not found" | tee -a "$out/summary.txt"
fi

step "kernels"
"$here/deltaserve-bench-kernels" --device cuda --peak-gbs "$peak" 2>&1 | tee "$out/kernels.txt"

step "random 8B-shaped model"
python3 "$here/make_random_gguf.py" --tokenizer-from "$here/tokenizer.gguf" --shape 8b \
    --out "$big" 2>&1 | tee -a "$out/summary.txt"

runtime() {  # NAME MODEL DECODE_CTX [extra flags]
    local name=$1 model=$2 ctx=$3
    shift 3
    step "deltaserve $name"
    "$here/deltaserve-bench-runtime" --device cuda --model "$model" --threads 16 \
        --prefill-lens 512,2048 --decode-ctx "$ctx" --decode-tokens 32 --decode-batch 1,32 \
        --batch-ctx 1024 --json "$@" > "$out/deltaserve-$name.json" 2> "$out/deltaserve-$name.log"
    echo "rc=$? $(tr -d '\n ' < "$out/deltaserve-$name.json" | head -c 600)" | tee -a "$out/summary.txt"
    if [ -x "$llama" ]; then
        step "llama.cpp $name"
        "$llama" -m "$model" -ngl 99 -fa 1 -p 512,2048 -n 32 -d "$ctx" -r 3 -o md \
            > "$out/llama-$name.md" 2> "$out/llama-$name.log"
        cat "$out/llama-$name.md" | tee -a "$out/summary.txt"
    fi
}
[ -s "$big" ] && runtime 8b "$big" 1024,8192,32768
if [ -s "$smol" ]; then
    runtime smollm2 "$smol" 1024,8192
    if [ -s "$profile" ]; then
        runtime smollm2-deltakv "$smol" 1024,8192 --batch-kv-policy deltakv --batch-kv-keep 0.3 \
            --batch-kv-profile "$profile"
    fi
fi
rm -f "$big" "$llama"

text=$bundle/data/GPL-3
if [ -s "$smol" ] && [ -s "$profile" ] && [ -s "$text" ]; then
    for device in cpu cuda; do
        step "DeltaKV perplexity, $device"
        "$here/deltaserve-bench-fidelity" --model "$smol" --profile "$profile" --text "$text" \
            --tasks ppl --lengths 2048 --keeps 0.3 --policies deltakv --threads 16 \
            --device "$device" --out "$out/fidelity-$device.json" > "$out/fidelity-$device.log" 2>&1
        echo "rc=$? $(tr -d '\n ' < "$out/fidelity-$device.json" | head -c 800)" | tee -a "$out/summary.txt"
    done
fi
