#!/usr/bin/env python3
"""The admin service's session listing against serving (issue 37: "listing 100,000 sessions
never blocks serving"). A `deltaserve serve` with a data dir holds N sessions (opened over
HTTP; beyond --max-sessions they live as records); one client streams an answer while
`deltactl sessions --server` lists every session a page at a time. Prints the listing's time
and rows, and the streamed answer's inter-token gaps with the listing running against the same
answer without it (the peer here is the server itself, unlisted), as ratios.

    python3 bench/run_admin_bench.py [--sessions 100000] [--page-size 500]
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

KEY = "bench-admin-key"
NICE = []  # --nice: the lister at the lowest CPU priority (its own share of two cores aside)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_gaps(port, tokens):
    """Inter-token gaps (ms) of one streamed answer, as a client sees them."""
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story about bees."}],
                       "max_tokens": tokens, "temperature": 0, "stream": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    gaps, last = [], None
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        now = time.perf_counter()
        if last is not None:
            gaps.append(1000 * (now - last))
        last = now
    c.close()
    return gaps


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--sessions", type=int, default=100000)
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=400, help="tokens of the streamed answer")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nice", action="store_true", help="run deltactl under nice 19")
    ap.add_argument("--out", default="bench/out/admin.json")
    a = ap.parse_args()
    if a.nice:
        NICE.extend(["nice", "-n", "19"])

    data = tempfile.mkdtemp(prefix="deltaserve-admin-bench-")
    port, rpc = free_port(), free_port()
    serve = subprocess.Popen([os.path.join(a.build, "bin", "deltaserve"), "serve", "--model", a.model,
                              "--port", str(port), "--rpc-port", str(rpc), "--admin-key", KEY,
                              "--threads", str(a.threads), "--ctx-size", "2048", "--data-dir", data,
                              "--max-sessions", "1024"],
                             stderr=subprocess.PIPE, text=True)
    for line in serve.stderr:
        if "http://" in line:
            break
    threading.Thread(target=lambda: [None for _ in serve.stderr], daemon=True).start()
    try:
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(a.sessions):
            c.request("POST", "/v1/sessions", json.dumps({"id": f"s{i:07d}"}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                sys.exit(f"error: opening session {i}: HTTP {r.status}")
        opened = time.perf_counter() - t0
        print(f"opened {a.sessions} sessions in {opened:.1f} s", file=sys.stderr)

        base = stream_gaps(port, a.tokens)  # unlisted

        listing = {}

        def lister():
            t = time.perf_counter()
            p = subprocess.run([*NICE, os.path.join(a.build, "bin", "deltactl"), "sessions", "--server",
                                f"127.0.0.1:{rpc}", "--admin-key", KEY, "--json", "--page-size",
                                str(a.page_size)], capture_output=True, text=True)
            listing["seconds"] = time.perf_counter() - t
            listing["rc"] = p.returncode
            listing["rows"] = len(json.loads(p.stdout)) if p.returncode == 0 else 0
            listing["err"] = p.stderr[-300:]

        th = threading.Thread(target=lister)
        # The listing starts once the answer streams, and runs beside it.
        result = {}
        streamer = threading.Thread(target=lambda: result.update(gaps=stream_gaps(port, a.tokens)))
        streamer.start()
        time.sleep(0.5)
        th.start()
        th.join()
        streamer.join()
        listed = result["gaps"]
        if listing["rc"] != 0:
            sys.exit("error: deltactl sessions failed: " + listing["err"])
        out = {"sessions": a.sessions, "page_size": a.page_size, "open_seconds": opened,
               "listing_seconds": listing["seconds"], "rows": listing["rows"],
               "gaps_ms_alone": {"p50": pct(base, .5), "p99": pct(base, .99), "max": max(base)},
               "gaps_ms_listing": {"p50": pct(listed, .5), "p99": pct(listed, .99), "max": max(listed)}}
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        json.dump(out, open(a.out, "w"), indent=2)
        print(f"listing: {listing['rows']} sessions in {listing['seconds']:.2f} s "
              f"({listing['rows'] / listing['seconds']:.0f}/s), pages of {a.page_size}")
        for k in ("p50", "p99", "max"):
            x, y = out["gaps_ms_alone"][k], out["gaps_ms_listing"][k]
            print(f"inter-token gap {k}: {y:.1f} ms listing / {x:.1f} ms alone = {y / x:.2f}x")
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        subprocess.run(["rm", "-rf", data])


if __name__ == "__main__":
    main()
