"""Starting deltaserve for benchmarks: the embedded mode (`deltaserve serve`) or a local
multi-process cluster (decode, prefill and gateway processes from a generated cluster config,
KV over UCX on loopback). Both return (port, stop)."""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc, marker, what):
    for line in proc.stderr:
        if marker in line:
            return line
    sys.exit(f"error: {what} did not start (exit {proc.wait()})")


def start_embedded(build, model, threads, ctx, extra=()):
    # A fresh data dir each start (the default one is the user's), unless extra names one.
    data = [] if "--data-dir" in extra else ["--data-dir", tempfile.mkdtemp(prefix="deltaserve-bench-data-")]
    p = subprocess.Popen([os.path.join(build, "bin", "deltaserve"), "serve", "--model", model, "--port", "0",
                          "--threads", str(threads), "--ctx-size", str(ctx), *data, *extra],
                         stderr=subprocess.PIPE, text=True)
    line = _wait_ready(p, "http://", "deltaserve serve")
    subprocess.Popen(["cat"], stdin=p.stderr, stdout=subprocess.DEVNULL)  # keep draining its log

    def stop():
        p.terminate()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:  # prefills of clients that left still run
            p.kill()
            p.wait()
    return int(line.rsplit(":", 1)[1]), stop


def start_cluster(build, model, threads, ctx, config_extra=None, tls="tcp"):
    """One decode node, one prefill node and the gateway, each `threads` threads."""
    d = tempfile.mkdtemp(prefix="deltaserve-bench-")
    cfg = {"model": model, "threads": threads, "ctx_size": ctx, "data_dir": os.path.join(d, "data"),
           **(config_extra or {})}
    path = os.path.join(d, "cluster.yaml")
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {v}\n")
        f.write(f'transport: {{tls: "{tls}"}}\n')
        f.write(f'prefill:\n  - {{name: p0, rpc: "127.0.0.1:{_free_port()}"}}\n')
        f.write(f'decode:\n  - {{name: d0, rpc: "127.0.0.1:{_free_port()}", data: "127.0.0.1:0"}}\n')
    binary = os.path.join(build, "bin", "deltaserve")
    procs = []
    for role, name in (("decode", "d0"), ("prefill", "p0")):
        p = subprocess.Popen([binary, role, "--config", path, "--name", name], stderr=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, text=True)
        _wait_ready(p, "serving RPC", f"the {role} node")
        subprocess.Popen(["cat"], stdin=p.stderr, stdout=subprocess.DEVNULL)
        procs.append(p)
    g = subprocess.Popen([binary, "gateway", "--config", path, "--port", "0"], stderr=subprocess.PIPE, text=True)
    line = _wait_ready(g, "http://", "the gateway")
    subprocess.Popen(["cat"], stdin=g.stderr, stdout=subprocess.DEVNULL)
    procs.append(g)

    def stop():
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=60)
    return int(line.split("http://", 1)[1].split(":")[1].split()[0]), stop


def stream_chat(port, body, timeout=600, path="/v1/chat/completions"):
    """Posts a streaming chat completion (or, with path /v1/completions, a text completion);
    yields (seconds since the request, chunk) for each SSE chunk. Raises RuntimeError on an
    HTTP error. timeout: seconds without a byte (600, as the openai client's default)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]}")
        for line in resp:
            line = line.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                yield time.perf_counter() - t0, json.loads(line[6:])
    finally:
        conn.close()
