#!/usr/bin/env python3
"""Closed-loop load: concurrent chat sessions against the embedded mode and a disaggregated cluster.

For each concurrency (sessions at once) and each mode, N clients each run chat sessions back to
back: a first turn with a few hundred tokens of Debian FAQ text and a question, then short
follow-up turns in the same session (X-Session-ID: only the new message is sent); every answer
is streamed, `--max-tokens` long at most. A run lasts `--seconds` after a warm-up. Measured at
the client: time to first token (first content chunk), inter-token latency (gaps between
content chunks), and output tokens per second over the run. The embedded mode is
`deltaserve serve` (gateway + prefill worker + decode worker in one process); the cluster is
one decode, one prefill and one gateway process talking Cap'n Proto and shipping KV over UCX
(bench/servers.py). Same model, threads per worker, and sampling (greedy). Prints a table
and the cluster/embedded ratios; writes a JSON summary.

    python3 bench/run_load_bench.py [--sessions 1,8,32] [--seconds 40]
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from run_fidelity_bench import faq_text  # noqa: E402
from servers import start_cluster, start_embedded, stream_chat  # noqa: E402

FOLLOW_UPS = ["What is the main point?", "Say it in five words.", "Give one example."]


def turn(port, session, content, max_tokens):
    """(ttft, [inter-token gaps], completion tokens) of one streamed greedy turn."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "session_id": session}
    ttft, last, gaps, tokens, at = None, None, [], 0, 0.0
    for at, chunk in stream_chat(port, body):
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if any(c["delta"].get("content") for c in chunk["choices"]):
            if ttft is None:
                ttft = at
            else:
                gaps.append(at - last)
            last = at
    return (ttft if ttft is not None else at), gaps, tokens


def run_load(port, n_sessions, seconds, warmup, max_tokens, text):
    stop_at = time.perf_counter() + warmup + seconds
    measure_from = time.perf_counter() + warmup
    lock = threading.Lock()
    ttfts, gaps, tokens, turns, errors = [], [], [0], [0], []

    def client(i):
        s = 0
        while time.perf_counter() < stop_at:
            session = f"load-{n_sessions}-{i}-{s}"
            start = (i * 997 + s * 389) % (len(text) - 2000)
            prompts = [text[start:start + 1200] + "\n\nWhat is this about?"] + FOLLOW_UPS
            for p in prompts:
                if time.perf_counter() >= stop_at:
                    break
                began = time.perf_counter()
                try:
                    t, g, n = turn(port, session, p, max_tokens)
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    errors.append(str(e))
                    continue
                if began >= measure_from and time.perf_counter() <= stop_at:
                    with lock:
                        ttfts.append(t)
                        gaps.extend(g)
                        tokens[0] += n
                        turns[0] += 1
            s += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))
    return {"sessions": n_sessions, "turns": turns[0], "errors": len(errors),
            "ttft_median_s": statistics.median(ttfts) if ttfts else float("nan"), "ttft_p90_s": q(ttfts, 90),
            "itl_median_s": statistics.median(gaps) if gaps else float("nan"), "itl_p90_s": q(gaps, 90),
            "output_tokens_per_s": tokens[0] / seconds}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--sessions", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="threads per worker")
    ap.add_argument("--out", default="bench/out/load.json")
    a = ap.parse_args()
    text = faq_text()
    rows = []
    for n in [int(x) for x in a.sessions.split(",")]:
        for mode in ("embedded", "cluster"):
            start = start_embedded if mode == "embedded" else start_cluster
            port, stop = start(a.build, a.model, a.threads, 4096)
            try:
                r = run_load(port, n, a.seconds, a.warmup, a.max_tokens, text)
            finally:
                stop()
            r["mode"] = mode
            rows.append(r)
            print(f"{n:3d} sessions {mode:9s}: TTFT median {1000 * r['ttft_median_s']:7.1f} ms "
                  f"p90 {1000 * r['ttft_p90_s']:7.1f} ms, ITL median {1000 * r['itl_median_s']:6.1f} ms "
                  f"p90 {1000 * r['itl_p90_s']:6.1f} ms, {r['output_tokens_per_s']:6.1f} tok/s, "
                  f"{r['turns']} turns, {r['errors']} errors", flush=True)
        e, c = rows[-2], rows[-1]
        print(f"{n:3d} sessions cluster/embedded: TTFT {c['ttft_median_s'] / e['ttft_median_s']:.2f}x, "
              f"ITL {c['itl_median_s'] / e['itl_median_s']:.2f}x, "
              f"throughput {c['output_tokens_per_s'] / e['output_tokens_per_s']:.2f}x", flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model": a.model, "threads_per_worker": a.threads, "seconds": a.seconds,
                   "max_tokens": a.max_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
