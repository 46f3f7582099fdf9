// Flags shared by the commands that run a model (generate, chat).
#pragma once

#include <memory>
#include <string>

#include "deltaserve/common/args.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kvstore/device_tier.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/sampler.h"

namespace deltaserve::cli {

struct RunOptions {
    std::string model_path;
    std::string tokenizer_path;
    std::string chat_template_path;  // --chat-template: a Jinja file overriding the model's
    std::string tool_call_parser;    // --tool-call-parser: "" = the one the template teaches
    int32_t threads = 0;
    int32_t ctx_size = 0;
    int32_t batch_size = 512;
    std::string kv_type = "f16";
    std::string attention = "native";
    std::string device;  // "" = cuda when present, else cpu
    std::string kv_policy = "full";
    float kv_keep = 1.0f;
    std::string kv_profile;
    bool kv_calibrate = false;  // a missing deltakv profile is made at start (kv_profile.h)
    float kv_select = 0.1f;
    int kv_score_every = 0;
    float kv_score_dims = 0.25f;
    float kv_pin = 0.1f;
    int32_t kv_follow = 16;
    float kv_exact = 0.0f;
    float temperature = 0.8f;
    int32_t top_k = 40;
    float top_p = 0.95f;
    float min_p = 0.05f;
    float repeat_penalty = 1.0f;
    int32_t repeat_last_n = 64;
    uint64_t seed = 0;
    std::string log_level = "warn";
    // Not a flag: a pool the contexts share (score runs two contexts one after the other);
    // none: each context makes its own of `threads`.
    std::shared_ptr<ThreadPool> pool;

    void register_flags(ArgParser& p);
    // Seed: the given one, or a random one when --seed was not given.
    model::SamplingParams sampling(const ArgParser& p) const;
    model::ContextOptions context() const;
    // The --device flag's choice (--attention ggml alone takes the CPU).
    Result<kernels::Backend*> backend() const;
    // A device tier of `bytes` on backend()'s GPU (--kv-device-memory, a cluster's
    // kv_device_memory); kInvalidArgument on the CPU, backend()'s errors.
    Result<std::shared_ptr<kvstore::DeviceTier>> device_tier(uint64_t bytes) const;
};

struct LoadedModel {
    std::unique_ptr<model::Model> model;
    std::unique_ptr<model::InferenceContext> ctx;
};

// Validates the options and loads the model. Errors are one line.
Result<std::unique_ptr<model::Model>> load_model_for_run(const RunOptions& o);
// ... and creates the context.
Result<LoadedModel> load_for_run(const RunOptions& o);

// Prints "deltaserve: error: <message>" to stderr.
void print_error(const Status& s);

}  // namespace deltaserve::cli
