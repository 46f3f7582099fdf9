// The llama2.c loaders: a checkpoint and its tokenizer.bin (or any tokenizer file
// --tokenizer takes) load as a model that works or are refused with an error.
// Input: u32 checkpoint length, the checkpoint, then the tokenizer (none when empty).
#include <cstdint>
#include <span>

#include "deltaserve/model/model.h"
#include "fuzz_support.h"

using namespace deltaserve;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fuzz::quiet_logs();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto [checkpoint, tokenizer] = fuzz::split_prefixed(std::span(data, size));
    model::LoadOptions lo;
    lo.show_progress = false;
    if (!tokenizer.empty())
        lo.tokenizer_path = fuzz::write_scratch_file("tokenizer.bin", tokenizer);
    auto m = model::load_llama2c_model(fuzz::write_scratch_file("model.bin", checkpoint), lo);
    fuzz::note_refusal(m.status());
    if (m.ok()) fuzz::exercise_model(**m);
    return 0;
}
