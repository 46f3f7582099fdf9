// The Hugging Face tokenizer loader (tokenizer.json, and tokenizer_config.json beside it):
// any files load as a tokenizer that encodes and decodes, or are refused with an error.
// Input: u32 length + tokenizer.json, u32 length + tokenizer_config.json (none when empty),
// then a text to encode.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "deltaserve/model/tokenizer.h"
#include "fuzz_support.h"

using namespace deltaserve;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fuzz::quiet_logs();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto [tokenizer, rest] = fuzz::split_prefixed(std::span(data, size));
    const auto [config, text_bytes] = fuzz::split_prefixed(rest);
    const std::string path = fuzz::write_scratch_file("tokenizer.json", tokenizer);
    const std::string config_path = fuzz::scratch_dir() + "/tokenizer_config.json";
    if (config.empty()) {
        unlink(config_path.c_str());
    } else {
        fuzz::write_scratch_file("tokenizer_config.json", config);
    }
    auto tok = model::load_hf_tokenizer(path);
    fuzz::note_refusal(tok.status());
    if (!tok.ok()) return 0;
    const std::string_view text(reinterpret_cast<const char*>(text_bytes.data()),
                                text_bytes.size());
    for (const bool special : {false, true}) {
        auto ids = (*tok)->encode(text, true, special);
        if (!ids.ok()) {
            // Only text that is not UTF-8 is refused.
            if (model::find_invalid_utf8(text) < 0) std::abort();
            continue;
        }
        for (const int32_t id : *ids) {
            if (id < 0 || id >= (*tok)->vocab_size()) std::abort();
        }
        (void)(*tok)->decode(*ids, special);
    }
    return 0;
}
