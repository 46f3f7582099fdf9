#!/usr/bin/env python3
"""lm-evaluation-harness (PyPI `lm-eval`) against deltaserve and llama-server on one GGUF.

Small tasks with their data in bench/lm_eval/tasks (these machines reach no dataset hub):
ds_mc (40 questions) and ds_arith (200 generated sums), multiple choice by loglikelihood
(acc, acc_norm), and ds_gen (30 questions), greedy generation scored by exact match. Runs,
each through the harness's own model classes:

  deltaserve serve       local-completions (remote tokenizer: /tokenizer_info, /tokenize;
                         loglikelihood through echo + logprobs) for both tasks, and
                         local-chat-completions (the model's chat template) for ds_gen;
                         again with --attention ggml (llama.cpp's rounding) for ds_mc
  deltaserve cluster     the gateway of a decode + prefill cluster, local-completions
  llama-server           local-completions and local-chat-completions for ds_gen; ds_mc
                         through bench/lm_eval/llama_server_lm.py (llama-server refuses
                         echo, so each continuation token is forced and scored)
  llama-server -fa off   the same loglikelihoods through llama.cpp's other attention path:
                         how far llama.cpp's own two roundings of this model lie apart

Prints each score beside llama-server's and the difference in points, and the largest
difference of one choice's loglikelihood; writes a JSON summary.

    python3 bench/run_lm_eval_bench.py [--model GGUF] [--out bench/out/lm_eval.json]

The harness is installed (once) into ~/.cache/deltaserve/lm-eval-venv.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.expanduser("~/.cache/deltaserve/lm-eval-venv")
LM_EVAL = "lm-eval[api]==0.4.13"
MC = ["ds_mc", "ds_arith"]  # the loglikelihood tasks


def ensure_venv():
    """Re-runs this script in the harness's venv (made with pip on first use)."""
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([os.path.join(VENV, "bin", "pip"), "install", "--quiet", "--disable-pip-version-check",
                        LM_EVAL], check=True)
    os.execv(py, [py, *sys.argv])


def evaluate(model, model_args, tasks, chat=False):
    import lm_eval
    from lm_eval.tasks import TaskManager
    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, apply_chat_template=chat,
                                  task_manager=TaskManager(include_path=os.path.join(HERE, "lm_eval", "tasks")),
                                  log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                  fewshot_random_seed=0)
    scores = {}
    for task, metrics in out["results"].items():
        for k, v in metrics.items():
            name, _, flt = k.partition(",")
            if name.endswith("_stderr") or not isinstance(v, (int, float)) or name in ("alias", "sample_len"):
                continue
            scores[f"{task} {name}"] = 100.0 * v
    lls = {}
    for task, samples in out.get("samples", {}).items():
        for s in samples:
            for i, r in enumerate(s.get("resps", [])):
                if r and isinstance(r[0], (list, tuple)) and isinstance(r[0][0], (int, float)):
                    lls[f"{task}/{s['doc_id']}/{i}"] = r[0][0]
    return scores, lls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--llama-server", default=None, help="llama-server binary (default: build it)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/out/lm_eval.json")
    a = ap.parse_args()
    ensure_venv()
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "lm_eval"))
    from servers import start_cluster, start_embedded
    from run_serving_bench import start_llama_server
    from llama_server_lm import LlamaServerForcedLM

    model = os.path.abspath(a.model)
    name = os.path.basename(model)
    build = os.path.abspath(a.build)
    server = a.llama_server
    if server is None:
        bin_dir = subprocess.run([os.path.join(HERE, "build_llama_server.sh")], check=True, capture_output=True,
                                 text=True).stdout.strip()
        server = os.path.join(bin_dir, "llama-server")
    os.chdir(os.path.join(HERE, "lm_eval", "tasks"))  # the tasks' data files are named from here

    def completions(port, tokenizer):
        return (f"model={name},base_url=http://127.0.0.1:{port}/v1/completions,tokenizer_backend={tokenizer},"
                "num_concurrent=4,max_retries=1")

    def chat(port):
        return f"model={name},base_url=http://127.0.0.1:{port}/v1/chat/completions,num_concurrent=4,max_retries=1"

    runs = {}
    lls = {}
    for label, attention in (("deltaserve", "native"), ("deltaserve ggml", "ggml")):
        port, stop = start_embedded(build, model, a.threads, 4096, ["--attention", attention])
        try:
            s, lls[label] = evaluate("local-completions", completions(port, "remote"),
                                     MC if attention == "ggml" else [*MC, "ds_gen"])
            if attention == "native":
                gen, _ = evaluate("local-chat-completions", chat(port), ["ds_gen"], chat=True)
                s.update({f"{k} (chat)": v for k, v in gen.items()})
            runs[label] = s
        finally:
            stop()
    port, stop = start_cluster(build, model, a.threads, 4096)
    try:
        runs["deltaserve cluster"], lls["deltaserve cluster"] = evaluate(
            "local-completions", completions(port, "remote"), [*MC, "ds_gen"])
    finally:
        stop()
    port, stop = start_llama_server(server, model, a.threads, 4096, 4, ["--jinja", "-fa", "off"])
    try:
        runs["llama-server -fa off"], lls["llama-server -fa off"] = evaluate(
            LlamaServerForcedLM(f"http://127.0.0.1:{port}"), None, MC)
    finally:
        stop()
    port, stop = start_llama_server(server, model, a.threads, 4096, 4, ["--jinja"])
    try:
        s, lls["llama-server"] = evaluate(LlamaServerForcedLM(f"http://127.0.0.1:{port}"), None, MC)
        gen, _ = evaluate("local-completions", completions(port, "None"), ["ds_gen"])
        s.update(gen)
        gen, _ = evaluate("local-chat-completions", chat(port), ["ds_gen"], chat=True)
        s.update({f"{k} (chat)": v for k, v in gen.items()})
        runs["llama-server"] = s
    finally:
        stop()

    labels = [k for k in runs if k != "llama-server"]
    print(f"\nlm-eval {LM_EVAL.split('==')[1]} on {name}, scores in points (llama-server's, and each one's "
          "difference from it)")
    print(f"{'task metric':<28} {'llama-server':>12} " + " ".join(f"{k:>20}" for k in labels))
    worst = {}
    for key in sorted(runs["llama-server"]):
        ref = runs["llama-server"][key]
        cells = []
        for k in labels:
            v = runs[k].get(key)
            if v is None:
                cells.append(f"{'-':>20}")
                continue
            worst[k] = max(worst.get(k, 0.0), abs(v - ref))
            cells.append(f"{v:>11.1f} ({v - ref:+6.1f})")
        print(f"{key:<28} {ref:>12.1f} " + " ".join(cells))
    spread = {}
    for k in labels:
        common = set(lls.get(k, {})) & set(lls["llama-server"])
        if common:
            spread[k] = max(abs(lls[k][c] - lls["llama-server"][c]) for c in common)
            print(f"largest |loglikelihood difference| of one choice, {k}: {spread[k]:.4f} nats "
                  f"over {len(common)} choices")
    for k, w in worst.items():
        print(f"largest score difference, {k}: {w:.1f} points")
    os.makedirs(os.path.dirname(os.path.join(HERE, "..", a.out)) or ".", exist_ok=True)
    with open(os.path.join(HERE, "..", a.out), "w") as f:
        json.dump({"model": name, "lm_eval": LM_EVAL, "scores": runs, "loglikelihoods": lls,
                   "largest_ll_difference": spread,
                   "largest_score_difference": worst}, f, indent=1)


if __name__ == "__main__":
    main()
