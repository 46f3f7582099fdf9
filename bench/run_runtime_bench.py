#!/usr/bin/env python3
"""Runtime benchmark driver: deltaserve vs llama.cpp on the same GGUF, threads and lengths.

Each round runs build/bin/deltaserve-bench-runtime and bench/llamacpp_runtime.py one after the
other (the order flips every round so neither always runs on a warmer machine), each in its own
process. Every engine prints JSON with the same keys:
  {"load_s", "peak_rss_mb", "prefill_tps": {"512",..}, "decode_tps": {"128",..}}
The best of the rounds is kept per row (highest tokens/s, lowest seconds and MB), then a table
with the deltaserve / llama.cpp ratio is printed, and a JSON summary (also written to --out).
The driver also records each child's peak RSS itself (wait4), so both engines' memory is
measured the same way as well as self-reported.

Usage (repository root):
  python3 bench/run_runtime_bench.py [--model M.gguf] [--threads 2] [--rounds 2] [--out F.json]
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

kRoot = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
kDefaultModel = os.path.join(kRoot, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
kDefaultBin = os.path.join(kRoot, "build", "bin", "deltaserve-bench-runtime")
kDefaultPython = os.path.join(kRoot, ".venv", "bin", "python")
kLlamaScript = os.path.join(kRoot, "bench", "llamacpp_runtime.py")



def rows(prefill_lens, decode_ctx):
    """(row label, key, sub-key or None, True when higher is better) for the table."""
    out = [("load (s)", "load_s", None, False),
           ("peak RSS (MB, self-reported)", "peak_rss_mb", None, False),
           ("peak RSS (MB, driver wait4)", "driver_peak_rss_mb", None, False)]
    out += [(f"prefill {n} (tok/s)", "prefill_tps", str(n), True) for n in prefill_lens]
    out += [(f"decode @{n} (tok/s)", "decode_tps", str(n), True) for n in decode_ctx]
    return out


def run_child(cmd, timeout_s):
    """Runs cmd; returns (rc, stdout, stderr, peak RSS MB of that child, wall seconds)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=kRoot)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), usage.ru_maxrss / 1024, wall)


def parse_json(stdout):
    """The whole stdout as JSON, else the last line-delimited JSON object in it."""
    try:
        return json.loads(stdout)
    except ValueError:
        pass
    start = stdout.rfind("\n{")
    for cand in ([stdout[start + 1:]] if start >= 0 else []) + stdout.splitlines()[::-1]:
        try:
            obj = json.loads(cand)
            if isinstance(obj, dict):
                return obj
        except ValueError:
            continue
    return None


def busy_fraction(window_s=2.0):
    """Share of all CPUs busy over window_s, from /proc/stat (the load average lags too much:
    right after one engine's run it still reads ~2 here)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
        return sum(v[:8]), idle
    t0, i0 = sample()
    time.sleep(window_s)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def wait_for_idle(max_busy, max_wait_s):
    """Waits until the CPUs are at most max_busy busy (or max_wait_s passes); returns the last
    reading. ggml's thread barriers spin, so a 2-thread run on a 2-core machine that is also
    doing something else slows down by 10x or more: such numbers are not comparable."""
    t0 = time.time()
    busy = busy_fraction()
    while busy > max_busy and time.time() - t0 < max_wait_s:
        time.sleep(5)
        busy = busy_fraction()
    return busy


def run_engine(name, cmd, timeout_s):
    print(f"  running {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    rc, stdout, stderr, rss, wall = run_child(cmd, timeout_s)
    res = parse_json(stdout) if rc == 0 else None
    if res is None:
        tail = "\n".join((stderr or stdout).splitlines()[-15:])
        print(f"  {name} failed (rc={rc}, {wall:.1f}s); last output:\n{tail}", file=sys.stderr)
        return None
    res["driver_peak_rss_mb"] = round(rss, 1)
    res["driver_wall_s"] = round(wall, 2)
    print(f"  {name}: done in {wall:.1f}s", file=sys.stderr, flush=True)
    return res


def value(res, key, sub):
    if res is None:
        return None
    v = res.get(key)
    if sub is not None:
        v = v.get(sub) if isinstance(v, dict) else None
    return v if isinstance(v, (int, float)) else None


def best_of(results, table_rows):
    """Per row, the best value over the rounds (None when no round produced it)."""
    best = {}
    for _, key, sub, higher in table_rows:
        vals = [v for v in (value(r, key, sub) for r in results) if v is not None]
        best[f"{key}.{sub}" if sub else key] = (max if higher else min)(vals) if vals else None
    return best


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def table(best_ds, best_lc, table_rows):
    lines = [f"{'metric':30s} {'deltaserve':>12s} {'llama.cpp':>12s} {'ds/llama':>9s}  better",
             "-" * 75]
    ratios = {}
    for label, key, sub, higher in table_rows:
        k = f"{key}.{sub}" if sub else key
        ds, lc = best_ds.get(k), best_lc.get(k)
        ratio = ds / lc if ds is not None and lc else None
        ratios[k] = round(ratio, 3) if ratio is not None else None
        better = "" if ratio is None else ("deltaserve" if (ratio > 1) == higher and ratio != 1
                                           else "llama.cpp" if ratio != 1 else "tie")
        lines.append(f"{label:30s} {fmt(ds):>12s} {fmt(lc):>12s} "
                     f"{(f'{ratio:.2f}x' if ratio is not None else '-'):>9s}  {better}")
    return "\n".join(lines), ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=kDefaultModel)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefill-lens", default="512,2048,8000",
                    help="prompt lengths, passed to both engines")
    ap.add_argument("--decode-ctx", default="128,2048,8000",
                    help="context lengths before the timed decode steps, passed to both")
    ap.add_argument("--decode-tokens", type=int, default=64, help="timed decode steps, both")
    ap.add_argument("--n-batch", type=int, default=512, help="tokens per decode call, both")
    ap.add_argument("--bin", default=kDefaultBin, help="deltaserve-bench-runtime binary")
    ap.add_argument("--python", default=kDefaultPython,
                    help="interpreter that has llama_cpp (the repo's .venv)")
    ap.add_argument("--out", help="also write the JSON summary here")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per engine run")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-deltaserve", action="store_true")
    ap.add_argument("--require-deltaserve", action="store_true",
                    help="fail instead of running llama.cpp alone when the binary is missing")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS",
                    help="before each run, wait up to this long for the CPUs to be at most "
                         "--idle-busy busy")
    ap.add_argument("--idle-busy", type=float, default=0.1,
                    help="busy fraction of all CPUs (over 2 s) counted as idle")
    ap.add_argument("--llamacpp-args", default="",
                    help="extra arguments for llamacpp_runtime.py only; use the = form: "
                         "--llamacpp-args='--check-highlevel'")
    args = ap.parse_args()

    if not os.path.isfile(args.model):
        sys.exit(f"model not found: {args.model}")
    model = os.path.abspath(args.model)
    common = ["--model", model, "--threads", str(args.threads), "--json",
              "--prefill-lens", args.prefill_lens, "--decode-ctx", args.decode_ctx,
              "--decode-tokens", str(args.decode_tokens), "--n-batch", str(args.n_batch)]
    table_rows = rows([int(x) for x in args.prefill_lens.split(",")],
                      [int(x) for x in args.decode_ctx.split(",")])
    engines = []
    if not args.skip_deltaserve:
        if os.access(args.bin, os.X_OK):
            engines.append(("deltaserve", [args.bin, *common]))
        else:
            msg = (f"deltaserve benchmark binary not found or not executable: {args.bin}\n"
                   "  build it with: cmake --build build --target deltaserve-bench-runtime -j1")
            if args.require_deltaserve:
                sys.exit(msg)
            print(msg + "\n  continuing with the llama.cpp side only", file=sys.stderr)
    if not args.skip_llamacpp:
        py = args.python if os.access(args.python, os.X_OK) else sys.executable
        engines.append(("llama.cpp", [py, kLlamaScript, *common, *args.llamacpp_args.split()]))
    if not engines:
        sys.exit("nothing to run")

    results = {name: [] for name, _ in engines}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for name, cmd in (engines if r % 2 == 0 else engines[::-1]):
            busy = wait_for_idle(args.idle_busy, args.wait_idle)
            if busy > max(args.idle_busy, 0.1):
                print(f"  warning: CPUs {100 * busy:.0f}% busy before this run; other work on "
                      "the machine will distort the numbers", file=sys.stderr)
            res = run_engine(name, cmd, args.timeout)
            if res is not None:
                res["driver_cpu_busy_before"] = round(busy, 3)
            results[name].append(res)

    best = {name: best_of(rs, table_rows) for name, rs in results.items()}
    text, ratios = table(best.get("deltaserve", {}), best.get("llama.cpp", {}), table_rows)
    print(f"\nruntime benchmark: {os.path.basename(model)}, {args.threads} threads, "
          f"best of {args.rounds} rounds\n")
    print(text)
    summary = {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(), "cpu_count": os.cpu_count(),
        "model": model, "threads": args.threads, "rounds": args.rounds,
        "prefill_lens": args.prefill_lens, "decode_ctx": args.decode_ctx,
        "decode_tokens": args.decode_tokens, "n_batch": args.n_batch,
        "best": best, "ratio_deltaserve_over_llamacpp": ratios,
        "runs": results,
    }
    blob = json.dumps(summary, indent=1)
    print("\n" + blob)
    if args.out:
        with open(args.out, "w") as f:
            f.write(blob + "\n")
        print(f"summary written to {args.out}", file=sys.stderr)
    failed = [n for n, rs in results.items() if not any(rs)]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
