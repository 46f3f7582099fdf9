#include "deltaserve/model/inference_context.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "deltaserve/common/logging.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/attention_support.h"
#include "deltaserve/kvstore/deltakv_cache.h"
#include "deltaserve/kvstore/evicting_cache.h"
#include "deltaserve/kvstore/kv_cache.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/deltakv_profile.h"
#include "deltaserve/model/forward.h"
#include "deltaserve/model/kv_groups.h"
#include "deltaserve/model/trimkv_profile.h"

namespace deltaserve::model {

namespace {

constexpr int32_t kDefaultMaxContext = 8192;

// What a context's cache is made of: a block pool (full; the node's, or its own), a head pool
// and a policy (eviction), or a profile and its options (DeltaKV).
struct CacheParts {
    std::shared_ptr<kvstore::BlockPool> blocks;
    kvstore::KvLayerGroups groups;  // how the model's layers share the pool's blocks
    std::unique_ptr<kvstore::HeadSlotPool> head_slots;
    std::unique_ptr<kvstore::EvictionPolicy> policy;
    std::shared_ptr<const kvstore::DeltaKvProfile> profile;
    kvstore::DeltaKvOptions deltakv;
};

class InferenceContextImpl final : public InferenceContext {
  public:
    InferenceContextImpl(const Model& model, const ContextOptions& options, CacheParts parts)
        : model_(model),
          options_(options),
          threads_(options.threads ? options.threads
                                   : std::make_shared<ThreadPool>(options.n_threads)),
          parts_(std::move(parts)),
          forward_(model, *threads_, options.backend) {
        forward_.set_attention_numerics(options.attention);
    }

    // Builds the cache over the parts (it may need the thread pool).
    Status init() {
        if (parts_.profile) {
            // On a device backend the cache lives in its memory, as full KV's pool does.
            DS_ASSIGN_OR_RETURN(
                cache_, kvstore::DeltaKvSequenceCache::create(*parts_.profile, parts_.deltakv,
                                                              *threads_, options_.backend));
        } else if (parts_.policy) {
            // Its sliding-window layers keep their window, outside the policy's budget.
            const ModelConfig& c = model_.config;
            std::vector<bool> window_layer(static_cast<size_t>(c.n_layers));
            for (int32_t l = 0; l < c.n_layers; ++l) window_layer[l] = c.is_window_layer(l);
            cache_ = std::make_unique<kvstore::EvictingSequenceCache>(
                *parts_.head_slots, std::move(parts_.policy), options_.kv, std::move(window_layer),
                c.sliding_window);
        } else {
            cache_ = std::make_unique<kvstore::FullSequenceCache>(parts_.blocks, options_.n_ctx,
                                                                  parts_.groups, options_.n_batch);
        }
        return Status();
    }

    Result<std::span<const float>> eval(std::span<const int32_t> tokens) override {
        DS_RETURN_IF_ERROR(run(tokens, false));
        const size_t nv = static_cast<size_t>(model_.config.n_vocab);
        return std::span<const float>(logits_.data() + logits_.size() - nv, nv);
    }

    Result<std::vector<float>> eval_all(std::span<const int32_t> tokens) override {
        std::vector<float> all;
        all.reserve(tokens.size() * static_cast<size_t>(model_.config.n_vocab));
        DS_RETURN_IF_ERROR(run(tokens, true, &all));
        return all;
    }

    int32_t n_past() const override { return cache_->n_tokens(); }
    int32_t n_ctx() const override { return options_.n_ctx; }
    void expect_more(int32_t n_more) override {
        more_ = n_more;
        cache_->expect_more(n_more);
    }
    void reset() override { truncate(0); }
    void truncate(int32_t n_keep) override {
        more_ = 0;
        cache_->truncate(n_keep);
    }
    int32_t kept_by_truncate(int32_t n_keep) const override {
        return cache_->kept_by_truncate(n_keep);
    }
    const Model& model() const override { return model_; }
    size_t kv_bytes() const override { return cache_->bytes(); }
    size_t kv_held_bytes() const override { return cache_->held_bytes(); }
    size_t kv_prefill_bytes_bound(int32_t n_tokens, int32_t n_new) const override {
        const int32_t n = std::min(n_tokens, options_.n_ctx);
        return cache_->prefill_bytes_bound(n, std::min(n_new, n));
    }
    size_t kv_bytes_bound(int32_t n_tokens) const override {
        return cache_->bytes_bound(std::min(n_tokens, options_.n_ctx));
    }
    const kvstore::BlockPool* kv_block_pool() const override { return cache_->block_pool(); }
    std::vector<int32_t> kv_blocks(int32_t n_blocks) const override {
        return cache_->blocks(n_blocks);
    }
    Status adopt_kv_blocks(std::span<const int32_t> blocks) override {
        if (static_cast<int64_t>(blocks.size() / static_cast<size_t>(cache_->n_groups())) *
                kvstore::BlockPool::kBlockTokens >
            options_.n_ctx) {
            return out_of_range("more blocks than the context holds");
        }
        return cache_->adopt_blocks(blocks);
    }
    Result<std::vector<uint8_t>> export_kv_state() const override {
        DS_ASSIGN_OR_RETURN(const kvstore::SequenceCodec* c, codec());
        return c->export_state();
    }
    Result<std::vector<uint8_t>> export_kv_layer(int32_t layer) const override {
        DS_ASSIGN_OR_RETURN(const kvstore::SequenceCodec* c, codec());
        return c->export_layer(layer);
    }
    Status import_kv_state(std::span<const uint8_t> state) override {
        DS_ASSIGN_OR_RETURN(kvstore::SequenceCodec * c, codec());
        return c->import_state(state);
    }
    Status import_kv_layer(int32_t layer, std::span<const uint8_t> part) override {
        DS_ASSIGN_OR_RETURN(kvstore::SequenceCodec * c, codec());
        return c->import_layer(layer, part);
    }
    std::vector<uint8_t> export_kv_hints() const override {
        const kvstore::SequenceCodec* c = cache_->codec();
        return c != nullptr ? c->export_hints() : std::vector<uint8_t>();
    }
    Status import_kv_hints(std::span<const uint8_t> hints) override {
        DS_ASSIGN_OR_RETURN(kvstore::SequenceCodec * c, codec());
        return c->import_hints(hints);
    }
    bool kv_ships_rows() const override {
        const kvstore::SequenceCodec* c = cache_->codec();
        return c != nullptr && c->ships_rows();
    }
    int32_t kv_rows_final_end(int32_t layer, bool last) const override {
        const kvstore::SequenceCodec* c = cache_->codec();
        return c != nullptr ? c->rows_final_end(layer, last) : 0;
    }
    Result<std::vector<uint8_t>> export_kv_rows_state(int32_t n_tokens) const override {
        DS_ASSIGN_OR_RETURN(const kvstore::SequenceCodec* c, codec());
        return c->export_rows_state(n_tokens);
    }
    Result<std::vector<uint8_t>> export_kv_rows(int32_t layer, int32_t begin,
                                                int32_t end) const override {
        DS_ASSIGN_OR_RETURN(const kvstore::SequenceCodec* c, codec());
        return c->export_rows(layer, begin, end);
    }
    Status import_kv_rows(int32_t layer, int32_t begin, int32_t end,
                          std::span<const uint8_t> part) override {
        DS_ASSIGN_OR_RETURN(kvstore::SequenceCodec * c, codec());
        return c->import_rows(layer, begin, end, part);
    }
    std::vector<float> kv_rows_error(int32_t begin, int32_t end) const override {
        const kvstore::SequenceCodec* c = cache_->codec();
        return c != nullptr ? c->rows_error(begin, end) : std::vector<float>();
    }
    Status kv_attended_rows(int32_t layer, std::span<const int32_t> positions,
                            std::vector<float>* rows, std::vector<uint8_t>* latent) override {
        auto* dkv = dynamic_cast<kvstore::DeltaKvSequenceCache*>(cache_.get());
        if (dkv == nullptr)
            return failed_precondition("only a DeltaKV cache reconstructs its rows");
        if (layer < 0 || layer >= model_.config.n_layers)
            return out_of_range("no layer " + std::to_string(layer));
        for (int32_t p : positions) {
            if (p < 0 || p >= n_past()) return out_of_range("no position " + std::to_string(p));
        }
        rows->resize(positions.size() * static_cast<size_t>(2 * model_.config.kv_dim()));
        latent->resize(positions.size());
        return dkv->attended_rows(layer, positions, rows->data(), latent->data());
    }
    void set_layer_observer(LayerObserver observer) override {
        forward_.set_layer_observer(std::move(observer));
    }
    void set_kv_tap(KvTap tap) override { forward_.set_kv_tap(std::move(tap)); }
    void set_attention_tap(AttentionTap tap) override {
        forward_.set_attention_tap(std::move(tap));
    }
    double keep_ratio() const override {
        const size_t full =
            kvstore::full_fp16_bytes(n_past(), model_.config.n_layers, model_.config.kv_dim());
        return full == 0 ? 1.0 : static_cast<double>(cache_->bytes()) / static_cast<double>(full);
    }

    // One forward pass over several contexts (eval_batch), run by `runner` when given (its
    // model, pool and numerics must be the contexts'), else by the first context's Forward.
    static Status step(std::span<InferenceContext* const> contexts,
                       std::span<const std::span<const int32_t>> tokens, std::vector<float>& logits,
                       const BatchRunner* runner = nullptr, Forward* runner_forward = nullptr,
                       std::span<const CandidateWant> wants = {},
                       std::vector<RowCandidates>* candidates = nullptr,
                       std::span<const uint8_t> all_logits = {}) {
        if (!wants.empty() && wants.size() != contexts.size())
            return invalid_argument("eval_batch: candidate wants for another batch");
        if (!all_logits.empty() && all_logits.size() != contexts.size())
            return invalid_argument("eval_batch: all-logits flags for another batch");
        if (contexts.empty() || contexts.size() != tokens.size()) {
            return invalid_argument("eval_batch: " + std::to_string(contexts.size()) +
                                    " contexts and " + std::to_string(tokens.size()) +
                                    " token lists");
        }
        std::vector<SequenceInput> batch(contexts.size());
        auto* first = static_cast<InferenceContextImpl*>(contexts[0]);
        if (runner != nullptr &&
            (&runner->model() != &first->model_ || runner->threads() != first->threads_.get() ||
             runner->numerics() != first->options_.attention ||
             runner->backend() != first->options_.backend)) {
            return invalid_argument(
                "eval_batch: the contexts differ from the runner in model, thread pool, "
                "numerics or backend");
        }
        for (size_t i = 0; i < contexts.size(); ++i) {
            auto* c = static_cast<InferenceContextImpl*>(contexts[i]);
            if (&c->model_ != &first->model_ || c->threads_ != first->threads_ ||
                c->options_.attention != first->options_.attention ||
                c->options_.backend != first->options_.backend) {
                return invalid_argument(
                    "eval_batch: the contexts differ in model, thread pool, numerics or backend");
            }
            for (size_t j = 0; j < i; ++j) {
                if (contexts[j] == c)
                    return invalid_argument("eval_batch: a context appears twice");
            }
            if (tokens[i].empty()) return invalid_argument("eval_batch: a context without tokens");
            DS_RETURN_IF_ERROR(c->check(tokens[i].size()));
            batch[i] = SequenceInput{c->cache_.get(), tokens[i],
                                     !all_logits.empty() && all_logits[i] != 0};
            if (!wants.empty()) batch[i].want = wants[i];
        }
        return (runner_forward != nullptr ? *runner_forward : first->forward_)
            .run(batch, logits, candidates);
    }

  private:
    // The cache's codec; kUnimplemented for a policy whose tokens cannot leave its cache.
    Result<kvstore::SequenceCodec*> codec() const {
        kvstore::SequenceCodec* c = cache_->codec();
        if (c == nullptr) {
            return unimplemented("the " + options_.kv.policy +
                                 " policy's cache cannot be shipped between nodes");
        }
        return c;
    }
    Status check(size_t n_new) const {
        if (static_cast<int64_t>(n_past()) + static_cast<int64_t>(n_new) > options_.n_ctx) {
            return out_of_range("the sequence would hold " + std::to_string(n_past() + n_new) +
                                " tokens, more than the context size " +
                                std::to_string(options_.n_ctx));
        }
        return Status();
    }

    // Appends tokens in chunks of n_batch; only the last chunk's last logits are kept.
    // With `all`, every token's logits are appended to *all.
    Status run(std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>* all = nullptr) {
        if (tokens.empty()) return invalid_argument("eval: no tokens");
        DS_RETURN_IF_ERROR(check(tokens.size()));
        const int32_t before = n_past();
        // A prompt's chunks tell the cache what follows; scoring's (all_logits) do not, so that
        // each chunk is scored against the history as compressed after the chunks before it.
        const int32_t more = std::exchange(more_, 0);
        for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(options_.n_batch)) {
            const size_t n = std::min(tokens.size() - i, static_cast<size_t>(options_.n_batch));
            cache_->expect_more(all_logits ? 0
                                           : static_cast<int32_t>(tokens.size() - i - n) + more);
            SequenceInput in{cache_.get(), tokens.subspan(i, n), all_logits};
            Status st = forward_.run(std::span<const SequenceInput>(&in, 1), logits_);
            if (!st.ok()) {
                cache_->truncate(before);  // all or nothing
                return st;
            }
            if (all != nullptr) all->insert(all->end(), logits_.begin(), logits_.end());
        }
        return Status();
    }

    const Model& model_;
    ContextOptions options_;
    std::shared_ptr<ThreadPool> threads_;
    CacheParts parts_;
    std::unique_ptr<kvstore::SequenceCache> cache_;
    Forward forward_;
    std::vector<float> logits_;
    int32_t more_ = 0;  // expect_more: tokens after the next eval's
};

// A keep target below what the profile's latents can hold is held at about their floor: said
// once per process and target, as a server makes a context per session.
void warn_below_floor(const kvstore::DeltaKvProfile& profile, const kvstore::DeltaKvOptions& o) {
    const double floor = kvstore::deltakv_keep_floor(profile, o);
    if (o.keep >= floor) return;
    static std::atomic<float> warned{0.0f};
    if (warned.exchange(o.keep) == o.keep) return;
    spdlog::warn(
        "deltakv: keep {:.2f} is below what this profile holds (about {:.3f} at 2k tokens: {}-bit "
        "latents "
        "of m = {}, a reference every {} tokens, one full layer); the session holds about that",
        o.keep, floor, o.latent_bits, profile.m, o.stride);
}

}  // namespace

Result<std::unique_ptr<InferenceContext>> InferenceContext::create(const Model& model,
                                                                   const ContextOptions& options) {
    ContextOptions opts = options;
    DS_ASSIGN_OR_RETURN(const kvstore::KvPolicyInfo* const policy_info,
                        kvstore::find_kv_policy(opts.kv.policy));
    const kvstore::KvPolicyInfo& policy = *policy_info;
    if (opts.n_ctx <= 0) {
        opts.n_ctx = std::min(model.config.n_ctx_train, kDefaultMaxContext);
        if (model.config.sliding_window > 0 && !policy.windows) {
            opts.n_ctx = std::min(opts.n_ctx, model.config.sliding_window);
        }
    }
    if (opts.n_batch <= 0) return invalid_argument("n_batch must be positive");
    // nullptr is the CPU backend: named, so that contexts compare equal however they got it.
    if (opts.backend == nullptr) opts.backend = kernels::find_backend("cpu");
    if (!opts.backend->host_memory()) {
        if (opts.attention == AttentionNumerics::kGgml) {
            return invalid_argument("llama.cpp's rounding (--attention ggml) runs on the CPU only");
        }
        DS_RETURN_IF_ERROR(opts.backend->availability());
    }
    // A model the attention kernels cannot run is refused here, not at its first token.
    const ModelConfig& mc = model.config;
    DS_RETURN_IF_ERROR(
        kernels::attention_shape_supported({mc.n_heads, mc.n_kv_heads, mc.head_dim, 0.0f})
            .with_context("model '" + mc.name + "'"));
    if (mc.sliding_window > 0 && opts.n_ctx > mc.sliding_window && !policy.windows) {
        // Its cache attends over every token; a local layer's window equals that only so far.
        return unimplemented(
            "model '" + mc.name + "' has sliding-window layers of " +
            std::to_string(mc.sliding_window) + " tokens, and the " + opts.kv.policy +
            " policy does not implement them: a context of at most that many "
            "tokens (asked: " +
            std::to_string(opts.n_ctx) + "), or a policy that does (full or an evicting one)");
    }
    if (opts.n_threads <= 0) opts.n_threads = default_thread_count();
    if (opts.threads) opts.n_threads = opts.threads->size();
    if (opts.attention == AttentionNumerics::kGgml && opts.kv_type != KvType::kF16) {
        return invalid_argument("llama.cpp-compatible attention needs an f16 KV cache");
    }
    const kernels::DType dtype =
        opts.kv_type == KvType::kF16 ? kernels::DType::kF16 : kernels::DType::kF32;
    DS_RETURN_IF_ERROR(opts.kv.validate());
    if (!policy.ggml_attention && opts.attention == AttentionNumerics::kGgml) {
        return invalid_argument("llama.cpp-compatible attention does not run over the " +
                                opts.kv.policy + " policy's cache");
    }
    CacheParts parts;
    const ModelConfig& c = model.config;
    if (policy.kind == kvstore::KvCacheKind::kDeltaKv) {
        // Its angle tables (rope_angles, rope_inverse) turn the global layers' keys by plain
        // RoPE of one base; its window layers keep exact rows and turn none.
        std::vector<uint8_t> window_layer(static_cast<size_t>(c.n_layers), 0);
        bool one_base = true;
        for (int32_t l = 0; l < c.n_layers; ++l) {
            window_layer[l] = c.is_window_layer(l);
            if (!window_layer[l] && c.is_local(l) && c.rope_theta_local != c.rope_theta)
                one_base = false;
        }
        if (!c.rope().plain() || !one_base) {
            return unimplemented("the deltakv policy does not implement " +
                                 (c.rope().plain() ? std::string("per-layer RoPE bases")
                                                   : c.rope_scaling + " RoPE scaling") +
                                 " (model '" + c.name + "'); use another policy");
        }
        if (opts.kv_profile.empty() && !opts.deltakv_profile) {
            return invalid_argument(
                "the deltakv policy needs a profile (--kv-profile; make one with deltactl "
                "calibrate)");
        }
        if (!(opts.kv.keep > 0.0f && opts.kv.keep <= 1.0f))
            return invalid_argument("keep ratio must be in (0, 1]");
        if (opts.kv_type != KvType::kF16)
            return invalid_argument("the deltakv policy keeps an f16 cache");
        if (opts.deltakv_profile) {
            parts.profile = opts.deltakv_profile;
        } else {
            DS_ASSIGN_OR_RETURN(parts.profile, load_deltakv_profile(opts.kv_profile, c));
        }
        kvstore::DeltaKvOptions o = deltakv_options(c, *parts.profile);
        o.n_ctx = opts.n_ctx;
        o.n_batch = opts.n_batch;
        if (c.sliding_window > 0) {
            o.window_layer = std::move(window_layer);
            o.sliding_window = c.sliding_window;
            o.window_rope_theta = c.rope_theta_local;
        }
        if (!(opts.deltakv_select > 0.0f && opts.deltakv_select <= 1.0f)) {
            return invalid_argument("deltakv select ratio must be in (0, 1], got " +
                                    std::to_string(opts.deltakv_select));
        }
        o.select_ratio = opts.deltakv_select;
        if (opts.deltakv_score_every < 0) {
            return invalid_argument("deltakv score-every must be >= 0, got " +
                                    std::to_string(opts.deltakv_score_every));
        }
        o.score_every = opts.deltakv_score_every;
        if (!(opts.deltakv_score_dims > 0.0f && opts.deltakv_score_dims <= 1.0f)) {
            return invalid_argument("deltakv score-dims must be in (0, 1], got " +
                                    std::to_string(opts.deltakv_score_dims));
        }
        o.score_dims = opts.deltakv_score_dims;
        if (!(opts.deltakv_pin >= 0.0f && opts.deltakv_pin < 1.0f)) {
            return invalid_argument("deltakv pin ratio must be in [0, 1), got " +
                                    std::to_string(opts.deltakv_pin));
        }
        o.pin_ratio = opts.deltakv_pin;
        if (opts.deltakv_follow < 0) {
            return invalid_argument("deltakv follow must be >= 0, got " +
                                    std::to_string(opts.deltakv_follow));
        }
        o.follow = opts.deltakv_follow;
        if (!(opts.deltakv_exact >= 0.0f && opts.deltakv_exact < 1.0f)) {
            return invalid_argument("deltakv exact share must be in [0, 1), got " +
                                    std::to_string(opts.deltakv_exact));
        }
        o.exact_share = opts.deltakv_exact;
        if (!(opts.deltakv_exact_depth > 0.0f && opts.deltakv_exact_depth <= 1.0f)) {
            return invalid_argument("deltakv exact depth must be in (0, 1], got " +
                                    std::to_string(opts.deltakv_exact_depth));
        }
        o.exact_depth = opts.deltakv_exact_depth;
        parts.deltakv = kvstore::deltakv_options_for_keep(*parts.profile, opts.kv.keep, o);
        if (!opts.deltakv_full_layers.empty()) parts.deltakv.full_layer = opts.deltakv_full_layers;
        warn_below_floor(*parts.profile, parts.deltakv);
    } else if (policy.kind == kvstore::KvCacheKind::kEvicting) {
        if (!policy.profile_file.empty() && !opts.kv.gates) {
            if (opts.kv_profile.empty()) {
                return invalid_argument("the " + opts.kv.policy +
                                        " policy needs its gates (--kv-profile " +
                                        std::string(policy.profile_file) + "; deltactl calibrate)");
            }
            DS_ASSIGN_OR_RETURN(opts.kv.gates, load_trimkv_gates(opts.kv_profile, c));
        }
        DS_ASSIGN_OR_RETURN(parts.policy, kvstore::make_eviction_policy(opts.kv));
        kvstore::HeadSlotPoolOptions ho{c.n_layers, c.n_kv_heads, c.head_dim, opts.n_ctx, dtype};
        DS_ASSIGN_OR_RETURN(parts.head_slots, kvstore::HeadSlotPool::create(ho));
    } else {
        DS_ASSIGN_OR_RETURN(parts.groups, kv_layer_groups(c));
        kvstore::BlockPoolOptions po{parts.groups.group_layers, c.kv_dim(), c.n_kv_heads, dtype, 0};
        // Full KV lives where the forward pass runs: on a device backend, in its memory.
        po.backend = opts.backend;
        if (opts.kv_blocks) {
            const kvstore::BlockPoolOptions& have = opts.kv_blocks->options();
            if (have.n_layers != po.n_layers || have.kv_dim != po.kv_dim ||
                have.n_kv_heads != po.n_kv_heads || have.dtype != po.dtype) {
                return invalid_argument("the KV block pool was made for another model or KV type");
            }
            const kernels::Backend* device = opts.kv_blocks->device();
            if (device != nullptr && device != opts.backend) {
                return invalid_argument("the KV block pool is in the memory of " +
                                        device->description() +
                                        ", not of the backend the context runs on");
            }
            parts.blocks = opts.kv_blocks;
        } else {
            // Every group's blocks of n_ctx tokens (a window group's fewer, but a context's
            // own pool is address space until written).
            po.n_blocks =
                parts.groups.n_groups() * ((opts.n_ctx + kvstore::BlockPool::kBlockTokens - 1) /
                                               kvstore::BlockPool::kBlockTokens +
                                           1);
            DS_ASSIGN_OR_RETURN(parts.blocks, kvstore::BlockPool::create(po));
        }
    }
    auto ctx = std::make_unique<InferenceContextImpl>(model, opts, std::move(parts));
    DS_RETURN_IF_ERROR(ctx->init());
    return std::unique_ptr<InferenceContext>(std::move(ctx));
}

Status eval_batch(std::span<InferenceContext* const> contexts,
                  std::span<const std::span<const int32_t>> tokens, std::vector<float>& logits) {
    return InferenceContextImpl::step(contexts, tokens, logits);
}

BatchRunner::BatchRunner(const Model& model, std::shared_ptr<ThreadPool> threads,
                         AttentionNumerics numerics, kernels::Backend* backend)
    : model_(model),
      threads_(std::move(threads)),
      numerics_(numerics),
      backend_(backend != nullptr ? backend : kernels::find_backend("cpu")),
      forward_(std::make_unique<Forward>(model, *threads_, backend_)) {
    forward_->set_attention_numerics(numerics);
}

BatchRunner::~BatchRunner() = default;

Status BatchRunner::run(std::span<InferenceContext* const> contexts,
                        std::span<const std::span<const int32_t>> tokens,
                        std::vector<float>& logits) {
    return InferenceContextImpl::step(contexts, tokens, logits, this, forward_.get());
}

Status BatchRunner::run(std::span<InferenceContext* const> contexts,
                        std::span<const std::span<const int32_t>> tokens,
                        std::span<const CandidateWant> wants, std::vector<float>& logits,
                        std::vector<RowCandidates>& candidates) {
    return InferenceContextImpl::step(contexts, tokens, logits, this, forward_.get(), wants,
                                      &candidates);
}

Status BatchRunner::run(std::span<InferenceContext* const> contexts,
                        std::span<const std::span<const int32_t>> tokens,
                        std::span<const CandidateWant> wants, std::span<const uint8_t> all_logits,
                        std::vector<float>& logits, std::vector<RowCandidates>& candidates) {
    return InferenceContextImpl::step(contexts, tokens, logits, this, forward_.get(), wants,
                                      &candidates, all_logits);
}

}  // namespace deltaserve::model
