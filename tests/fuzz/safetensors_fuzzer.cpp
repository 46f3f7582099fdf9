// The Hugging Face model loader: config.json and model.safetensors (with a fixed small
// tokenizer.json beside them) load as a model that works or are refused with an error,
// never read past. Input: u32 length + config.json, then model.safetensors.
#include <cstdint>
#include <span>

#include "deltaserve/model/model.h"
#include "fuzz_support.h"
#include "safetensors.h"

using namespace deltaserve;

namespace {

// 16 tokens: the 8 letters a-h and 8 pairs of them, byte-level BPE.
constexpr std::string_view kTokenizerJson = R"({
  "model": {"type": "BPE",
            "vocab": {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, "f": 5, "g": 6, "h": 7,
                      "ab": 8, "cd": 9, "ef": 10, "gh": 11, "abcd": 12, "efgh": 13,
                      "<|endoftext|>": 14, "<|im_start|>": 15},
            "merges": ["a b", "c d", "e f", "g h", "ab cd", "ef gh"]},
  "added_tokens": [{"id": 14, "content": "<|endoftext|>", "special": true},
                   {"id": 15, "content": "<|im_start|>", "special": true}],
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
})";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fuzz::quiet_logs();
    fuzz::write_scratch_file("tokenizer.json", kTokenizerJson);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto [config, weights] = fuzz::split_prefixed(std::span(data, size));
    fuzz::write_scratch_file("config.json", config);
    const std::string st = fuzz::write_scratch_file("model.safetensors", weights);
    // The reader on its own: every tensor it accepts lies inside the file.
    if (auto f = model::SafetensorsFile::open(st); f.ok()) {
        uint8_t sum = 0;
        for (const auto& [name, t] : f->tensors()) {
            if (t.n_bytes > 0) sum = sum + t.data[0] + t.data[t.n_bytes - 1];
            (void)t.compute_type(name);
        }
        volatile uint8_t sink = sum;
        (void)sink;
    }
    model::LoadOptions lo;
    lo.show_progress = false;
    auto m = model::load_hf_model(fuzz::scratch_dir(), lo);
    fuzz::note_refusal(m.status());
    if (m.ok()) fuzz::exercise_model(**m);
    return 0;
}
