#!/usr/bin/env python3
"""The official `openai` client's tool-calling loop against a running `deltaserve serve`
whose chat template renders tools in the Hermes format (Qwen2.5's template).

    openai_tools_check.py --port N

The model is shown a tool and earlier turns in which it called it; greedy, it calls it
again for the new question. Checks (exit 1 with the reason on failure):
- the answer is message.tool_calls with finish_reason "tool_calls": a function the request
  named, arguments a JSON object, an id the loop can answer;
- streamed, the delta.tool_calls chunks add up (as the SDK's own stream accumulator adds them)
  to the same call;
- the loop goes on unchanged: the SDK's own assistant message and a tool message with the
  result are sent back, and the model answers in text;
- tool_choice "required" and a named function answer a call (to the named one) even to a
  question the model would answer in text, its arguments valid for the function's parameters
  (jsonschema); a forced call whose parameters use a keyword the grammar cannot enforce is a
  BadRequestError naming it; a tool message without tool_call_id is one naming tool_call_id.
Prints one JSON line with what it saw.
"""
import argparse
import json
import sys

import jsonschema
import openai

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"]},
    },
}]

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a time zone",
        "parameters": {"type": "object",
                       "properties": {"zone": {"type": "string"}},
                       "required": ["zone"], "additionalProperties": False},
    },
}

# Earlier turns that called the tool, its results and the answers: the pattern to follow
# (a model of 135M parameters needs three to write the call rather than imitate the result).
def earlier_turn(city, n):
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{n}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
        {"role": "tool", "tool_call_id": f"call_{n}", "content": "{\"temperature\": 18}"},
        {"role": "assistant", "content": f"It is 18 degrees in {city}."},
    ]


HISTORY = earlier_turn("Paris", 0) + earlier_turn("London", 1) + earlier_turn("Rome", 2)


def fail(why):
    sys.exit(f"openai tools check failed: {why}")


def weather(city):
    return json.dumps({"temperature": 11, "sky": "cloudy", "city": city})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key="none",
                           max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    messages = HISTORY + [{"role": "user", "content": "What is the weather in Berlin?"}]

    first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           temperature=0, max_tokens=48)
    choice = first.choices[0]
    calls = choice.message.tool_calls or []
    if not calls:
        fail(f"no tool call; the model answered {choice.message.content!r}")
    if choice.finish_reason != "tool_calls":
        fail(f"finish_reason {choice.finish_reason!r} with tool calls")
    call = calls[0]
    if call.type != "function" or call.function.name != "get_weather" or not call.id:
        fail(f"the call is {call}")
    args = json.loads(call.function.arguments)
    if not isinstance(args, dict) or not isinstance(args.get("city"), str):
        fail(f"arguments {call.function.arguments!r}")

    # Streamed: the SDK's accumulator gives back the same call.
    with client.chat.completions.stream(model=model, messages=messages, tools=TOOLS,
                                             temperature=0, max_tokens=48) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion()
    s_calls = streamed.choices[0].message.tool_calls or []
    if len(s_calls) != len(calls) or s_calls[0].function.name != call.function.name or \
            json.loads(s_calls[0].function.arguments) != args:
        fail(f"streamed calls {s_calls} differ from {calls}")
    if streamed.choices[0].finish_reason != "tool_calls":
        fail(f"streamed finish_reason {streamed.choices[0].finish_reason!r}")

    # The loop as the SDK's documentation writes it.
    messages.append(choice.message)
    for c in calls:
        messages.append({"role": "tool", "tool_call_id": c.id,
                         "content": weather(json.loads(c.function.arguments)["city"])})
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           temperature=0, max_tokens=32)
    text = final.choices[0].message.content or ""
    if not text.strip() and not final.choices[0].message.tool_calls:
        fail("the turn after the tool result said nothing")

    # Forced: a call even where the model would rather talk, valid for its parameters.
    both = TOOLS + [TIME_TOOL]
    for choice, want in (("required", None),
                         ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me a joke."}], tools=both,
            tool_choice=choice, temperature=0, max_tokens=64)
        c = r.choices[0]
        if c.finish_reason != "tool_calls" or not c.message.tool_calls:
            fail(f"tool_choice {choice}: answered {c.message.content!r} ({c.finish_reason})")
        forced = c.message.tool_calls[0].function
        tool = next((t for t in both if t["function"]["name"] == forced.name), None)
        if tool is None or (want and forced.name != want):
            fail(f"tool_choice {choice}: called {forced.name}")
        jsonschema.validate(json.loads(forced.arguments), tool["function"]["parameters"])
    try:
        bad = [{"type": "function", "function": {"name": "mail", "parameters": {
            "type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}}]
        client.chat.completions.create(model=model, messages=messages, tools=bad,
                                       tool_choice="required", max_tokens=4)
        fail("a forced call with a 'format' keyword was accepted")
    except openai.BadRequestError as e:
        if "tool_choice" not in str(e) or "format" not in str(e):
            fail(f"tool_choice required with 'format': {e}")
    try:
        client.chat.completions.create(
            model=model, max_tokens=4,
            messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}])
        fail("a tool message without tool_call_id was accepted")
    except openai.BadRequestError as e:
        if "tool_call_id" not in str(e):
            fail(f"tool message: {e}")
    print(json.dumps({"call": {"name": call.function.name, "arguments": args, "id": call.id},
                      "after_result": text}))


if __name__ == "__main__":
    main()
