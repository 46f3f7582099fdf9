#!/usr/bin/env python3
"""The chat template oracle: Python's jinja2 set up as transformers' apply_chat_template sets
it up (transformers/utils/chat_template_utils.py: ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, tojson as
json.dumps(ensure_ascii=False), raise_exception, strftime_now; the generation block
rendered as its body).

Reads a job as JSON on stdin:
    {"now": <seconds since the epoch, UTC>,
     "templates": {name: {"source": text, "bos": text, "eos": text}},
     "cases": [{"name": ..., "messages": [...], "tools": [...]?, "kwargs": {...}?}]}
and writes on stdout, for every template, case and add_generation_prompt (true, false):
    {"renders": [{"template", "case", "add_generation_prompt", "output" | "error"}]}
("case" is null and "error" set when the template does not compile).
tests/model/chat_template_parity_test.cpp runs it beside deltaserve's engine
(.venv-tools has jinja2: deploy/setup.sh).
"""
import datetime
import json
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """transformers' AssistantTracker without the tracking: the body as it stands."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def environment(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    job = json.load(sys.stdin)
    env = environment(datetime.datetime.fromtimestamp(job["now"], datetime.timezone.utc))
    renders = []
    for name, t in sorted(job["templates"].items()):
        try:
            template = env.from_string(t["source"])
        except Exception as e:  # the template does not compile
            renders.append({"template": name, "case": None, "error": f"{type(e).__name__}: {e}"})
            continue
        for case in job["cases"]:
            for agp in (True, False):
                context = dict(case.get("kwargs", {}))
                context.update(messages=case["messages"], add_generation_prompt=agp,
                               bos_token=t["bos"], eos_token=t["eos"])
                if "tools" in case:
                    context["tools"] = case["tools"]
                entry = {"template": name, "case": case["name"], "add_generation_prompt": agp}
                try:
                    entry["output"] = template.render(**context)
                except Exception as e:  # what the template raises, or jinja2 on its behalf
                    entry["error"] = f"{type(e).__name__}: {e}"
                renders.append(entry)
    json.dump({"jinja2": jinja2.__version__, "renders": renders}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
