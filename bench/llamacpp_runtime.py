#!/usr/bin/env python3
"""llama.cpp side of the runtime benchmark: prefill and decode throughput, load time, peak RSS.

Prints one JSON object on stdout with the keys deltaserve-bench-runtime also prints:
  {"load_s", "peak_rss_mb",
   "prefill_tps": {"512":..,"2048":..,"8000":..},
   "decode_tps":  {"128":..,"2048":..,"8000":..}, ...extra detail keys}

What is measured (all through the low-level llama_cpp API, so Python costs nothing that
matters; only llama_decode + llama_synchronize are inside the timed regions):
  - prefill_tps[L]: L random (seeded, non-special) token ids evaluated from an empty KV cache
    in llama_decode calls of n_batch tokens,
    logits requested for the last token only, as llama-bench does. L / seconds.
  - decode_tps[C]: after C tokens of context (prefilled, untimed), --decode-tokens single-token
    llama_decode calls, each asking for logits, as llama-bench's tg test does.
    tokens / seconds.
  - load_s: llama_model_load_from_file + llama_init_from_model with the same settings (model
    mmap'd from the page cache after the first run); load_s_llama_class is the same through
    the high-level Llama() constructor, for comparison.
  - peak_rss_mb: this process's ru_maxrss at the end (model, KV cache for n_ctx, compute
    buffers and the Python interpreter: python_baseline_rss_mb is the RSS before loading).
A warm-up (a 512-token prefill and a few decodes) runs first. The KV cache is cleared between
measurements. Settings are llama.cpp's defaults (flash attention auto, which the CPU backend
resolves to on; f16 K/V; n_ubatch 512) except n_ctx, sized to hold the longest run, n_batch
512 (llama.cpp's default is 2048, but the work is split into n_ubatch=512 pieces either way),
and the thread count.

Usage: .venv/bin/python bench/llamacpp_runtime.py --model M.gguf --threads 2 [--json]
"""

import argparse
import ctypes
import json
import os
import random
import resource
import sys
import time


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


kBaselineRss = rss_mb()
kWarmupTokens = 512

import llama_cpp as lc  # noqa: E402  (imported after the baseline RSS reading on purpose)

kImportRss = rss_mb()


class LogSink:
    """Keeps llama.cpp's log lines off the terminal; a few are echoed into the JSON."""

    def __init__(self):
        self.lines = []

        @lc.llama_log_callback
        def cb(level, text, user_data):
            self.lines.append(text.decode("utf-8", errors="replace"))

        self._cb = cb
        lc.llama_log_set(cb, ctypes.c_void_p(0))

    def grep(self, word):
        return [l.strip() for l in "".join(self.lines).splitlines() if word.lower() in l.lower()]


def context_params(args, n_ctx):
    cp = lc.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = args.n_batch
    cp.n_ubatch = args.n_ubatch
    cp.n_threads = args.threads
    cp.n_threads_batch = args.threads
    cp.no_perf = True
    cp.flash_attn_type = {"auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
                          "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED}[args.flash_attn]
    return cp


class Bench:
    def __init__(self, args, n_ctx):
        self.args = args
        t0 = time.perf_counter()
        mp = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(args.model.encode(), mp)
        if not self.model:
            sys.exit(f"cannot load {args.model}")
        self.cparams = context_params(args, n_ctx)
        self.ctx = lc.llama_init_from_model(self.model, self.cparams)
        if not self.ctx:
            sys.exit("cannot create llama.cpp context")
        self.load_s = time.perf_counter() - t0
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(max(args.n_batch, 1), 0, 1)
        self.rng = random.Random(1234)

    def random_tokens(self, n):
        # Skip the low ids (special/control tokens in most vocabularies).
        return [self.rng.randrange(256, self.n_vocab) for _ in range(n)]

    def clear(self):
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)

    def decode(self, toks, pos0):
        """One llama_decode of toks (<= n_batch) at pos0..; logits for the last token only."""
        b = self.batch
        for i, t in enumerate(toks):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(toks) - 1
        b.n_tokens = len(toks)
        t0 = time.perf_counter()
        rc = lc.llama_decode(self.ctx, b)
        lc.llama_synchronize(self.ctx)
        dt = time.perf_counter() - t0
        if rc != 0:
            sys.exit(f"llama_decode returned {rc} (n_tokens={len(toks)}, pos0={pos0})")
        return dt

    def prefill(self, n):
        """Evaluates n random tokens from position 0; returns the summed decode time."""
        toks, total = self.random_tokens(n), 0.0
        for i in range(0, n, self.args.n_batch):
            total += self.decode(toks[i:i + self.args.n_batch], i)
        return total

    def decode_steps(self, pos0, n):
        total = 0.0
        for i, t in enumerate(self.random_tokens(n)):
            total += self.decode([t], pos0 + i)
        return total

    def free(self):
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


def load_time_llama_class(args, n_ctx):
    """Llama() construction with the same settings (high-level API), best of --reps.

    Llama(flash_attn=False), its default, would force flash attention off; on the CPU
    backend llama.cpp's default "auto" resolves to on, so True is the same setting."""
    best = None
    for _ in range(args.reps):
        t0 = time.perf_counter()
        llm = lc.Llama(args.model, n_ctx=n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch,
                       n_threads=args.threads, n_threads_batch=args.threads, verbose=False,
                       flash_attn=True)
        dt = time.perf_counter() - t0
        del llm
        best = dt if best is None else min(best, dt)
    return best


def check_highlevel(args, n_ctx, out):
    """Times prefill/decode through Llama.eval as a plausibility check of the low-level numbers."""
    llm = lc.Llama(args.model, n_ctx=n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch,
                   n_threads=args.threads, n_threads_batch=args.threads, verbose=False,
                   flash_attn=True)
    rng = random.Random(99)
    toks = [rng.randrange(256, llm.n_vocab()) for _ in range(512)]
    llm.eval(toks[:64])  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks)
    pre = 512 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for t in toks[:32]:
        llm.eval([t])
    dec = 32 / (time.perf_counter() - t0)
    out["highlevel_check"] = {"note": "Llama.eval, flash_attn=True, logits for every token",
                              "prefill_tps_512": round(pre, 2),
                              "decode_tps_after_512": round(dec, 2)}
    del llm


def parse_lens(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="accepted for symmetry; output is JSON")
    ap.add_argument("--prefill-lens", default="512,2048,8000")
    ap.add_argument("--decode-ctx", default="128,2048,8000")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--n-batch", type=int, default=512,
                    help="tokens per llama_decode call (llama.cpp's own default is 2048; the "
                         "work is done in n_ubatch pieces either way)")
    ap.add_argument("--n-ubatch", type=int, default=512, help="llama.cpp default 512")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's default is auto (on for the CPU backend)")
    ap.add_argument("--reps", type=int, default=1, help="repeat each measurement, keep the best")
    ap.add_argument("--check-highlevel", action="store_true",
                    help="also time prefill/decode through the high-level Llama.eval")
    args = ap.parse_args()

    prefill_lens, decode_ctx = parse_lens(args.prefill_lens), parse_lens(args.decode_ctx)
    need = max(prefill_lens + [c + args.decode_tokens for c in decode_ctx] + [kWarmupTokens + 4])
    n_ctx = (need + 255) // 256 * 256
    sink = LogSink()
    load_avg_start = os.getloadavg()
    lc.llama_backend_init()

    bench = Bench(args, n_ctx)
    rss_after_load = rss_mb()
    # Warm-up: page in the weights, spin up the thread pool, size the compute buffers.
    bench.prefill(kWarmupTokens)
    bench.decode_steps(kWarmupTokens, 4)

    prefill_tps, decode_tps, prefill_s, decode_ms = {}, {}, {}, {}
    for length in sorted(set(prefill_lens) | set(decode_ctx)):
        for _ in range(args.reps):
            bench.clear()
            t_pre = bench.prefill(length)
            if length in prefill_lens:
                prefill_s[str(length)] = min(prefill_s.get(str(length), 1e30), t_pre)
            if length in decode_ctx:
                t_dec = bench.decode_steps(length, args.decode_tokens)
                ms = 1000 * t_dec / args.decode_tokens
                decode_ms[str(length)] = min(decode_ms.get(str(length), 1e30), ms)
        if length in prefill_lens:
            prefill_tps[str(length)] = round(length / prefill_s[str(length)], 2)
        if length in decode_ctx:
            decode_tps[str(length)] = round(1000 / decode_ms[str(length)], 2)
        done = [f"prefill {prefill_tps[str(length)]} tok/s" if length in prefill_lens else "",
                f"decode {decode_tps[str(length)]} tok/s" if length in decode_ctx else ""]
        print(f"[llama.cpp] context {length}: {', '.join(d for d in done if d)}",
              file=sys.stderr, flush=True)
    rss_after_runs = rss_mb()
    load_s = bench.load_s
    cp = bench.cparams
    bench.free()

    # More load samples (fresh model + context each time); the first one above was the cold one.
    for _ in range(max(args.reps, 2)):
        b = Bench(args, n_ctx)
        load_s = min(load_s, b.load_s)
        b.free()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # measured before the
    load_llama_class = load_time_llama_class(args, n_ctx)  # high-level load, which adds its own

    out = {
        "engine": "llama.cpp",
        "llama_cpp_python_version": lc.__version__,
        "model": os.path.abspath(args.model),
        "threads": args.threads,
        "load_s": round(load_s, 4),
        "load_s_llama_class": round(load_llama_class, 4),
        "peak_rss_mb": round(peak, 1),
        "python_baseline_rss_mb": round(kBaselineRss, 1),
        "rss_after_import_mb": round(kImportRss, 1),
        "rss_after_load_mb": round(rss_after_load, 1),
        "rss_after_runs_mb": round(rss_after_runs, 1),
        "prefill_tps": prefill_tps,
        "decode_tps": decode_tps,
        "prefill_s": {k: round(v, 4) for k, v in prefill_s.items()},
        "decode_ms_per_token": {k: round(v, 3) for k, v in decode_ms.items()},
        "settings": {
            "n_ctx": n_ctx, "n_batch": args.n_batch, "n_ubatch": args.n_ubatch,
            "n_threads": cp.n_threads, "n_threads_batch": cp.n_threads_batch,
            "flash_attn_type": int(cp.flash_attn_type),
            "type_k": int(cp.type_k), "type_v": int(cp.type_v),
            "decode_tokens": args.decode_tokens, "reps": args.reps,
            "tokens": "random ids in [256, n_vocab), seed 1234",
            "log": sink.grep("flash_attn")[:1] + sink.grep("n_ctx ")[:1],
        },
        "system_info": lc.llama_print_system_info().decode().strip(),
        "loadavg_start_end": [round(load_avg_start[0], 2), round(os.getloadavg()[0], 2)],
    }
    if args.check_highlevel:
        check_highlevel(args, n_ctx, out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
