#!/usr/bin/env python3
"""Runs the fidelity benchmark (deltaserve-bench-fidelity) and prints its tables, a JSON
summary and a plot.

Text: the Debian FAQ (Debian package `debian-faq`, installed with apt when missing, or
unpacked from a downloaded .deb without root), with its table of contents dropped and its
hard-wrapped lines joined into paragraphs. It is not used to calibrate DeltaKV (calibration
reads the license texts in /usr/share/common-licenses). `--text F` takes another text
instead (plain or .gz), its lines joined into paragraphs the same way.

Usage (from the repository root, after ./deploy/setup.sh):
  python3 bench/run_fidelity_bench.py [--lengths 2048,4096,8192] [--keeps 0.5,0.3,0.2]
      [--retrieval-keeps 0.3] [--tasks ppl,decode,retrieval,multiturn] [--text F]
      [--out bench/out/fidelity]
Writes OUT.json (the raw results), OUT.summary.json and OUT.png.
  python3 bench/run_fidelity_bench.py --merge A.json B.json --out C
merges two runs (e.g. over different --policies; the full-KV arm is taken from the first)
and prints the tables and plot of the whole.
"""

import argparse
import glob
import gzip
import json
import math
import os
import re
import subprocess
import sys
import tempfile

FAQ = "/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz"


def paragraphs(raw):
    """Hard-wrapped lines joined into paragraphs, blank lines between them."""
    ps = [" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", raw)]
    return "\n\n".join(p for p in ps if p)


def text_file(path):
    """Another text than the FAQ (plain or .gz UTF-8), its lines joined into paragraphs."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return paragraphs(f.read())


def faq_text():
    path = FAQ
    if not os.path.exists(path):
        if os.geteuid() == 0:
            subprocess.run(["apt-get", "install", "-y", "-qq", "debian-faq"], check=False,
                           stdout=subprocess.DEVNULL)
        if not os.path.exists(path):
            tmp = tempfile.mkdtemp()
            subprocess.run(["apt-get", "download", "debian-faq"], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
            deb = glob.glob(os.path.join(tmp, "*.deb"))[0]
            subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
            path = tmp + FAQ
    raw = gzip.open(path, "rt", encoding="utf-8").read()
    # The body starts where chapter 1's heading appears for the second time (after the TOC).
    starts = [m.start() for m in re.finditer(r"^1\. Definitions and overview", raw, re.M)]
    return paragraphs(raw[starts[1]:] if len(starts) > 1 else raw)


def summarize(r):
    """Per (length, arm): ppl, ppl vs full, KL, KR; retrieval relative to full; decode ratio."""
    s = {"ppl": {}, "retrieval": {}, "multiturn": {}, "decode": {}}
    for n, raw in r.get("ppl", {}).items():
        arms = {a: dict(v) for a, v in raw.items() if not a.startswith("_")}
        tail = raw.get("_tail_tokens", 0)
        if tail:
            # The headline is over the tokens fed in chunks; the tail (fed one at a time) apart.
            every = raw["_tokens"] - 1
            for v in arms.values():
                if "ppl_tail" not in v:  # merged from a run without a tail
                    continue
                v["ppl"] = math.exp((math.log(v["ppl"]) * every - math.log(v["ppl_tail"]) * tail) / (every - tail))
                v["kl_mean"] = (v["kl_mean"] * every - v["kl_tail"] * tail) / (every - tail)
        full = arms["full"]["ppl"]
        s["ppl"][n] = {a: {"ppl": v["ppl"], "ppl_vs_full": v["ppl"] / full - 1.0, "kl_mean": v["kl_mean"],
                           "keep_ratio": v["keep_ratio"]} for a, v in arms.items()}
        if tail:
            for a, v in arms.items():
                if "ppl_tail" in v:
                    s["ppl"][n][a].update({"ppl_tail": v["ppl_tail"], "kl_tail": v["kl_tail"], "tail_tokens": tail,
                                           "ppl_tail_vs_full": v["ppl_tail"] / arms["full"]["ppl_tail"] - 1.0})
    for n, tasks in r.get("retrieval", {}).items():
        for task, arms in tasks.items():
            s["retrieval"].setdefault(n, {})[task] = {
                a: {"loglik": v["loglik"], "exact": v["exact"],
                    "loglik_minus_full": v["loglik"] - arms["full"]["loglik"]} for a, v in arms.items()}
    for a, v in r.get("multiturn", {}).items():
        s["multiturn"][a] = {"later_loglik_mean": v["later_loglik_mean"], "later_exact": v["later_exact"]}
    for n, arms in r.get("decode_ms", {}).items():
        s["decode"][n] = {a: {"ms": v, "vs_full": v / arms["full"]} for a, v in arms.items()}
    return s


def print_tables(s):
    for n, arms in s["ppl"].items():
        print(f"\nperplexity at {n} tokens fed in chunks (KL to full, measured keep ratio)")
        tail = "ppl_tail" in next(iter(arms.values()))
        print(f"{'arm':18} {'KR':>6} {'ppl':>8} {'vs full':>8} {'KL':>8}" +
              (f" | {'then the tail, one token at a time':>26}" if tail else ""))
        for a, v in arms.items():
            line = f"{a:18} {v['keep_ratio']:6.3f} {v['ppl']:8.3f} {100 * v['ppl_vs_full']:+7.2f}% {v['kl_mean']:8.4f}"
            if "ppl_tail" in v:
                line += f" | {v['ppl_tail']:8.3f} {100 * v['ppl_tail_vs_full']:+7.2f}% {v['kl_tail']:8.4f}"
            print(line)
    for n, tasks in s["retrieval"].items():
        print(f"\nretrieval at {n} tokens: answer log-likelihood (share of probes answered exactly)")
        arms = list(next(iter(tasks.values())).keys())
        print(f"{'arm':18} " + " ".join(f"{t:>18}" for t in tasks))
        for a in arms:
            cells = [f"{tasks[t][a]['loglik']:10.2f} ({float(tasks[t][a]['exact']):4.2f})" for t in tasks]
            print(f"{a:18} " + " ".join(f"{c:>18}" for c in cells))
    if s["multiturn"]:
        print("\nmulti-turn: questions 2-4 about facts no earlier question touched")
        for a, v in s["multiturn"].items():
            print(f"{a:18} mean loglik {v['later_loglik_mean']:8.2f}  exact {v['later_exact']}/3")
    for n, arms in s["decode"].items():
        print(f"\ndecode step at {n} tokens of context")
        for a, v in arms.items():
            print(f"{a:18} {v['ms']:8.2f} ms  {v['vs_full']:5.2f}x full")


def plot(s, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            # Debian's python3-matplotlib (setup installs it) is seen by the system interpreter
            # only, not by a pyenv or venv one.
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(s, f)
            code = ("import json, sys; sys.path.insert(0, %r); import run_fidelity_bench as r; "
                    "r.plot(json.load(open(%r)), %r)") % (os.path.dirname(os.path.abspath(__file__)), f.name, path)
            done = subprocess.run([system, "-c", code]).returncode == 0
            os.unlink(f.name)
            if done:
                return
        print("(no matplotlib: apt-get install python3-matplotlib for the plot)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(s["ppl"]) or 1, figsize=(5 * max(1, len(s["ppl"])), 4), squeeze=False)
    for ax, (n, arms) in zip(axes[0], s["ppl"].items()):
        policies = sorted({a.split("@")[0] for a in arms if a != "full"})
        for p in policies:
            pts = sorted((v["keep_ratio"], 100 * v["ppl_vs_full"]) for a, v in arms.items() if a.split("@")[0] == p)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
        ax.axhline(3.0, color="grey", linestyle=":", label="+3% target")
        ax.set_title(f"{n} tokens")
        ax.set_xlabel("measured keep ratio")
        ax.set_ylabel("perplexity vs full KV (%)")
        ax.set_yscale("symlog")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def merge(paths):
    """The arms of several raw results in one (nested dicts merged; the first wins)."""
    def deep(a, b):
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict):
                deep(a[k], v)
            elif k not in a:
                a[k] = v
        return a
    out = {}
    for p in paths:
        deep(out, json.load(open(p)))
    return out


def report(r, out):
    s = summarize(r)
    with open(out + ".summary.json", "w") as f:
        json.dump(s, f, indent=1)
    print_tables(s)
    plot(s, out + ".png")
    print(f"\nsummary: {out}.summary.json  plot: {out}.png")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--merge", nargs="+", help="raw results to merge and report (no run)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--profile", default="profiles/SmolLM2-135M-Instruct.Q4_1.gguf/deltakv.json")
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--keeps", default="0.5,0.3,0.2")
    ap.add_argument("--retrieval-keeps", default="0.3")
    ap.add_argument("--tasks", default="ppl,decode,retrieval,multiturn")
    ap.add_argument("--decode-tail", default="128", help="last tokens of each text fed one at a time")
    ap.add_argument("--policies", default="deltakv,kvcompress,d2o,trimkv,snapkv,h2o,keydiff,streaming")
    ap.add_argument("--out", default="bench/out/fidelity")
    ap.add_argument("--text", help="another text than the Debian FAQ (plain or .gz; perplexity and "
                    "decode; retrieval and multi-turn use it as filler)")
    # Anything else (--probes, --select, --decode-steps, --threads, ...) goes to the binary.
    a, rest = ap.parse_known_args()
    if a.text and not os.path.isfile(a.text):
        ap.error(f"--text {a.text}: no such file")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    if a.merge:
        r = merge(a.merge)
        with open(a.out + ".json", "w") as f:
            json.dump(r, f, indent=1)
        report(r, a.out)
        return
    text_path = a.out + ".text.txt"
    with open(text_path, "w") as f:
        f.write(text_file(a.text) if a.text else faq_text())
    run = subprocess.run([os.path.join(a.build, "bin", "deltaserve-bench-fidelity"), "--model", a.model,
                          "--profile", a.profile, "--text", text_path, "--out", a.out + ".json",
                          "--lengths", a.lengths, "--keeps", a.keeps, "--retrieval-keeps", a.retrieval_keeps,
                          "--tasks", a.tasks, "--policies", a.policies, "--decode-tail", a.decode_tail] + rest)
    if run.returncode != 0:  # the binary has said why on stderr
        sys.exit(run.returncode)
    report(json.load(open(a.out + ".json")), a.out)


if __name__ == "__main__":
    main()
