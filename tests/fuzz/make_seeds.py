#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses whose inputs are third-party formats
(tests/fuzz/corpus/<harness>/): tiny valid GGUF, safetensors + config.json and llama2.c
models, tokenizer.json files, chat templates and chat request bodies. Deterministic; the
whole corpus stays in the tens of KB. The KV stream and wire-format seeds are the project's
own formats: the harnesses write those (DELTASERVE_FUZZ_WRITE_SEEDS, see run.sh --seeds).

    python3 tests/fuzz/make_seeds.py [OUT_DIR]   # default: tests/fuzz/corpus
"""
import json
import os
import random
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
rng = random.Random(1234)


def write(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def prefixed(first, rest=b""):
    if isinstance(first, str):
        first = first.encode()
    if isinstance(rest, str):
        rest = rest.encode()
    return struct.pack("<I", len(first)) + first + rest


def floats(n, scale=0.2):
    return struct.pack("<%df" % n, *[rng.gauss(0.0, scale) for _ in range(n)])


def halves(n):
    return struct.pack("<%de" % n, *[rng.gauss(0.0, 0.2) for _ in range(n)])


# --- a tiny llama: d 16, 1 layer, 2 heads of 8 (the kernels take multiples of 8), 1 KV head,
# d_ff 32, 16 tokens
D, L, H, KVH, F, V = 16, 1, 2, 1, 32, 16
HEAD = D // H
KV = HEAD * KVH
LETTERS = "abcdefgh"
BPE_TOKENS = list(LETTERS) + ["ab", "cd", "ef", "gh", "abcd", "efgh", "<|endoftext|>", "<|im_start|>"]
BPE_MERGES = ["a b", "c d", "e f", "g h", "ab cd", "ef gh"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SMOL_CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n' }}"
               "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
               "'<|im_end|>' + '\n'}}{% endfor %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          "+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}")

# --- GGUF --------------------------------------------------------------------------------
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, typ, value):
    out = gguf_str(key) + struct.pack("<I", typ)
    if typ == GGUF_U32:
        out += struct.pack("<I", value)
    elif typ == GGUF_I32:
        out += struct.pack("<i", value)
    elif typ == GGUF_F32:
        out += struct.pack("<f", value)
    elif typ == GGUF_BOOL:
        out += struct.pack("<B", value)
    elif typ == GGUF_STRING:
        out += gguf_str(value)
    else:
        elem, items = value
        out += struct.pack("<IQ", elem, len(items))
        for it in items:
            if elem == GGUF_STRING:
                out += gguf_str(it)
            elif elem == GGUF_I32:
                out += struct.pack("<i", it)
            else:
                out += struct.pack("<f", it)
    return out


def q8_0(n):
    out = b""
    for _ in range(n // 32):
        out += struct.pack("<e", 0.01) + bytes(rng.randrange(256) for _ in range(32))
    return out


def gguf_model(d, heads, kv_heads, ff, tokenizer, tensor_type, template):
    head = d // heads
    kv = head * kv_heads
    kvs = [
        gguf_kv("general.architecture", GGUF_STRING, "llama"),
        gguf_kv("general.name", GGUF_STRING, "tiny"),
        gguf_kv("llama.embedding_length", GGUF_U32, d),
        gguf_kv("llama.block_count", GGUF_U32, 1),
        gguf_kv("llama.attention.head_count", GGUF_U32, heads),
        gguf_kv("llama.attention.head_count_kv", GGUF_U32, kv_heads),
        gguf_kv("llama.feed_forward_length", GGUF_U32, ff),
        gguf_kv("llama.context_length", GGUF_U32, 64),
        gguf_kv("llama.rope.dimension_count", GGUF_U32, head),
        gguf_kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, 1e-5),
    ]
    if tokenizer == "gpt2":
        tokens = BPE_TOKENS
        kvs += [
            gguf_kv("tokenizer.ggml.model", GGUF_STRING, "gpt2"),
            gguf_kv("tokenizer.ggml.pre", GGUF_STRING, "smollm"),
            gguf_kv("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
            gguf_kv("tokenizer.ggml.token_type", GGUF_ARRAY,
                    (GGUF_I32, [1] * 14 + [3, 3])),
            gguf_kv("tokenizer.ggml.merges", GGUF_ARRAY, (GGUF_STRING, BPE_MERGES)),
            gguf_kv("tokenizer.ggml.eos_token_id", GGUF_U32, 14),
        ]
    else:
        tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581", "\u2581a", "a", "b", "c", "d",
                  "ab", "cd", "abcd", "\u2581ab", "<|im_start|>", "<|im_end|>"]
        kvs += [
            gguf_kv("tokenizer.ggml.model", GGUF_STRING, "llama"),
            gguf_kv("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
            gguf_kv("tokenizer.ggml.scores", GGUF_ARRAY,
                    (GGUF_F32, [0.0] * 3 + [-float(i) for i in range(13)])),
            gguf_kv("tokenizer.ggml.token_type", GGUF_ARRAY,
                    (GGUF_I32, [2, 3, 3, 6] + [1] * 10 + [3, 3])),
            gguf_kv("tokenizer.ggml.bos_token_id", GGUF_U32, 1),
            gguf_kv("tokenizer.ggml.eos_token_id", GGUF_U32, 2),
        ]
    if template:
        kvs.append(gguf_kv("tokenizer.chat_template", GGUF_STRING, template))
    n_vocab = len(tokens)
    # (name, ne (contiguous first)); norms stay F32 as llama.cpp writes them.
    shapes = [("token_embd.weight", [d, n_vocab]), ("output_norm.weight", [d]),
              ("blk.0.attn_norm.weight", [d]), ("blk.0.attn_q.weight", [d, d]),
              ("blk.0.attn_k.weight", [d, kv]), ("blk.0.attn_v.weight", [d, kv]),
              ("blk.0.attn_output.weight", [d, d]), ("blk.0.ffn_norm.weight", [d]),
              ("blk.0.ffn_gate.weight", [d, ff]), ("blk.0.ffn_up.weight", [d, ff]),
              ("blk.0.ffn_down.weight", [ff, d])]
    infos, blobs, offset = b"", [], 0
    for name, ne in shapes:
        n = 1
        for x in ne:
            n *= x
        typ = 0 if len(ne) == 1 else tensor_type
        blob = floats(n) if typ == 0 else halves(n) if typ == 1 else q8_0(n)
        infos += gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(
            struct.pack("<q", x) for x in ne) + struct.pack("<IQ", typ, offset)
        blob += b"\0" * (-len(blob) % 32)
        blobs.append(blob)
        offset += len(blob)
    head_bytes = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(kvs)) + b"".join(kvs) + infos
    head_bytes += b"\0" * (-len(head_bytes) % 32)
    return head_bytes + b"".join(blobs)


write("gguf", "llama-bpe-f32.gguf", gguf_model(16, 2, 1, 32, "gpt2", 0, SMOL_CHATML))
write("gguf", "llama-spm-f16.gguf", gguf_model(16, 2, 1, 32, "llama", 1, LLAMA3))
write("gguf", "llama-bpe-q8_0.gguf", gguf_model(32, 4, 2, 32, "gpt2", 8, CHATML))

# --- llama2.c: checkpoint + tokenizer.bin ------------------------------------------------


def llama2c_checkpoint(shared=True, seq=16):
    header = struct.pack("<7i", D, F, L, H, KVH, V if shared else -V, seq)
    n = (V * D + L * D + L * D * D + 2 * L * D * KV + L * D * D + L * D + 3 * L * F * D + D +
         seq * HEAD + (0 if shared else V * D))
    return header + floats(n)


def llama2c_tokenizer(n):
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(2)] + \
        [" a", " b", "a", "b", "c", "ab", "cd", " ab", "abcd", "d", "e"]
    pieces = pieces[:n]
    out = struct.pack("<I", max(len(p.encode()) for p in pieces))
    for i, p in enumerate(pieces):
        b = p.encode()
        out += struct.pack("<fi", -float(i), len(b)) + b
    return out


write("llama2c", "shared-classifier", prefixed(llama2c_checkpoint(True), llama2c_tokenizer(V)))
write("llama2c", "own-classifier", prefixed(llama2c_checkpoint(False), llama2c_tokenizer(V)))
write("llama2c", "no-tokenizer", prefixed(llama2c_checkpoint(True, 8)))

# --- Hugging Face: config.json + model.safetensors -----------------------------------------


def safetensors(tensors, dtype="F32"):
    header, data = {}, b""
    for name, shape in tensors:
        n = 1
        for x in shape:
            n *= x
        blob = floats(n) if dtype == "F32" else halves(n) if dtype == "F16" else \
            b"".join(struct.pack("<f", rng.gauss(0, 0.2))[2:] for _ in range(n))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def hf_tensors(tied):
    p = "model.layers.0."
    t = [("model.embed_tokens.weight", [V, D]), ("model.norm.weight", [D]),
         (p + "input_layernorm.weight", [D]), (p + "self_attn.q_proj.weight", [D, D]),
         (p + "self_attn.k_proj.weight", [KV, D]), (p + "self_attn.v_proj.weight", [KV, D]),
         (p + "self_attn.o_proj.weight", [D, D]), (p + "post_attention_layernorm.weight", [D]),
         (p + "mlp.gate_proj.weight", [F, D]), (p + "mlp.up_proj.weight", [F, D]),
         (p + "mlp.down_proj.weight", [D, F])]
    if not tied:
        t.append(("lm_head.weight", [V, D]))
    return t


def hf_config(tied, arch="LlamaForCausalLM"):
    return json.dumps({"architectures": [arch], "hidden_size": D, "num_hidden_layers": L,
                       "num_attention_heads": H, "num_key_value_heads": KVH,
                       "intermediate_size": F, "vocab_size": V, "max_position_embeddings": 64,
                       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
                       "tie_word_embeddings": tied})


write("safetensors", "tied-f32", prefixed(hf_config(True), safetensors(hf_tensors(True))))
write("safetensors", "lm-head-bf16", prefixed(hf_config(False), safetensors(hf_tensors(False), "BF16")))
write("safetensors", "mistral-f16", prefixed(hf_config(True, "MistralForCausalLM"),
                                             safetensors(hf_tensors(True), "F16")))

# --- tokenizer.json (+ tokenizer_config.json) + a text --------------------------------------


def tokenizer_json(pre):
    vocab = {t: i for i, t in enumerate(BPE_TOKENS)}
    return json.dumps({
        "model": {"type": "BPE", "vocab": vocab, "merges": BPE_MERGES},
        "added_tokens": [{"id": 14, "content": "<|endoftext|>", "special": True},
                         {"id": 15, "content": "<|im_start|>", "special": True}],
        "pre_tokenizer": pre})


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
SMOLLM_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]}
TOK_CONFIG = json.dumps({"bos_token": "<|im_start|>", "eos_token": {"content": "<|endoftext|>"},
                         "add_bos_token": True, "chat_template": CHATML})
write("tokenizer_json", "gpt2", prefixed(tokenizer_json(BYTE_LEVEL), prefixed("", "abcd efgh ab")))
write("tokenizer_json", "smollm-config",
      prefixed(tokenizer_json(SMOLLM_PRE), prefixed(TOK_CONFIG, "<|im_start|>abc 123 gh")))
write("tokenizer_json", "merges-as-pairs", prefixed(
    tokenizer_json(BYTE_LEVEL).replace('"a b"', '["a", "b"]'), prefixed("", "ab")))

# --- chat templates: the template, then messages (FuzzedDataProvider reads them) ----------
for name, tmpl in [("chatml", CHATML), ("smollm2", SMOL_CHATML), ("llama3", LLAMA3), ("empty", "")]:
    write("chat_template", name, tmpl.replace("\\", "\\\\") + "\\\x01user\\\x00Hello there")

# --- chat request bodies -------------------------------------------------------------------
bodies = {
    "minimal": {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    "sampling": {"model": "smollm2", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Count to 3"}],
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "repetition_penalty": 1.1, "seed": 42, "max_tokens": 32, "stop": ["\n\n", "END"],
        "n": 1},
    "stream": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                        {"type": "text", "text": " there"}]}],
               "stream": True, "stream_options": {"include_usage": True},
               "max_completion_tokens": 8, "session_id": "chat-42"},
    "tools": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}],
        "tool_choice": "auto", "parallel_tool_calls": False},
}
for name, body in bodies.items():
    write("chat_request", name + ".json", json.dumps(body))

# --- tool calls in answers: a byte for the format (0 hermes, 1 llama3_json, 2 mistral; +4 not
# parallel), a byte for the split, the answer ------------------------------------------------
answers = {
    "hermes": b"\x00\x03Let me check.\n<tool_call>\n"
              b'{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3": b'\x01\x05<|python_tag|>{"name": "a", "parameters": {"n": 1}}; '
              b'{"name": "b", "parameters": {}}',
    "mistral": b'\x02\x07[TOOL_CALLS][{"name": "f", "arguments": {"x": [1, 2]}, '
               b'"id": "a1B2c3D4e"}]',
    "mistral-args": b'\x06\x02Ok.[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}'
                    b"[TOOL_CALLS]t[CALL_ID]x9[ARGS]{}",
}
for name, data in answers.items():
    write("tool_calls", name, data)

# --- response schemas: two bytes for the schema's length, the schema, a text to match ----------
schemas = {
    "person": (b'{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},'
               b'"required":["name","age"],"additionalProperties":false}',
               b'{"name": "Ada \\u00e9", "age": -3}'),
    "defs": (b'{"$defs":{"n":{"type":"object","properties":{"k":{"type":"array","items":'
             b'{"$ref":"#/$defs/n"},"maxItems":2}}}},"$ref":"#/$defs/n"}', b'{"k":[{"k":[]},{}]}'),
    "anyof": (b'{"anyOf":[{"enum":["a",1,null]},{"type":["number","boolean"]}]}', b"1.5e-3"),
    "map": (b'{"type":"object","additionalProperties":{"type":"array","minItems":1}}',
            b'{"x":[true,{"y":null}]}'),
}
for name, (schema, text) in schemas.items():
    write("json_schema", name, len(schema).to_bytes(2, "big") + schema + text)
