#!/usr/bin/env python3
"""Structured output through the official `openai` client against a running `deltaserve
serve`, with the `jsonschema` package as the oracle.

    openai_response_format_check.py --port N [--seeds 3]

For each schema of a small corpus (objects with required and optional properties, enums,
nullable types, arrays with bounds, nested $defs, a map, recursion), asks for answers with
response_format json_schema at a temperature above 0 and several seeds, streamed and not.
Checks (exit 1 with the reason on failure):
- every answer that ends with finish_reason "stop" parses and validates against its schema;
  one cut by max_tokens ("length") is counted, not judged;
- json_object answers parse as JSON objects;
- the SDK's own parse() with a pydantic model (the strict schema it writes, $defs included)
  returns the parsed object;
- a schema with a keyword the engine cannot enforce is a BadRequestError naming it.
Prints one JSON line with the counts.
"""
import argparse
import json
import sys
from typing import List, Literal, Optional

import jsonschema
import openai
import pydantic

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "city": {"type": ["string", "null"]},
        },
        "required": ["name", "age", "city"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "sky": {"enum": ["sunny", "cloudy", "rain", "snow"]},
            "temperature": {"type": "number"},
            "windy": {"type": "boolean"},
            "note": {"type": "string"},
        },
        "required": ["sky", "temperature"],
    },
    "shopping": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {"$ref": "#/$defs/item"},
            }
        },
        "required": ["items"],
        "additionalProperties": False,
        "$defs": {
            "item": {
                "type": "object",
                "properties": {"what": {"type": "string"}, "count": {"type": "integer"}},
                "required": ["what", "count"],
                "additionalProperties": False,
            }
        },
    },
    "scores": {"type": "object", "additionalProperties": {"type": "integer"}},
    "tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "children": {"type": "array", "maxItems": 2,
                                 "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["label", "children"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "answer": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
}

PROMPTS = {
    "person": "Describe a famous scientist.",
    "weather": "What is the weather like in Paris today?",
    "shopping": "Write a short shopping list for a picnic.",
    "scores": "Give the scores of three players.",
    "tree": "Draw a tiny family tree.",
    "answer": "How many legs does a spider have?",
}


class Step(pydantic.BaseModel):
    explanation: str
    output: str


class Solution(pydantic.BaseModel):
    steps: List[Step]
    final_answer: str
    confidence: Optional[Literal["low", "high"]]


MODEL = ""  # the one the server has


def fail(why):
    print(json.dumps({"error": why}))
    sys.exit(1)


def ask(client, name, schema, seed, stream):
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "system", "content": "You answer in JSON."},
                  {"role": "user", "content": PROMPTS[name]}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": name, "schema": schema, "strict": True}},
        max_tokens=160, temperature=0.8, seed=seed)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none",
                           timeout=300, max_retries=0)
    global MODEL
    MODEL = client.models.list().data[0].id
    seen = {"valid": 0, "cut": 0, "json_object": 0, "parsed": 0}
    for name, schema in SCHEMAS.items():
        for seed in range(args.seeds):
            text, finish = ask(client, name, schema, seed, stream=seed % 2 == 1)
            if finish == "length":
                seen["cut"] += 1
                continue
            if finish != "stop":
                fail(f"{name} seed {seed}: finish_reason {finish}")
            try:
                value = json.loads(text)
                jsonschema.validate(value, schema)
            except (ValueError, jsonschema.ValidationError) as e:
                fail(f"{name} seed {seed}: {text!r} does not validate: {e}")
            seen["valid"] += 1
    if seen["valid"] < seen["cut"]:
        fail(f"most answers were cut by max_tokens: {seen}")
    for seed in range(args.seeds):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "List two colours as JSON."}],
            response_format={"type": "json_object"}, max_tokens=120, temperature=0.8, seed=seed)
        if r.choices[0].finish_reason != "stop":
            continue
        value = json.loads(r.choices[0].message.content)
        if not isinstance(value, dict):
            fail(f"json_object answered {value!r}")
        seen["json_object"] += 1
    for seed in range(args.seeds):
        try:
            r = client.chat.completions.parse(
                model=MODEL,
                messages=[{"role": "user", "content": "Solve 8x + 7 = -23 step by step."}],
                response_format=Solution, max_tokens=300, temperature=0.8, seed=seed)
        except openai.LengthFinishReasonError:
            continue
        if not isinstance(r.choices[0].message.parsed, Solution):
            fail(f"parse() returned {r.choices[0].message!r}")
        seen["parsed"] += 1
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "p", "schema": {"type": "string", "pattern": "^a+$"}}})
        fail("a schema with 'pattern' was served")
    except openai.BadRequestError as e:
        if "pattern" not in str(e):
            fail(f"the refusal does not name 'pattern': {e}")
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
