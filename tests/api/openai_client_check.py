#!/usr/bin/env python3
"""Talks to a running `deltaserve serve` with the real `openai` client, as a user would.

    openai_client_check.py --port N [--api-key KEY]

Checks (exit 1 with the reason on failure): the model list; a greedy answer, non-streaming
and streaming, the streamed pieces adding up to the same text with usage in the last
chunk; a session opened with POST /v1/sessions, then two turns through extra_headers
(X-Session-ID) where turn 2 sends only its new message and finds the history in the KV
cache; a session the server does not hold is NotFoundError (session_not_found); with a key,
a wrong key is AuthenticationError; an API error for a bad request.
Prints one JSON line with what it saw.
"""
import argparse
import json
import sys
import urllib.request

import openai


def fail(why):
    sys.exit(f"openai client check failed: {why}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api-key", default="none")
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}/v1"
    client = openai.OpenAI(base_url=base, api_key=a.api_key, max_retries=0, timeout=120)
    if a.api_key != "none":
        try:
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
            fail("a wrong API key was accepted")
        except openai.AuthenticationError:
            pass

    models = [m.id for m in client.models.list()]
    if len(models) != 1:
        fail(f"models {models}")
    model = models[0]
    question = [{"role": "user", "content": "What is the capital of France?"}]

    answer = client.chat.completions.create(model=model, messages=question, max_tokens=16, temperature=0)
    text = answer.choices[0].message.content
    if not text or answer.usage.completion_tokens < 1 or answer.choices[0].finish_reason not in ("stop", "length"):
        fail(f"answer {answer}")

    pieces, usage, finish = [], None, None
    for chunk in client.chat.completions.create(model=model, messages=question, max_tokens=16, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    if "".join(pieces) != text:
        fail(f"streamed {''.join(pieces)!r} != {text!r}")
    if usage is None or usage.completion_tokens != answer.usage.completion_tokens or finish is None:
        fail(f"stream usage {usage} finish {finish}")

    # Logprobs, as the client types them: each token's, its top alternatives, the text again.
    lp = client.chat.completions.create(model=model, messages=question, max_tokens=8, temperature=0,
                                        logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    if "".join(t.token for t in content) != lp.choices[0].message.content or \
            any(len(t.top_logprobs) != 3 or t.top_logprobs[0].token != t.token or t.logprob > 0
                for t in content):
        fail(f"chat logprobs {lp.choices[0].logprobs}")

    # Text completions: a raw prompt, whole and streamed, echo, logprobs as a count.
    prompt = "The capital of France is"
    done = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    c = done.choices[0]
    if not c.text or c.logprobs is None or "".join(c.logprobs.tokens) != c.text or \
            len(c.logprobs.token_logprobs) != done.usage.completion_tokens or \
            any(len(t) != 2 for t in c.logprobs.top_logprobs):
        fail(f"completion {done}")
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True) if ch.choices)
    if streamed != c.text:
        fail(f"streamed completion {streamed!r} != {c.text!r}")
    echoed = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, echo=True)
    if echoed.choices[0].text != prompt + c.text:
        fail(f"echo {echoed.choices[0].text!r}")
    # The prompt scored (lm-eval's loglikelihood): echo with logprobs, and vLLM's
    # prompt_logprobs through extra_body.
    scored = client.completions.create(model=model, prompt=prompt + c.text, max_tokens=1, temperature=0,
                                       echo=True, logprobs=1, extra_body={"prompt_logprobs": 1})
    s = scored.choices[0]
    listed = s.model_extra.get("prompt_logprobs") if s.model_extra else None
    n_prompt = scored.usage.prompt_tokens
    if s.logprobs.token_logprobs[0] is not None or len(s.logprobs.tokens) < n_prompt or \
            any(v is None or v > 0 for v in s.logprobs.token_logprobs[1:]) or \
            not s.text.startswith(prompt + c.text) or listed is None or len(listed) != n_prompt or \
            listed[0] is not None:
        fail(f"scored prompt {scored}")
    # The answer's tokens, scored as a prompt, are those it generated (their values up to rounding).
    k = len(c.logprobs.tokens)
    if s.logprobs.tokens[n_prompt - k:n_prompt] != c.logprobs.tokens:
        fail(f"scored tokens {s.logprobs.tokens} do not end with {c.logprobs.tokens}")
    # n choices, each at its index.
    many = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=1.0, n=3, seed=3)
    if sorted(ch.index for ch in many.choices) != [0, 1, 2] or any(not ch.text for ch in many.choices):
        fail(f"n=3 {many}")
    try:
        client.completions.create(model=model, prompt=prompt, suffix="!")
        fail("a suffix was accepted")
    except openai.BadRequestError as e:
        if "suffix" not in str(e):
            fail(f"error does not name the field: {e}")

    # Sessions are opened explicitly (the openai client has no call for it: plain HTTP).
    req = urllib.request.Request(f"{base}/sessions", data=json.dumps({"id": "client-check"}).encode(),
                                 headers={"Authorization": f"Bearer {a.api_key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        opened = json.load(r)
    if opened.get("id") != "client-check":
        fail(f"session {opened}")
    try:
        client.chat.completions.create(model=model, messages=question, max_tokens=4,
                                       extra_headers={"X-Session-ID": "never-opened"})
        fail("a session that was never opened answered")
    except openai.NotFoundError as e:
        if e.code != "session_not_found":
            fail(f"unknown session error: {e} (code {e.code!r})")
    headers = {"X-Session-ID": "client-check"}
    t1 = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "My name is Ada."}],
                                        max_tokens=8, temperature=0, extra_headers=headers)
    t2 = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is my name?"}],
                                        max_tokens=8, temperature=0, extra_headers=headers)
    cached = t2.usage.prompt_tokens_details.cached_tokens if t2.usage.prompt_tokens_details else 0
    if t2.usage.prompt_tokens <= t1.usage.total_tokens or cached < t1.usage.total_tokens - 1:
        fail(f"turn 2 usage {t2.usage} after turn 1 {t1.usage}")

    try:
        client.chat.completions.create(model=model, messages=question, temperature=7)
        fail("temperature 7 was accepted")
    except openai.BadRequestError as e:
        if "temperature" not in str(e):
            fail(f"error does not name the field: {e}")

    print(json.dumps({"model": model, "answer": text, "chunks": len(pieces),
                      "turn2_prompt_tokens": t2.usage.prompt_tokens, "turn2_cached": cached}))


if __name__ == "__main__":
    main()
