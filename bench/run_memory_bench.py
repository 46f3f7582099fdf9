#!/usr/bin/env python3
"""Memory as throughput: at one KV budget, how many long sessions a server holds at once and
the decode tokens/s they get together.

Three servers in turn, on the same GGUF and threads: deltaserve with full KV and with DeltaKV
(--kv-keep, default 0.3) at the same --kv-memory, and llama-server with as many slots of
--ctx tokens as that memory holds in fp16 (one slot per session; -np slots -c slots*ctx) and
no prompt cache in host memory (--cache-ram 0; the arm llama-server-cache-ram keeps its
default, 8 GiB, which holds idle conversations outside the budget).
Each of --clients clients reads its own ~8k-token document (--doc-chars of the FAQ, each starting
elsewhere, so no two share a prefix) into its own session and
then asks short questions in it, one after another (--answer tokens each, greedy, streamed); a
conversation that outgrows the context (HTTP 400) starts again on the same document.
deltaserve keeps each session's KV (session_id: only the new message is sent); llama-server
gets the whole conversation every time and reuses what its slot still holds. A request
refused with 429 (KV memory full) is sent again after --retry seconds.

Counted over --seconds once every client's document was read (or after --warmup-limit):
output tokens/s, time to first token of the questions (p50/p90), requests and 429s, the
sessions whose KV deltaserve holds (/metrics, sampled) and the server's peak RSS.

    python3 bench/run_memory_bench.py [--kv-memory 1GiB] [--clients 16]
"""
import argparse
import http.client
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from run_fidelity_bench import faq_text  # noqa: E402
from run_serving_bench import QUESTIONS, pct, start_llama_server  # noqa: E402
from servers import start_embedded, stream_chat  # noqa: E402

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text.strip(), re.I)
    if not m:
        sys.exit(f"error: '{text}' is not a size")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def gguf_kv_bytes_per_token(path):
    """fp16 K and V bytes of one token over every layer, from the GGUF's metadata."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"error: {path} is not a GGUF file")
        _, _, n_kv = struct.unpack("<IQQ", f.read(20))

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def value(t):
            if t in scalar:
                fmt = "<" + scalar[t]
                return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
            if t == 8:
                return string()
            if t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                return [value(et) for _ in range(n)]
            sys.exit(f"error: GGUF value type {t}")

        meta = {}
        for _ in range(n_kv):
            key = string()
            (t,) = struct.unpack("<I", f.read(4))
            meta[key] = value(t)
    arch = meta["general.architecture"]
    heads = meta[f"{arch}.attention.head_count"]
    kv_heads = meta.get(f"{arch}.attention.head_count_kv", heads)
    head_dim = meta.get(f"{arch}.attention.key_length", meta[f"{arch}.embedding_length"] // heads)
    return meta[f"{arch}.block_count"] * kv_heads * head_dim * 2 * 2


def metric(port, name):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
        c.close()
    except OSError:
        return None
    m = re.search(rf"^{name} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def peak_rss_mib(port):
    """VmHWM of the process listening on the port."""
    out = subprocess.run(["ss", "-ltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    m = re.search(r"pid=(\d+)", out)
    if not m:
        return None
    with open(f"/proc/{m.group(1)}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


class Recorder:
    def __init__(self):
        self.mu = threading.Lock()
        self.out, self.ttft = [], []
        self.read = set()
        self.refused = self.errors = self.restarted = 0
        self.first_error = None
        self.error_kinds = {}  # the errors by their first words (HTTP status, "timed out")


def new_session(port, i):
    session = f"mem-{i}-{int(time.time() * 1000)}"
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/sessions", json.dumps({"id": session}), {"Content-Type": "application/json"})
    c.getresponse().read()
    c.close()
    return session


def client(i, port, sessions, doc, a, rec, stop):
    first_message = {"role": "user", "content": doc + "\n\nRead this; I will ask about it."}
    history = [first_message]
    session = new_session(port, i) if sessions else None
    sent = 0  # messages deltaserve's session already holds
    q = i
    while not stop.is_set():
        body = {"messages": history[sent:] if session else history, "max_tokens": a.answer,
                "temperature": 0, "stream": True}
        if session:
            body["session_id"] = session
        t0, first, text = time.time(), None, ""
        try:
            for _, chunk in stream_chat(port, body, a.timeout):
                for c in chunk.get("choices", []):
                    piece = c.get("delta", {}).get("content")
                    if not piece:
                        continue
                    now = time.time()
                    text += piece
                    with rec.mu:
                        rec.out.append(now)
                        if first is None and i in rec.read:
                            rec.ttft.append((now, now - t0))
                    first = first or now
        except (OSError, RuntimeError, ValueError) as e:
            if "HTTP 400" in str(e) and "context" in str(e) and len(history) > 1:
                # The conversation outgrew the context: a new chat on the same document, as
                # a user would start one (it is read again).
                with rec.mu:
                    rec.restarted += 1
                history, sent = [first_message], 0
                session = new_session(port, i) if sessions else None
                continue
            with rec.mu:
                if "HTTP 429" in str(e):
                    rec.refused += 1
                else:
                    rec.errors += 1
                    rec.first_error = rec.first_error or str(e)
                    kind = " ".join(str(e).split()[:2])
                    rec.error_kinds[kind] = rec.error_kinds.get(kind, 0) + 1
            time.sleep(a.retry)
            continue
        history.append({"role": "assistant", "content": text})
        sent = len(history)
        with rec.mu:
            rec.read.add(i)
        q += 1
        history.append({"role": "user", "content": QUESTIONS[q % len(QUESTIONS)]})


def measure(port, a, docs, sessions):
    rec, stop = Recorder(), threading.Event()
    threads = [threading.Thread(target=client, args=(i, port, sessions, docs[i], a, rec, stop), daemon=True)
               for i in range(a.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    while time.time() - t0 < a.warmup_limit:
        with rec.mu:
            if len(rec.read) == a.clients:
                break
        time.sleep(1)
    w0 = time.time()
    with rec.mu:
        read, refused0 = len(rec.read), rec.refused
    resident = []
    while time.time() < w0 + a.seconds:
        time.sleep(2)
        if sessions:
            resident.append(metric(port, "deltaserve_kv_sessions"))
    w1 = time.time()
    stop.set()
    with rec.mu:
        out = sum(1 for t in rec.out if w0 <= t < w1)
        error_kinds = dict(rec.error_kinds)
        ttft = [v for t, v in rec.ttft if w0 <= t < w1]
        refused = rec.refused - refused0
        errors, first_error, restarted = rec.errors, rec.first_error, rec.restarted
    resident = [r for r in resident if r is not None]
    return {"read_before_window": read, "warmup_s": round(w0 - t0, 1), "output_tps": out / (w1 - w0),
            "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9), "questions": len(ttft),
            "refused_429": refused, "errors": errors, "conversations_restarted": restarted,
            "first_error": first_error, "error_kinds": error_kinds,
            "sessions_resident": max(resident) if resident else None, "peak_rss_mib": peak_rss_mib(port)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--llama-server", default=None, help="llama-server binary (default: build it)")
    ap.add_argument("--kv-memory", default="1GiB")
    ap.add_argument("--kv-keep", type=float, default=0.3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--doc-chars", type=int, default=31000, help="about 8k tokens of the FAQ")
    ap.add_argument("--ctx", type=int, default=9216, help="context per session")
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup-limit", type=float, default=900)
    ap.add_argument("--retry", type=float, default=0.5)
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds a request waits for a byte before the client gives up (and the "
                         "server cancels it), as the openai client's default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arms", default="full,deltakv,llama-server",
                    help="of full, deltakv, llama-server, llama-server-cache-ram")
    ap.add_argument("--out", default="bench/out/memory.json")
    a = ap.parse_args()

    budget = parse_size(a.kv_memory)
    # Each client its own document: a stretch of the FAQ starting elsewhere, so that no two
    # prompts share a prefix (a server's prefix cache would otherwise compute one for all).
    text = faq_text()
    step = max(1, (len(text) - a.doc_chars) // max(1, a.clients))
    docs = [text[i * step:i * step + a.doc_chars] for i in range(a.clients)]
    per_slot = gguf_kv_bytes_per_token(a.model) * a.ctx
    slots = max(1, budget // per_slot)
    rows = {}
    for arm in a.arms.split(","):
        if arm.startswith("llama-server"):
            server = a.llama_server
            if server is None:
                bin_dir = subprocess.run([os.path.join(os.path.dirname(__file__), "build_llama_server.sh")],
                                         check=True, capture_output=True, text=True).stdout.strip()
                server = os.path.join(bin_dir, "llama-server")
            # llama-server keeps prompts of idle slots in host memory besides its slots
            # (--cache-ram, 8 GiB by default): "llama-server" is held to the budget without
            # it, "llama-server-cache-ram" runs as it comes.
            extra = [] if arm == "llama-server-cache-ram" else ["--cache-ram", "0"]
            port, stop = start_llama_server(server, a.model, a.threads, a.ctx, slots, extra)
            sessions = False
        else:
            extra = ["--kv-memory", a.kv_memory, "--max-sessions", str(4 * a.clients)]
            if arm == "deltakv":
                extra += ["--kv-policy", "deltakv", "--kv-keep", str(a.kv_keep)]
            port, stop = start_embedded(a.build, a.model, a.threads, a.ctx, extra)
            sessions = True
        try:
            rows[arm] = measure(port, a, docs, sessions)
        finally:
            stop()
        print(arm, json.dumps(rows[arm]), flush=True)
    print(f"\nKV memory {a.kv_memory}, {a.clients} clients, ~{a.doc_chars // 4} tokens each; "
          f"llama-server: {slots} slots of {a.ctx}")
    print("| | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for key, fmt in (("output_tps", "{:.1f}"), ("ttft_p50", "{:.2f}"), ("ttft_p90", "{:.2f}"),
                     ("questions", "{}"), ("refused_429", "{}"), ("sessions_resident", "{}"),
                     ("peak_rss_mib", "{:.0f}"), ("errors", "{}"), ("conversations_restarted", "{}")):
        cells = [fmt.format(r[key]) if r.get(key) is not None else "--" for r in rows.values()]
        print(f"| {key} | " + " | ".join(cells) + " |")
    if "full" in rows and "deltakv" in rows and rows["full"]["output_tps"] > 0:
        print(f"deltakv / full output tokens/s: {rows['deltakv']['output_tps'] / rows['full']['output_tps']:.2f}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model": a.model, "kv_memory": a.kv_memory, "clients": a.clients, "slots": slots,
                   "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
