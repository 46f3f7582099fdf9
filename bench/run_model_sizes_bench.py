#!/usr/bin/env python3
"""Speed at the sizes people serve: deltaserve beside llama.cpp on Llama-3.2-1B, -3B and
Llama-3.1-8B shaped models, Q4_K_M and Q8_0, in one run.

The models are random weights in the real shapes (bench/gpu/make_random_gguf.py, Llama 3's
128256-token vocabulary; Q4_K_M is llama-quantize's own mix, requantized from the Q8_0 file),
kept in ~/.cache/deltaserve/bench-models. For each model, one after the other on the same
threads:
  - a copy benchmark (numpy, one copy per thread of 1 GiB in all): the memory bandwidth
    that bounds a decode step, read + write bytes per second;
  - llama.cpp: llama-bench (-p 512,2048 -n 0; -p 0 -n 32 -d 128,4096; flash attention on)
    and llama-batched-bench (8 sequences of 128 prompt tokens, 32 steps);
  - deltaserve-bench-runtime (--prefill-lens 512,2048 --decode-ctx 128,4096 --decode-batch
    1,8 --batch-ctx 128);
each child's peak RSS taken by this driver (wait4). The table prints tokens/s, the ratio
deltaserve / llama.cpp, and for batch-1 decode the weight bytes read per token x tokens/s
beside the copy bandwidth.

    bin=$(bench/build_llama_server.sh)
    .venv-tools/bin/python bench/run_model_sizes_bench.py --bin "$bin" [--shapes 1b,3b,8b]
        [--types Q4_K_M,Q8_0] [--threads 2] [--out bench/results/model-sizes-DATE.json]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
RUNTIME = os.path.join(ROOT, "build", "bin", "deltaserve-bench-runtime")
CACHE = os.path.join(os.environ.get("DELTASERVE_CACHE_DIR",
                                    os.path.expanduser("~/.cache/deltaserve")), "bench-models")
VOCAB = 128256


def run(cmd, timeout=7200):
    """(stdout, peak RSS MB, seconds) of cmd; exits on failure."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{err.read().decode(errors='replace')[-3000:]}")
        return out.read().decode(), usage.ru_maxrss / 1024.0, wall


def model_file(bin_dir, shape, qtype):
    os.makedirs(CACHE, exist_ok=True)
    q8 = os.path.join(CACHE, f"llama-{shape}-shape.Q8_0.gguf")
    if not os.path.exists(q8):
        vocab = [] if shape == "tiny" else ["--vocab", str(VOCAB)]
        run([sys.executable, os.path.join(ROOT, "bench", "gpu", "make_random_gguf.py"),
             "--tokenizer-from", TOKENIZER, "--shape", shape, "--type", "q8_0", "--out", q8]
            + vocab)
    if qtype == "Q8_0":
        return q8
    out = os.path.join(CACHE, f"llama-{shape}-shape.{qtype}.gguf")
    if not os.path.exists(out):
        run([os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", q8, out + ".part",
             qtype, "2"])
        os.replace(out + ".part", out)
    return out


def weight_bytes_per_token(path):
    """Bytes of every matrix a decode step reads: all but the embedding's lookup, unless the
    output is tied to it (then the output reads it whole)."""
    import gguf  # the venv's

    r = gguf.GGUFReader(path)
    names = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(names.values())
    if "output.weight" in names:
        total -= names["token_embd.weight"]
    return total


COPY_BENCH = """
import sys, threading, time
import numpy as np
threads, n = int(sys.argv[1]), int(float(sys.argv[2]) * 2**30 / 8 / int(sys.argv[1]))
src = [np.ones(n) for _ in range(threads)]
dst = [np.empty(n) for _ in range(threads)]
best = 0.0
for _ in range(5):
    workers = [threading.Thread(target=np.copyto, args=(dst[i], src[i])) for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    best = max(best, 2 * 8 * n * threads / (time.perf_counter() - t0))
print(best)
"""


def copy_bandwidth(threads, gib=1.0):
    """Best read + write bytes/s of `threads` numpy copies of gib GiB side by side, in a child
    process (a child's peak RSS starts at its parent's, which measures the engines)."""
    out, _, _ = run([sys.executable, "-c", COPY_BENCH, str(threads), str(gib)])
    return float(out)


def llama_cpp(bin_dir, path, threads):
    res = {"prefill_tps": {}, "decode_tps": {}, "decode_batch_tps": {}}
    out, rss1, _ = run([os.path.join(bin_dir, "llama-bench"), "-m", path, "-t", str(threads),
                        "-r", "2", "-fa", "1", "-p", "512,2048", "-n", "0", "-o", "json"])
    for row in json.loads(out):
        res["prefill_tps"][str(row["n_prompt"])] = row["avg_ts"]
    out, rss2, _ = run([os.path.join(bin_dir, "llama-bench"), "-m", path, "-t", str(threads),
                        "-r", "2", "-fa", "1", "-p", "0", "-n", "32", "-d", "128,4096", "-o",
                        "json"])
    for row in json.loads(out):
        res["decode_tps"][str(row["n_depth"])] = row["avg_ts"]
    out, rss3, _ = run([os.path.join(bin_dir, "llama-batched-bench"), "-m", path, "-t",
                        str(threads), "-c", "2048", "-b", "2048", "-ub", "512", "-fa", "on",
                        "-npp", "128", "-ntg", "32", "-npl", "8", "--output-format", "jsonl"])
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            res["decode_batch_tps"][str(row["pl"])] = row["speed_tg"]
    res["peak_rss_mb"] = max(rss1, rss2, rss3)
    return res


def deltaserve(path, threads):
    out, rss, _ = run([RUNTIME, "--model", path, "--threads", str(threads), "--json",
                       "--prefill-lens", "512,2048", "--decode-ctx", "128,4096",
                       "--decode-tokens", "32", "--decode-batch", "1,8", "--batch-ctx", "128"])
    res = json.loads(out[out.index("{"):])
    res["driver_peak_rss_mb"] = rss
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="llama.cpp's tools (bench/build_llama_server.sh)")
    ap.add_argument("--shapes", default="1b,3b,8b")
    ap.add_argument("--types", default="Q4_K_M,Q8_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", f"model-sizes-{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()

    report = {"date": datetime.datetime.utcnow().isoformat() + "Z", "threads": a.threads,
              "models": []}
    lines = []
    for shape in a.shapes.split(","):
        for qtype in a.types.split(","):
            path = model_file(a.bin, shape, qtype)
            bw = copy_bandwidth(a.threads)
            peer = llama_cpp(a.bin, path, a.threads)
            ours = deltaserve(path, a.threads)
            wbytes = weight_bytes_per_token(path)
            rec = {"shape": shape, "type": qtype, "file_gib": os.path.getsize(path) / 2**30,
                   "weight_bytes_per_token": wbytes, "copy_bandwidth_gbs": bw / 1e9,
                   "llama_cpp": peer, "deltaserve": ours}
            report["models"].append(rec)
            lines.append(f"\n{shape} {qtype} ({rec['file_gib']:.2f} GiB), copy bandwidth "
                         f"{bw / 1e9:.1f} GB/s")
            lines.append(f"{'cell':<22}{'deltaserve':>12}{'llama.cpp':>12}{'ratio':>8}")
            cells = [("prefill 512", "prefill_tps", "512"), ("prefill 2048", "prefill_tps", "2048"),
                     ("decode @128", "decode_tps", "128"), ("decode @4096", "decode_tps", "4096"),
                     ("decode batch 8", "decode_batch_tps", "8")]
            for label, key, sub in cells:
                x = ours.get(key, {}).get(sub)
                y = peer.get(key, {}).get(sub)
                ratio = f"{x / y:.2f}x" if x and y else "-"
                lines.append(f"{label:<22}{x or 0:>12.1f}{y or 0:>12.1f}{ratio:>8}")
            x, y = ours["driver_peak_rss_mb"], peer["peak_rss_mb"]
            lines.append(f"{'peak RSS (MB)':<22}{x:>12.0f}{y:>12.0f}{x / y:>7.2f}x")
            d1 = ours["decode_tps"].get("128", 0)
            lines.append(f"batch-1 decode @128 reads {wbytes / 1e9:.2f} GB/token: "
                         f"{wbytes * d1 / 1e9:.1f} GB/s = {wbytes * d1 / bw:.0%} of the copy "
                         f"bandwidth (llama.cpp {wbytes * peer['decode_tps'].get('128', 0) / bw:.0%})")
            print("\n".join(lines[-9:]), flush=True)
            os.makedirs(os.path.dirname(a.out), exist_ok=True)
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
