#!/usr/bin/env python3
"""The tiered KV store (issue 36), each figure beside its peer in the same run.

  resume:    turn-k time to first token of a session whose history (1k / 4k / 8k tokens of
             Debian FAQ text) is in decode memory, in the host tier (pushed out of decode
             memory by another session: serve --kv-sessions 1), or on disk only (the server
             restarted, the page cache dropped where allowed), against prefilling the same
             conversation again (a server without tiers or prefix cache); full KV and DeltaKV
             at keep 0.3. Also the disk tier's and host tier's bytes per token of history.
  sysprompt: a new session whose 2k-token system prompt another session left in the host tier
             or on disk, against prefilling it (full KV: its blocks are shared prefixes).
  store:     the disk tier's write and read MB/s (bench/tier_store_bench.cpp), RocksDB with
             the values in its blob files, and RocksDB's own db_bench (fillseq, then
             readrandom after the page cache was dropped) with the same value sizes.
  recovery:  `deltaserve serve --data-dir` on a data dir holding 1,000 and 10,000 sessions:
             the time its index and the gateway's session records took to open.

    python3 bench/run_tier_bench.py [--parts resume,sysprompt,store,recovery] [--out FILE]

Time to first token is measured at the client (the first SSE content chunk); each arm is the
median of --rounds sessions.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from run_fidelity_bench import faq_text  # noqa: E402
from servers import stream_chat  # noqa: E402

QUESTION = "In one sentence, what was the text above about?"
DELTAKV = ["--kv-policy", "deltakv", "--kv-keep", "0.3"]


def drop_page_cache():
    """Writes dirty pages back and drops the page cache (root only); whether it could."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Server:
    """`deltaserve serve` with the given flags until stop()."""

    def __init__(self, a, flags):
        self.p = subprocess.Popen([os.path.join(a.build, "bin", "deltaserve"), "serve", "--model", a.model,
                                   "--port", "0", "--threads", str(a.threads), *flags, *a.serve_args.split()],
                                  stderr=subprocess.PIPE, text=True)
        self.log = []
        for line in self.p.stderr:
            self.log.append(line)
            if "http://" in line:
                self.port = int(line.rsplit(":", 1)[1])
                break
        else:
            sys.exit("error: deltaserve serve did not start:\n" + "".join(self.log))
        subprocess.Popen(["cat"], stdin=self.p.stderr, stdout=subprocess.DEVNULL)

    def metric(self, name):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics") as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    def stop(self, kill=False):
        (self.p.kill if kill else self.p.terminate)()
        self.p.wait(timeout=120)


def chat(port, messages, session=None, max_tokens=1):
    """(seconds to the first content chunk, usage) of a streamed greedy answer."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if session:
        body["session_id"] = session
    ttft, usage, at = None, None, 0.0
    for at, chunk in stream_chat(port, body):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk["choices"]:
            if c["delta"].get("content") and ttft is None:
                ttft = at
    return (ttft if ttft is not None else at), usage


def source(usage):
    d = usage["prompt_tokens_details"]
    return f"{d.get('kv_source', 'none')}:{d['cached_tokens']}"


def resume(a, policy, lengths, text):
    """One policy's rows: TTFT from decode memory, host, disk and re-prefill per length."""
    flags = (DELTAKV if policy == "deltakv" else []) + ["--ctx-size", str(max(lengths) + 512)]
    data = tempfile.mkdtemp(prefix="deltaserve-tier-bench-")
    stored = ["--data-dir", data, "--kv-sessions", "1", "--prefix-cache-mib", "0"]
    rows = {n: {"history_tokens": 0, "decode": [], "host": [], "disk": [], "prefill": [], "sources": []}
            for n in lengths}
    histories = {}
    offset = 0
    s = Server(a, flags + stored)
    tokens = 0
    try:
        for n in lengths:
            for r in range(a.rounds):
                hist = text[offset:offset + 4 * n]  # about 4 characters per token; each its own
                offset += 4 * n
                sid = f"{policy}-{n}-{r}"
                s.post("/v1/sessions", {"id": sid})
                _, u = chat(s.port, [{"role": "user", "content": hist}], sid)
                rows[n]["history_tokens"] = u["prompt_tokens"]
                if tokens == 0:  # the first session, one turn stored: what a token costs
                    tokens = u["prompt_tokens"] + u["completion_tokens"]
                    time.sleep(0.5)
                    disk_bytes = s.metric("deltaserve_disk_tier_bytes")
                    host_bytes = s.metric("deltaserve_host_tier_bytes")
                t, u = chat(s.port, [{"role": "user", "content": QUESTION}], sid)
                rows[n]["decode"].append(t)
                rows[n]["sources"].append(source(u))
                # Another session's turn pushes this one out of decode memory (to the host tier).
                s.post("/v1/sessions", {"id": sid + "-other"})
                chat(s.port, [{"role": "user", "content": "Hello."}], sid + "-other")
                time.sleep(0.3)
                t, u = chat(s.port, [{"role": "user", "content": QUESTION}], sid)
                rows[n]["host"].append(t)
                rows[n]["sources"].append(source(u))
                histories[sid] = hist
    finally:
        s.stop(kill=True)
    cold = drop_page_cache()
    s = Server(a, flags + stored)
    try:
        for n in lengths:
            for r in range(a.rounds):
                t, u = chat(s.port, [{"role": "user", "content": QUESTION}], f"{policy}-{n}-{r}")
                rows[n]["disk"].append(t)
                rows[n]["sources"].append(source(u))
    finally:
        s.stop()
    shutil.rmtree(data, ignore_errors=True)
    s = Server(a, flags + ["--data-dir", "none", "--kv-host-memory", "0", "--prefix-cache-mib", "0"])
    try:
        for n in lengths:
            for r in range(a.prefill_rounds):
                hist = histories[f"{policy}-{n}-{r}"]
                conv = [{"role": "user", "content": hist}, {"role": "assistant", "content": ""},
                        {"role": "user", "content": QUESTION}]
                t, u = chat(s.port, conv)
                rows[n]["prefill"].append(t)
    finally:
        s.stop()
    out = []
    for n in lengths:
        row = {"policy": policy, "history_tokens": rows[n]["history_tokens"], "sources": rows[n]["sources"]}
        for arm in ("decode", "host", "disk", "prefill"):
            row[f"ttft_{arm}_s"] = statistics.median(rows[n][arm])
        for arm in ("decode", "host", "disk"):
            row[f"{arm}_speedup"] = row["ttft_prefill_s"] / row[f"ttft_{arm}_s"]
        out.append(row)
    return {"rows": out, "disk_bytes_per_token": disk_bytes / tokens, "host_bytes_per_token": host_bytes / tokens,
            "tokens": tokens, "page_cache_dropped": cold}


def bytes_per_token(a, lengths, text):
    """Per policy and history length: the disk and host tiers' bytes for one session's history
    (one turn stored), per token, and the decode memory's keep ratio then."""
    rows = []
    for policy in ("full", "deltakv"):
        flags = (DELTAKV if policy == "deltakv" else []) + ["--ctx-size", str(max(lengths) + 512)]
        data = tempfile.mkdtemp(prefix="deltaserve-tier-bench-")
        s = Server(a, flags + ["--data-dir", data, "--prefix-cache-mib", "0"])
        try:
            offset = 0
            for n in lengths:
                disk0, host0 = s.metric("deltaserve_disk_tier_bytes"), s.metric("deltaserve_host_tier_bytes")
                sid = f"bytes-{n}"
                s.post("/v1/sessions", {"id": sid})
                _, u = chat(s.port, [{"role": "user", "content": text[offset:offset + 4 * n]}], sid)
                offset += 4 * n
                time.sleep(0.5)
                tokens = u["prompt_tokens"] + u["completion_tokens"]
                rows.append({"policy": policy, "tokens": tokens,
                             "disk_bytes_per_token": (s.metric("deltaserve_disk_tier_bytes") - disk0) / tokens,
                             "host_bytes_per_token": (s.metric("deltaserve_host_tier_bytes") - host0) / tokens,
                             "keep_ratio": s.metric("deltaserve_kv_keep_ratio")})
        finally:
            s.stop()
            shutil.rmtree(data, ignore_errors=True)
    return rows


def sysprompt(a, text):
    system = text[:8000]  # about 2k tokens
    data = tempfile.mkdtemp(prefix="deltaserve-tier-bench-")
    stored = ["--data-dir", data, "--prefix-cache-mib", "0", "--ctx-size", "4096"]
    conv = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]  # noqa: E731
    res = {"host": [], "disk": [], "prefill": [], "sources": []}
    s = Server(a, stored)
    try:
        s.post("/v1/sessions", {"id": "first"})
        _, u = chat(s.port, conv("Hello."), "first")
        res["system_tokens"] = u["prompt_tokens"]
        for r in range(a.rounds):
            s.post("/v1/sessions", {"id": f"host-{r}"})
            t, u = chat(s.port, conv(f"Question {r}: what is this about?"), f"host-{r}")
            res["host"].append(t)
            res["sources"].append(source(u))
    finally:
        s.stop(kill=True)
    for r in range(a.rounds):
        res["cold"] = drop_page_cache()
        s = Server(a, stored)
        try:
            s.post("/v1/sessions", {"id": f"disk-{r}"})
            t, u = chat(s.port, conv(f"Question {r}: what is it about?"), f"disk-{r}")
            res["disk"].append(t)
            res["sources"].append(source(u))
        finally:
            s.stop()
    shutil.rmtree(data, ignore_errors=True)
    s = Server(a, ["--data-dir", "none", "--kv-host-memory", "0", "--prefix-cache-mib", "0", "--ctx-size", "4096"])
    try:
        for r in range(a.rounds):
            t, _ = chat(s.port, conv(f"Question {r}: what is this about?"))
            res["prefill"].append(t)
    finally:
        s.stop()
    for arm in ("host", "disk", "prefill"):
        res[f"ttft_{arm}_s"] = statistics.median(res[arm])
    return res


def store(a):
    d = tempfile.mkdtemp(prefix="deltaserve-tier-bench-", dir=a.disk_dir)
    rows = []
    try:
        p = subprocess.run([os.path.join(a.build, "bin", "deltaserve-bench-tier-store"), "--dir", d + "/t",
                            "--sizes", a.sizes, "--total", a.total], capture_output=True, text=True, check=True)
        for line in p.stdout.splitlines():
            row = json.loads(line)
            n, size = row["blocks"], row["size"]
            db = d + "/db"
            shutil.rmtree(db, ignore_errors=True)
            common = ["db_bench", f"--db={db}", f"--num={n}", f"--value_size={size}", "--key_size=16",
                      "--compression_type=none", "--threads=1"]
            # Flushed, so that the reads after the page cache was dropped come from the disk.
            w = subprocess.run(common + ["--benchmarks=fillseq,flush"], capture_output=True, text=True, check=True)
            drop_page_cache()
            r = subprocess.run(common + ["--benchmarks=readrandom", "--use_existing_db=1", f"--reads={n}"],
                               capture_output=True, text=True, check=True)
            mbps = lambda out, what: float(re.search(what + r"\s*:.*?;\s*([\d.]+) MB/s", out).group(1))  # noqa: E731
            row["db_bench_write_mbps"] = mbps(w.stdout, "fillseq")
            row["db_bench_read_mbps"] = mbps(r.stdout, "readrandom")
            shutil.rmtree(db, ignore_errors=True)
            rows.append(row)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return rows


def recovery(a, counts):
    rows = []
    for n in counts:
        d = tempfile.mkdtemp(prefix="deltaserve-tier-bench-", dir=a.disk_dir)
        try:
            subprocess.run([os.path.join(a.build, "bin", "deltaserve-bench-tier-store"), "--mode", "populate",
                            "--dir", d, "--sessions", str(n)], capture_output=True, text=True, check=True)
            cold = drop_page_cache()
            s = Server(a, ["--data-dir", d])
            s.stop()
            log = "".join(s.log)
            index = float(re.search(r"stored KV blocks .* in ([\d.]+) ms", log).group(1))
            m = re.search(r"(\d+) sessions recovered in ([\d.]+) ms", log)
            rows.append({"sessions": n, "recovered": int(m.group(1)), "index_ms": index,
                         "records_ms": float(m.group(2)), "total_ms": index + float(m.group(2)),
                         "page_cache_dropped": cold})
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--parts", default="resume,bytes,sysprompt,store,recovery")
    ap.add_argument("--lengths", default="1024,4096,8000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-rounds", type=int, default=1, help="re-prefill arm's rounds (slow at 8k)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="1MiB,8MiB,32MiB,80MiB")
    ap.add_argument("--total", default="1GiB")
    ap.add_argument("--sessions", default="1000,10000")
    ap.add_argument("--disk-dir", default=None, help="where the store's files go (default: the temp dir)")
    ap.add_argument("--serve-args", default="", help="more flags for every deltaserve serve")
    ap.add_argument("--out", default="bench/out/tier.json")
    a = ap.parse_args()
    parts = a.parts.split(",")
    lengths = [int(x) for x in a.lengths.split(",")]
    text = faq_text()
    result = {"model": a.model, "threads": a.threads, "rounds": a.rounds}
    if "resume" in parts:
        result["resume"] = {}
        for policy in ("full", "deltakv"):
            r = resume(a, policy, lengths, text)
            result["resume"][policy] = r
            for row in r["rows"]:
                print(f"resume {policy:7s} {row['history_tokens']:5d} tokens: TTFT ms decode "
                      f"{1000 * row['ttft_decode_s']:7.1f}, host {1000 * row['ttft_host_s']:7.1f}, disk "
                      f"{1000 * row['ttft_disk_s']:7.1f}, re-prefill {1000 * row['ttft_prefill_s']:8.1f}; "
                      f"speedup host {row['host_speedup']:.1f}x, disk {row['disk_speedup']:.1f}x", flush=True)
            print(f"resume {policy:7s} bytes per token: disk {r['disk_bytes_per_token']:.0f}, host "
                  f"{r['host_bytes_per_token']:.0f}", flush=True)
        f, d = result["resume"]["full"], result["resume"]["deltakv"]
        result["deltakv_disk_bytes_ratio"] = d["disk_bytes_per_token"] / f["disk_bytes_per_token"]
        print(f"DeltaKV 0.3 on disk: {result['deltakv_disk_bytes_ratio']:.3f}x full KV's bytes; host "
              f"sessions of 4096 tokens per GiB: full {2**30 / (4096 * f['host_bytes_per_token']):.1f}, DeltaKV "
              f"{2**30 / (4096 * d['host_bytes_per_token']):.1f}", flush=True)
    if "bytes" in parts:
        result["bytes"] = bytes_per_token(a, lengths, text)
        for r in result["bytes"]:
            f = [x for x in result["bytes"] if x["policy"] == "full" and abs(x["tokens"] - r["tokens"]) < 64]
            ratio = r["disk_bytes_per_token"] / f[0]["disk_bytes_per_token"] if f else float("nan")
            r["disk_ratio_to_full"] = ratio
            print(f"bytes {r['policy']:7s} {r['tokens']:5d} tokens: disk {r['disk_bytes_per_token']:.0f} B/token, "
                  f"host {r['host_bytes_per_token']:.0f}, keep ratio {r['keep_ratio']:.3f}, "
                  f"{ratio:.3f}x full KV's; host sessions of this length per GiB "
                  f"{2**30 / (r['tokens'] * r['host_bytes_per_token']):.1f}", flush=True)
    if "sysprompt" in parts:
        r = sysprompt(a, text)
        result["sysprompt"] = r
        print(f"system prompt {r['system_tokens']} tokens: TTFT ms host {1000 * r['ttft_host_s']:.1f}, disk "
              f"{1000 * r['ttft_disk_s']:.1f}, prefill {1000 * r['ttft_prefill_s']:.1f} "
              f"({r['ttft_prefill_s'] / r['ttft_host_s']:.1f}x, {r['ttft_prefill_s'] / r['ttft_disk_s']:.1f}x)",
              flush=True)
    if "store" in parts:
        result["store"] = store(a)
        for row in result["store"]:
            print(f"store {row['size'] >> 20:3d} MiB x {row['blocks']:4d}: MB/s write tier {row['tier_write_mbps']:7.0f}"
                  f" blob {row['blob_write_mbps']:7.0f} db_bench {row['db_bench_write_mbps']:7.0f} "
                  f"({row['tier_write_mbps'] / row['db_bench_write_mbps']:.2f}x); read tier {row['tier_read_mbps']:7.0f}"
                  f" blob {row['blob_read_mbps']:7.0f} db_bench {row['db_bench_read_mbps']:7.0f} "
                  f"({row['tier_read_mbps'] / row['db_bench_read_mbps']:.2f}x)", flush=True)
    if "recovery" in parts:
        result["recovery"] = recovery(a, [int(x) for x in a.sessions.split(",")])
        for row in result["recovery"]:
            print(f"recovery {row['sessions']:6d} sessions: index {row['index_ms']:.1f} ms + records "
                  f"{row['records_ms']:.1f} ms = {row['total_ms']:.1f} ms ({row['recovered']} recovered)", flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
