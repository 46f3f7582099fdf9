#!/usr/bin/env python3
"""Turn-k time to first token: a session kept on the server vs the whole history prefilled again.

Starts `deltaserve serve` (embedded mode), or with --mode cluster a local cluster (decode,
prefill and gateway processes, KV over UCX; bench/servers.py), and, for each history length (tokens of Debian FAQ
text, not calibration text), opens session A with the history as its first message, then
times a short follow-up question in the session (only the new tokens are evaluated). The
baseline sends the same conversation without a session after another session (B, different
text of the same length) has taken the KV cache, so the whole history is prefilled again,
as an engine without session affinity would. Time to first token is measured at the client
(the first SSE content chunk); each arm is the median of --rounds. Prints a table and
writes a JSON summary.

    python3 bench/run_session_bench.py [--lengths 1024,4096,8000] [--rounds 3] [--mode cluster]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from run_fidelity_bench import faq_text  # noqa: E402
from servers import start_cluster, start_embedded, stream_chat  # noqa: E402

QUESTION = "In one sentence, what was the text above about?"


def chat(port, messages, session=None, max_tokens=8):
    """(seconds to the first content chunk, usage, text) of a streamed greedy answer."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if session:
        body["session_id"] = session
    ttft, usage, text, at = None, None, "", 0.0
    try:
        for at, chunk in stream_chat(port, body):
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                if c["delta"].get("content"):
                    text += c["delta"]["content"]
                    if ttft is None:
                        ttft = at
    except RuntimeError as e:
        sys.exit(f"error: {e}")
    return ttft if ttft is not None else at, usage, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--lengths", default="1024,4096,8000", help="history lengths in tokens (about)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/out/session.json")
    ap.add_argument("--serve-args", default="", help="extra flags for deltaserve serve (e.g. a KV policy)")
    ap.add_argument("--mode", choices=["embedded", "cluster"], default="embedded")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    ctx = max(lengths) + 512
    if a.mode == "cluster":
        port, stop = start_cluster(a.build, a.model, a.threads, ctx)
    else:
        port, stop = start_embedded(a.build, a.model, a.threads, ctx, a.serve_args.split())
    text = faq_text()
    rows = []
    try:
        for n in lengths:
            # About 4 characters per token in this text; the server reports the exact count.
            hist_a, hist_b = text[:4 * n], text[4 * n:8 * n]
            kept, again, usage_kept, usage_again = [], [], None, None
            for r in range(a.rounds):
                session = f"a-{n}-{r}"
                _, u1, reply = chat(port, [{"role": "user", "content": hist_a}], session, max_tokens=1)
                t, usage_kept, _ = chat(port, [{"role": "user", "content": QUESTION}], session)
                kept.append(t)
                chat(port, [{"role": "user", "content": hist_b}], None, max_tokens=1)  # B takes the cache
                full = [{"role": "user", "content": hist_a}, {"role": "assistant", "content": reply},
                        {"role": "user", "content": QUESTION}]
                t, usage_again, _ = chat(port, full)
                again.append(t)
            row = {"history_tokens": u1["prompt_tokens"], "ttft_kept_s": statistics.median(kept),
                   "ttft_reprefill_s": statistics.median(again),
                   "kept_cached_tokens": usage_kept["prompt_tokens_details"]["cached_tokens"],
                   "kept_prompt_tokens": usage_kept["prompt_tokens"],
                   "reprefill_cached_tokens": usage_again["prompt_tokens_details"]["cached_tokens"]}
            row["speedup"] = row["ttft_reprefill_s"] / row["ttft_kept_s"]
            rows.append(row)
            print(f"history {row['history_tokens']:5d} tokens: TTFT kept {1000 * row['ttft_kept_s']:8.1f} ms "
                  f"({row['kept_cached_tokens']}/{row['kept_prompt_tokens']} cached), re-prefill "
                  f"{1000 * row['ttft_reprefill_s']:8.1f} ms ({row['reprefill_cached_tokens']} cached): "
                  f"{row['speedup']:.1f}x", flush=True)
    finally:
        stop()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model": a.model, "mode": a.mode, "threads": a.threads, "rounds": a.rounds, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
