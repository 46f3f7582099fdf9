// What the harnesses share: a scratch folder for the loaders that take paths, a tiny
// deterministic model for the KV import harness, and a DeltaKV profile for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "deltaserve/kvstore/deltakv_cache.h"
#include "deltaserve/model/model.h"

namespace deltaserve::fuzz {

// A private folder for this process (under /dev/shm when it exists, else $TMPDIR), made on
// first use and removed at exit.
const std::string& scratch_dir();

// Writes data to scratch_dir()/name and returns the path.
std::string write_scratch_file(std::string_view name, std::span<const uint8_t> data);
std::string write_scratch_file(std::string_view name, std::string_view text);

// A llama2.c checkpoint with fixed pseudo-random weights: 3 layers, d_model 32, 4 heads of
// 8 (2 KV heads), d_ff 64, vocabulary 64, context 512. Loaded once per process.
const model::Model& tiny_model();

// A DeltaKV profile for tiny_model() (m = 8, stride 5, sinks 4, window 8), built in memory
// as the kvstore tests build theirs.
std::shared_ptr<const kvstore::DeltaKvProfile> tiny_deltakv_profile();

// What a service does with a model it loaded: encodes and decodes a text with its
// tokenizer (when it has one) and evaluates two tokens in a small context. Aborts when the
// model loaded but cannot do so (a loader that accepted what it should have refused).
void exercise_model(const model::Model& model);

// Splits data at a u32 little-endian length prefix: the first `length` bytes (capped at what
// there is) and the rest. The harnesses that take two files take them this way.
std::pair<std::span<const uint8_t>, std::span<const uint8_t>> split_prefixed(
    std::span<const uint8_t> data);

// With DELTASERVE_FUZZ_VERBOSE set, prints why an input was refused (checking seeds:
// build-asan/bin/fuzz_gguf -runs=0 tests/fuzz/corpus/gguf).
void note_refusal(const Status& status);

// Silences the library's logging (the loaders log what they refuse).
void quiet_logs();

}  // namespace deltaserve::fuzz
