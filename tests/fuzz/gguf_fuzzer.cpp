// The GGUF loader: any file loads as a model that works or is refused with an error, never
// read past, never trusted for a size it does not hold.
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
    const std::string path = fuzz::write_scratch_file("model.gguf", std::span(data, size));
    model::LoadOptions lo;
    lo.show_progress = false;
    auto m = model::load_gguf_model(path, lo);
    fuzz::note_refusal(m.status());
    if (m.ok()) fuzz::exercise_model(**m);
    return 0;
}
