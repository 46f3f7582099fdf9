#include "run_options.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "deltaserve/common/logging.h"
#include "deltaserve/kernels/matmul.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "kv_profile.h"

namespace deltaserve::cli {

void RunOptions::register_flags(ArgParser& p) {
    p.add("model", &model_path, "GGUF file, Hugging Face directory or llama2.c checkpoint");
    p.add("tokenizer", &tokenizer_path,
          "tokenizer file overriding the model's (tokenizer.bin, tokenizer.json, GGUF)");
    p.add("chat-template", &chat_template_path,
          "a Jinja chat template file overriding the model's own (tokenizer.chat_template), "
          "for a model that carries none or a wrong one");
    p.add("tool-call-parser", &tool_call_parser,
          "how the model writes tool calls: hermes, llama3_json, mistral or none (default: the "
          "format its chat template teaches, when it is one of these)");
    p.add("threads", &threads, "threads; 0 = one per core");
    p.add("ctx-size", &ctx_size, "context size in tokens; 0 = the model's, at most 8192");
    p.add("batch-size", &batch_size, "prompt tokens per forward pass");
    p.add("kv-type", &kv_type, "KV cache type: f16 or f32");
    p.add("attention", &attention,
          "attention arithmetic: native, or ggml to round as llama.cpp's CPU flash attention "
          "does (same output token for token with the same --threads; slower)");
    p.add("device", &device,
          "where the forward pass runs: cpu or cuda (default: cuda when a CUDA device is present, "
          "else cpu); the KV caches are host memory either way");
    p.add("kv-policy", &kv_policy,
          "KV cache policy: " + kvstore::kv_policy_names() + " (full keeps every token)");
    p.add("kv-keep", &kv_keep,
          "target keep ratio of the KV cache in (0, 1]: bytes held / fp16 full-cache bytes");
    p.add("kv-profile", &kv_profile,
          "deltakv.json or trimkv.json from deltactl calibrate (default: "
          "profiles/<model file name>/<policy>.json when present)");
    p.add_switch("kv-calibrate", &kv_calibrate,
                 "deltakv without a profile: calibrate one now into profiles/<model file name>/ "
                 "(deltactl calibrate, with its progress) instead of refusing to start");
    p.add(
        "kv-select", &kv_select,
        "deltakv: share of the compressed tokens each generated token attends to (reconstructed on "
        "the fly), in (0, 1]; more is closer to full KV and slower, memory is the same");
    p.add(
        "kv-score-every", &kv_score_every,
        "deltakv: every this many compressed layers, one scores all compressed tokens with its own "
        "keys and picks the --kv-select share for the layers up to the next; 0 = the paper's pick "
        "by the full layer before them (cheaper, further from full KV)");
    p.add("kv-score-dims", &kv_score_dims,
          "deltakv, with --kv-score-every: the share of key dimensions a scorer first scores every "
          "compressed token with (those where the query is largest), in (0, 1]; 1 = whole keys");
    p.add("kv-pin", &kv_pin,
          "deltakv: share of the compressed tokens the prompt's last tokens attended most, which "
          "every "
          "generated token attends besides its --kv-select share, in [0, 1); 0 = off");
    p.add("kv-follow", &kv_follow,
          "deltakv: the compressed tokens a generated token attended most, which the next attends "
          "again with the 3 after each (reading on), besides its --kv-select share; 0 = off");
    p.add("kv-exact", &kv_exact,
          "deltakv: share of the tokens compression takes that stay exact instead, those their "
          "latents reconstruct worst, in [0, 1); 0 = off");
    p.add("temperature", &temperature, "sampling temperature; 0 = greedy");
    p.add("top-k", &top_k, "top-k sampling; 0 = off");
    p.add("top-p", &top_p, "top-p (nucleus) sampling; 1 = off");
    p.add("min-p", &min_p, "min-p sampling; 0 = off");
    p.add("repeat-penalty", &repeat_penalty, "repetition penalty; 1 = off");
    p.add("repeat-last-n", &repeat_last_n, "tokens the repetition penalty looks back on");
    p.add("seed", &seed, "random seed (default: random)");
    p.add("log-level", &log_level, "trace, debug, info, warn, error or off");
}

model::SamplingParams RunOptions::sampling(const ArgParser& p) const {
    model::SamplingParams s;
    s.temperature = temperature;
    s.top_k = top_k;
    s.top_p = top_p;
    s.min_p = min_p;
    s.repeat_penalty = repeat_penalty;
    s.repeat_last_n = repeat_last_n;
    s.seed = p.given("seed") ? seed : std::random_device{}();
    return s;
}

model::ContextOptions RunOptions::context() const {
    model::ContextOptions c;
    c.n_ctx = ctx_size;
    c.n_threads = threads;
    c.threads = pool;
    c.n_batch = batch_size;
    c.kv_type = kv_type == "f32" ? model::KvType::kF32 : model::KvType::kF16;
    c.kv.policy = kv_policy;
    c.kv.keep = kv_keep;
    c.kv_profile = kv_profile;
    c.deltakv_select = kv_select;
    c.deltakv_score_every = kv_score_every;
    c.deltakv_score_dims = kv_score_dims;
    c.deltakv_pin = kv_pin;
    c.deltakv_follow = kv_follow;
    c.deltakv_exact = kv_exact;
    // deltakv / trimkv without --kv-profile: profiles/<model file>/ (deploy/profile.sh,
    // deltactl calibrate, --kv-calibrate make it there).
    if (kv_profile.empty()) {
        const std::string guess = default_kv_profile(model_path, kv_policy);
        if (!guess.empty() && std::filesystem::exists(guess)) c.kv_profile = guess;
    }
    c.attention =
        attention == "ggml" ? model::AttentionNumerics::kGgml : model::AttentionNumerics::kNative;
    Result<kernels::Backend*> b = backend();  // checked by load_model_for_run
    c.backend = b.ok() ? *b : nullptr;
    return c;
}

Result<kernels::Backend*> RunOptions::backend() const {
    if (attention == "ggml" && device.empty()) return kernels::choose_backend("cpu");
    return kernels::choose_backend(device);
}

Result<std::shared_ptr<kvstore::DeviceTier>> RunOptions::device_tier(uint64_t bytes) const {
    DS_ASSIGN_OR_RETURN(kernels::Backend * b, backend());
    if (b->host_memory()) {
        return invalid_argument("the device tier needs a GPU (--device cuda), not the " +
                                std::string(b->name()));
    }
    DS_ASSIGN_OR_RETURN(auto tier, kvstore::make_device_tier(*b, bytes));
    return std::shared_ptr<kvstore::DeviceTier>(std::move(tier));
}

Result<std::unique_ptr<model::Model>> load_model_for_run(const RunOptions& o) {
    init_logging(o.log_level);
    if (o.model_path.empty()) return invalid_argument("--model is required");
    if (o.kv_type != "f16" && o.kv_type != "f32") {
        return invalid_argument("--kv-type must be f16 or f32, not '" + o.kv_type + "'");
    }
    if (o.attention != "native" && o.attention != "ggml") {
        return invalid_argument("--attention must be native or ggml, not '" + o.attention + "'");
    }
    if (o.attention == "ggml" && o.device == "cuda") {
        return invalid_argument("--attention ggml (llama.cpp's rounding) runs on the CPU only");
    }
    DS_RETURN_IF_ERROR(o.backend().status());
    if (!(o.kv_select > 0.0f && o.kv_select <= 1.0f))
        return invalid_argument("--kv-select must be in (0, 1]");
    if (o.kv_score_every < 0) return invalid_argument("--kv-score-every must be >= 0");
    if (!(o.kv_pin >= 0.0f && o.kv_pin < 1.0f))
        return invalid_argument("--kv-pin must be in [0, 1)");
    if (o.kv_follow < 0) return invalid_argument("--kv-follow must be >= 0");
    if (!(o.kv_exact >= 0.0f && o.kv_exact < 1.0f))
        return invalid_argument("--kv-exact must be in [0, 1)");
    if (!(o.kv_score_dims > 0.0f && o.kv_score_dims <= 1.0f)) {
        return invalid_argument("--kv-score-dims must be in (0, 1]");
    }
    {
        kvstore::EvictionConfig kv;
        kv.policy = o.kv_policy;
        kv.keep = o.kv_keep;
        DS_RETURN_IF_ERROR(kv.validate().with_context("--kv-policy / --kv-keep"));
    }
    {  // The same check as a request's sampling fields get; the message names the field.
        model::SamplingParams s;
        s.temperature = o.temperature;
        s.top_k = o.top_k;
        s.top_p = o.top_p;
        s.min_p = o.min_p;
        s.repeat_penalty = o.repeat_penalty;
        s.repeat_last_n = o.repeat_last_n;
        DS_RETURN_IF_ERROR(model::validate_sampling(s).with_context("sampling flags"));
    }
    if (o.threads < 0 || o.ctx_size < 0 || o.batch_size <= 0) {
        return invalid_argument("--threads and --ctx-size must be >= 0, --batch-size > 0");
    }
    DS_RETURN_IF_ERROR(ensure_kv_profile(o));
    model::LoadOptions lo;
    lo.tokenizer_path = o.tokenizer_path;
    DS_ASSIGN_OR_RETURN(auto model, model::load_model(o.model_path, lo));
    if (!model->tokenizer) {
        return failed_precondition(o.model_path + " has no tokenizer; pass --tokenizer");
    }
    if (!o.chat_template_path.empty()) {
        std::ifstream f(o.chat_template_path, std::ios::binary);
        if (!f) return not_found("--chat-template " + o.chat_template_path + ": cannot be read");
        std::stringstream text;
        text << f.rdbuf();
        const model::Tokenizer& tok = *model->tokenizer;
        model->chat_template = model::ChatTemplate::from_jinja(
            text.str(), model::special_token_text(tok, tok.bos_id()),
            model::special_token_text(tok, tok.eos_id()));
        DS_RETURN_IF_ERROR(
            model->chat_template.status().with_context("--chat-template " + o.chat_template_path));
    }
    if (!o.tool_call_parser.empty()) {
        auto format = model::tool_call_format_named(o.tool_call_parser);
        if (!format) {
            return invalid_argument("--tool-call-parser " + o.tool_call_parser +
                                    ": not one of hermes, llama3_json, mistral, none");
        }
        model->chat_template.set_tool_call_format(*format);
    }
    return model;
}

Result<LoadedModel> load_for_run(const RunOptions& o) {
    LoadedModel m;
    DS_ASSIGN_OR_RETURN(m.model, load_model_for_run(o));
    DS_ASSIGN_OR_RETURN(m.ctx, model::InferenceContext::create(*m.model, o.context()));
    spdlog::info("model {}: {} layers, d_model {}, context {}, kernels {}", m.model->config.name,
                 m.model->config.n_layers, m.model->config.d_model, m.ctx->n_ctx(),
                 kernels::cpu_kernel_isa());
    return m;
}

void print_error(const Status& s) {
    std::fprintf(stderr, "deltaserve: error: %s\n", s.message().c_str());
}

}  // namespace deltaserve::cli
