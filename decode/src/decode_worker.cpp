#include "deltaserve/decode/decode_worker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "deltaserve/common/byte_size.h"
#include "deltaserve/common/chain_hash.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/decode/kv_stream_io.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/constraint_factory.h"
#include "deltaserve/model/deltakv_profile.h"
#include "deltaserve/model/kv_groups.h"
#include "deltaserve/model/trimkv_profile.h"
#include "deltaserve/transport/kv_stream.h"
#include "deltaserve/transport/wire_format.h"
#include "persist_queue.h"
#include "prefix_cache.h"
#include "running_turn.h"
#include "session_tiers.h"

namespace deltaserve::decode {

namespace {

using Clock = std::chrono::steady_clock;
using transport::StreamHeader;
using transport::StreamKind;

// DecodeOptions::kv_memory's default: a quarter of the machine's physical memory.
size_t default_kv_memory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return size_t{1} << 30;
    return static_cast<size_t>(pages) * static_cast<size_t>(page) / 4;
}

int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
        .count();
}

struct Session {
    std::unique_ptr<model::InferenceContext> ctx;  // null while a turn holds it
    std::vector<int32_t> tokens;                   // the tokens in ctx, in order
    std::string scope;                             // its turns' cache scope (the tenant)
    int64_t last_used = 0;
    bool busy = false;    // a turn runs for it
    bool pinned = false;  // kept in decode memory (pin_session)
};

}  // namespace

Status check_checkpoint_name(const std::string& name) {
    const bool ok = !name.empty() && name.size() <= 64 && name != "." && name != ".." &&
                    name.find_first_not_of(
                        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                        "0123456789._-") == std::string::npos;
    return ok ? Status() : invalid_argument("a checkpoint name is 1-64 of A-Z a-z 0-9 . _ -");
}

namespace {

class DecodeWorkerImpl final : public DecodeWorker {
  public:
    DecodeWorkerImpl(const model::Model& model, DecodeOptions options,
                     std::unique_ptr<model::InferenceContext> probe, bool shippable,
                     bool prefix_exact, std::shared_ptr<ThreadPool> threads)
        : model_(model),
          options_(std::move(options)),
          n_ctx_(probe->n_ctx()),
          shippable_(shippable),
          threads_(std::move(threads)),
          ids_{options_.model_id, options_.profile_id, kv_codec(options_.context)},
          probe_(std::move(probe)),
          runner_(model, threads_, options_.context.attention, options_.context.backend),
          constraints_(*model.tokenizer) {
        if (options_.host_tier || options_.disk_tier || options_.device_tier) {
            auto policy = kvstore::find_kv_policy(options_.context.kv.policy);
            if (policy.ok() && (*policy)->storable) {
                // What stored blocks depend on besides their tokens.
                const std::string parts[] = {
                    ids_.model_id, ids_.profile_id, options_.store_id, std::string((*policy)->name),
                    options_.context.kv_type == model::KvType::kF32 ? "f32" : "f16"};
                SessionTiers::Options to;
                to.host = options_.host_tier;
                if (!to.host) {  // no host tier: one that holds nothing
                    kvstore::HostTier::Options none;
                    none.janitor_interval = std::chrono::milliseconds(0);
                    to.host = std::make_shared<kvstore::HostTier>(none);
                }
                to.disk = options_.disk_tier;
                to.device = options_.device_tier;
                to.fingerprint = hash_root(parts);
                to.codec = (*policy)->codec;
                to.block_tokens = std::max(1, options_.tier_block_tokens);
                to.shared_prefix = prefix_exact;
                tiers_ = std::make_unique<SessionTiers>(std::move(to));
                if (tiers_->persists()) persister_ = std::make_unique<PersistQueue>();
            }
        }
        const auto& pool = options_.context.kv_blocks;
        if (prefix_exact && pool && options_.prefix_cache_bytes > 0) {
            const std::string fingerprint[] = {ids_.model_id, ids_.profile_id,
                                               std::to_string(static_cast<int>(ids_.codec))};
            // (The layer groups were made once already, for the pool.)
            auto groups = model::kv_layer_groups(model_.config);
            prefix_ = std::make_unique<PrefixCache>(
                prefix_cache_root(fingerprint), options_.prefix_cache_bytes, pool,
                groups.ok() ? std::move(*groups) : kvstore::KvLayerGroups{});
            // Blocks only the prefix cache holds are the first to go when the pool runs short.
            pool->set_reclaimer([this](int32_t missing) { prefix_->reclaim(missing); });
        }
        loop_ = std::thread([this] { run_loop(); });
    }

    ~DecodeWorkerImpl() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping_ = true;
        }
        wake_.notify_all();
        loop_.join();
        if (acceptor_.joinable()) acceptor_.join();
        listener_.reset();
        std::list<Reader> readers;
        {
            std::lock_guard<std::mutex> lock(mu_);
            readers.swap(readers_);
        }
        for (Reader& r : readers) r.connection->close();
        for (Reader& r : readers) r.thread.join();
        std::map<uint64_t, std::shared_ptr<Turn>> left;
        {
            std::lock_guard<std::mutex> lock(mu_);
            left = turns_;
        }
        for (auto& [id, t] : left) end_turn(t, unavailable("the decode worker stopped"));
        persister_.reset();  // the turns' ends it still stores, then the sinks hear them
        if (prefix_) options_.context.kv_blocks->set_reclaimer(nullptr);
    }

    Result<TurnPlan> start_turn(TurnSpec spec, std::shared_ptr<TurnSink> sink) override;
    void cancel(uint64_t turn_id, Status why) override;
    void serve(std::unique_ptr<transport::Connection> connection) override;
    Result<std::string> listen(transport::Transport& transport,
                               const std::string& address) override {
        if (listener_) return failed_precondition("the decode worker listens already");
        DS_ASSIGN_OR_RETURN(listener_, transport.listen(address));
        acceptor_ = std::thread([this] {
            for (;;) {
                auto conn =
                    listener_->accept(transport::deadline_in(std::chrono::milliseconds(200)));
                if (conn.ok()) {
                    serve(std::move(*conn));
                    continue;
                }
                std::lock_guard<std::mutex> lock(mu_);
                if (stopping_ || conn.status().code() != StatusCode::kDeadlineExceeded) return;
            }
        });
        return listener_->address();
    }
    void drop_session(const std::string& session_id) override {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(session_id);
        if (it != sessions_.end() && !it->second.busy) sessions_.erase(it);
        if (tiers_) tiers_->forget(session_id);
    }
    DecodeStats stats() const override {
        std::lock_guard<std::mutex> lock(mu_);
        DecodeStats s = stats_;  // KV bytes as of the loop's last step
        s.sessions = static_cast<int64_t>(sessions_.size());
        s.running = s.waiting = 0;
        for (const auto& [id, t] : turns_)
            ++(t->stage == Turn::Stage::kRunning ? s.running : s.waiting);
        if (turns_.empty()) {  // nothing runs: what the sessions hold is all there is
            size_t held = 0, kept = 0, full = 0;
            for (const auto& [id, sess] : sessions_) {
                if (!sess.ctx) continue;
                held += sess.ctx->kv_held_bytes();
                kept += sess.ctx->kv_bytes();
                full += kvstore::full_fp16_bytes(sess.ctx->n_past(), model_.config.n_layers,
                                                 model_.config.kv_dim());
            }
            s.kv_bytes = static_cast<int64_t>(held);
            s.keep_ratio = full == 0 ? 1.0 : static_cast<double>(kept) / static_cast<double>(full);
        }
        s.kv_bytes_received = kv_bytes_received_.load();
        s.kv_memory = static_cast<int64_t>(options_.kv_memory);
        s.kv_booked = static_cast<int64_t>(booked_);
        if (const auto& pool = options_.context.kv_blocks) {
            const auto block = static_cast<int64_t>(pool->block_bytes());
            s.kv_pool_used = (pool->capacity() - pool->free_blocks()) * block;
            s.kv_pool_peak = pool->peak_blocks() * block;
        }
        add_prefix_stats(s);
        add_tier_stats(s);
        return s;
    }

    Status evict_session(const std::string& session_id) override {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(session_id);
        if (it == sessions_.end() || (!it->second.ctx && !it->second.busy))
            return not_found("session " + session_id + " is not in decode memory");
        if (it->second.busy)
            return failed_precondition("session " + session_id + " has a turn running");
        drop_idle_locked(it);
        return Status();
    }
    Status pin_session(const std::string& session_id, bool pinned,
                       const std::string& scope) override {
        if (pinned) {  // from the tiers, when they hold it and decode memory does not
            TurnSpec spec;
            spec.session_id = session_id;
            spec.cache_scope = scope;
            promote(spec);
        }
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(session_id);
        if (it == sessions_.end() || (!it->second.ctx && !it->second.busy))
            return not_found("session " + session_id + " is neither in decode memory nor stored");
        it->second.pinned = pinned;
        return Status();
    }
    Result<SessionBlocks> session_blocks(const std::string& session_id) const override {
        if (!tiers_) return failed_precondition("this node keeps no tiered store");
        auto r = tiers_->look(session_id);
        if (!r) return not_found("session " + session_id + " has no stored KV on this node");
        SessionBlocks out;
        out.record = encode_session_record(*r);
        out.fingerprint = tiers_->fingerprint();
        out.blocks = tiers_->places(r->keys);
        return out;
    }
    Result<std::string> read_block(uint64_t key, uint64_t limit) const override {
        if (!tiers_) return failed_precondition("this node keeps no tiered store");
        return tiers_->read_block(key, limit);
    }
    Result<std::string> checkpoint(const std::string& name) const override {
        DS_RETURN_IF_ERROR(check_checkpoint_name(name));
        if (!options_.disk_tier || options_.checkpoint_root.empty())
            return failed_precondition("this node keeps no store on disk (--data-dir none)");
        std::filesystem::path dir =
            std::filesystem::path(options_.checkpoint_root) / "checkpoints" / name;
        if (!options_.checkpoint_store.empty()) dir /= options_.checkpoint_store;
        dir /= "kv";
        DS_RETURN_IF_ERROR(options_.disk_tier->checkpoint(dir.string()));
        return dir.string();
    }
    std::vector<SessionKv> session_kv(const std::vector<std::string>& ids) const override {
        std::vector<SessionKv> out(ids.size());
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (size_t i = 0; i < ids.size(); ++i) {
                SessionKv& k = out[i];
                k.id = ids[i];
                k.policy = options_.context.kv.policy;
                auto it = sessions_.find(ids[i]);
                if (it == sessions_.end()) continue;
                k.running = it->second.busy;
                k.pinned = it->second.pinned;
                if (const auto& ctx = it->second.ctx) {
                    k.tokens = ctx->n_past();
                    k.decode_bytes = static_cast<int64_t>(ctx->kv_held_bytes());
                    k.keep_ratio = ctx->keep_ratio();
                }
            }
        }
        if (tiers_) {  // its own lock, not the loop's
            for (SessionKv& k : out) {
                SessionTiers::Held h;
                if (!tiers_->held(k.id, &h)) continue;
                k.stored_tokens = h.tokens;
                k.host_bytes = h.host_bytes;
                k.device_bytes = options_.device_tier ? h.device_bytes : -1;
                k.disk_bytes = tiers_->persists() ? h.disk_bytes : -1;
                k.blocks = h.blocks;
            }
        }
        return out;
    }

  private:
    struct Reader {
        std::shared_ptr<transport::Connection> connection;
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;  // its connection ended: join it
    };

    Result<std::unique_ptr<model::InferenceContext>> make_context() const {
        model::ContextOptions o = options_.context;
        o.threads = threads_;
        return model::InferenceContext::create(model_, o);
    }
    // A new context holding what the prefix cache has of the prompt, or null when it has
    // nothing of it (or is off).
    std::unique_ptr<model::InferenceContext> from_prefix_cache(const TurnSpec& spec);
    // Offers the blocks of a turn's KV to the prefix cache (a failed copy only loses reuse).
    void cache_prefix(const Turn& t) {
        if (prefix_ && t.ctx) prefix_->store(t.cached, t.spec.cache_scope, *t.ctx);
    }
    // Books the most KV a new turn can hold (DecodeOptions::kv_memory), and what prefilling
    // prefill_here of its tokens here holds until the prompt is in (Turn::prefill_booked),
    // dropping idle sessions other than its own for it, least recently used first. Under mu_.
    Status book_locked(Turn& t, int32_t prefill_here);
    // KV bytes of the sessions no turn runs for, but `except`'s. Under mu_.
    size_t idle_bytes_locked(const std::string& except) const;
    // The least recently used session no turn runs for, other than `except`; end() if none.
    // Under mu_.
    std::map<std::string, Session>::iterator oldest_idle_locked(const std::string& except = "");
    // A turn about to prefill its first chunk: what the prefix cache holds of its prompt now,
    // if more than it started with (turns that came together behind one system prompt: the
    // first computes it, the others find it here).
    void take_late_prefix(Turn& t);
    void add_tier_stats(DecodeStats& s) const {
        if (tiers_) s.tiers = tiers_->stats();
        TierStats& t = s.tiers;
        if (options_.device_tier) {
            const auto d = options_.device_tier->stats();
            t.device_bytes = static_cast<int64_t>(d.bytes);
            t.device_capacity = static_cast<int64_t>(d.capacity);
            t.device_blocks = static_cast<int64_t>(d.blocks);
        }
        if (options_.host_tier) {
            const auto h = options_.host_tier->stats();
            t.host_bytes = static_cast<int64_t>(h.bytes);
            t.host_capacity = static_cast<int64_t>(h.capacity);
            t.host_blocks = static_cast<int64_t>(h.blocks);
            t.host_leases = static_cast<int64_t>(h.leases);
        }
        if (options_.disk_tier) {
            const auto d = options_.disk_tier->stats();
            t.disk_bytes = static_cast<int64_t>(d.bytes);
            t.disk_capacity = static_cast<int64_t>(d.capacity);
            t.disk_blocks = static_cast<int64_t>(d.blocks);
            t.disk_admitting = d.admitting;
            t.disk_dropped = static_cast<int64_t>(d.dropped);
            t.disk_io_errors = static_cast<int64_t>(d.io_errors);
            t.disk_recovery_ms = d.recovery_ms;
        }
    }
    void add_prefix_stats(DecodeStats& s) const {
        if (!prefix_) return;
        const auto p = prefix_->stats();
        s.prefix_cache_bytes = p.bytes;
        s.prefix_cache_blocks = p.blocks;
        s.prefix_cache_hit_tokens = p.hit_tokens;
    }

    void run_loop();
    void end_failed(const std::shared_ptr<Turn>& t);
    // One forward pass; each turn's tokens: its next token, or a chunk of its prompt.
    void step(const std::vector<std::shared_ptr<Turn>>& batch,
              const std::vector<std::span<const int32_t>>& tokens);
    // A prompt chunk's rows of logits (TurnSpec::prompt_logprobs) to the turn's sink: the
    // log-probabilities of the prompt tokens they predict.
    void report_prompt_logprobs(Turn& t, const float* rows, size_t n_rows);
    // After a token was taken: the turn goes on (into `next`) or ends.
    void carry_on(const std::shared_ptr<Turn>& t, std::vector<std::shared_ptr<Turn>>& next);
    void update_stats();
    // Ends a turn once: session bookkeeping, then the sink hears it.
    void end_turn(const std::shared_ptr<Turn>& t, Result<TurnEnd> end);
    // Fails a turn that is waiting for its KV now; a running one at the loop's next step.
    // (cancel: it ends as "cancelled" instead).
    void fail(const std::shared_ptr<Turn>& t, Status why, bool cancel = false);
    void forget_stale(int64_t now);
    // Drops an idle session from KV memory, demoting it to the host tier when there is one.
    // Under mu_.
    std::map<std::string, Session>::iterator drop_idle_locked(
        std::map<std::string, Session>::iterator it);
    // A session with no KV here that the tiers hold: its KV back in a new context, installed
    // as the session's (idle) before the turn looks at it; the tier it came from.
    std::optional<SessionTiers::Source> promote(const TurnSpec& spec);
    std::shared_ptr<Turn> find_turn(uint64_t id) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = turns_.find(id);
        return it == turns_.end() ? nullptr : it->second;
    }

    void read_connection(std::shared_ptr<transport::Connection> conn);
    Status on_stream_message(transport::Connection& conn, const StreamHeader& h,
                             transport::Message& m,
                             std::map<uint64_t, std::shared_ptr<Turn>>& receiving);
    void answer_pull(transport::Connection& conn, const StreamHeader& h);

    const model::Model& model_;
    const DecodeOptions options_;
    const int32_t n_ctx_;
    const bool shippable_;
    std::shared_ptr<ThreadPool> threads_;
    const KvStreamIds ids_;
    // An empty context made like the sessions': what a turn's KV can grow to (kv_bytes_bound).
    const std::unique_ptr<model::InferenceContext> probe_;
    std::unique_ptr<PrefixCache> prefix_;  // null: off, or the policy's prefixes are not exact
    std::unique_ptr<SessionTiers> tiers_;  // null: no tiers, or the KV is not storable
    // Stores sessions' KV at their turns' ends (null: no disk tier). Reset before the rest.
    std::unique_ptr<PersistQueue> persister_;
    // The loop's step buffers, kept across steps (a batch's logits are n_vocab floats a turn),
    // and the batch's activations.
    model::BatchRunner runner_;
    std::vector<model::InferenceContext*> step_contexts_;
    std::vector<float> step_logits_;
    // On a device backend, what each generating turn's sampler needs of its row (the rest
    // stays there), and what came over.
    std::vector<model::CandidateWant> step_wants_;
    std::vector<std::vector<int32_t>> step_penalized_;
    std::vector<model::RowCandidates> step_candidates_;
    std::vector<uint8_t> step_all_;  // the batch's turns that keep every row (prompt logprobs)
    model::ConstraintFactory constraints_;  // the turns' response formats

    mutable std::mutex mu_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::map<uint64_t, std::shared_ptr<Turn>> turns_;
    std::map<std::string, Session> sessions_;
    size_t booked_ = 0;      // KV bytes booked by the turns not ended
    uint64_t arrivals_ = 0;  // turns started (Turn::arrival)
    std::list<Reader> readers_;
    DecodeStats stats_;
    std::atomic<int64_t> kv_bytes_received_{0};
    std::thread loop_;
    std::unique_ptr<transport::Listener> listener_;
    std::thread acceptor_;
};

Result<TurnPlan> DecodeWorkerImpl::start_turn(TurnSpec spec, std::shared_ptr<TurnSink> sink) {
    const int32_t n = static_cast<int32_t>(spec.tokens.size());
    if (n == 0) return invalid_argument("the prompt has no tokens");
    if (n >= n_ctx_) {
        return out_of_range("the conversation has " + std::to_string(n) +
                            " tokens; the context holds " + std::to_string(n_ctx_));
    }
    for (int32_t tok : spec.tokens) {
        if (tok < 0 || tok >= model_.config.n_vocab) {
            return invalid_argument("token id " + std::to_string(tok) +
                                    " is outside the vocabulary");
        }
    }
    // A turn may come over RPC from any gateway: its values are checked here as the
    // gateway's own requests are.
    DS_RETURN_IF_ERROR(model::validate_sampling(spec.sampling));
    if (spec.stop.size() > 16) return invalid_argument("a turn has at most 16 stop strings");
    if (spec.logprobs < -1 || spec.logprobs > model::kMaxTopLogprobs) {
        return invalid_argument("a turn's top logprobs must be -1 (none) to " +
                                std::to_string(model::kMaxTopLogprobs));
    }
    if (spec.prompt_logprobs < -1 || spec.prompt_logprobs > model::kMaxTopLogprobs) {
        return invalid_argument("a turn's prompt top logprobs must be -1 (none) to " +
                                std::to_string(model::kMaxTopLogprobs));
    }
    if (spec.shown_tokens.size() > 16)
        return invalid_argument("a turn shows at most 16 control tokens");
    for (int32_t tok : spec.shown_tokens) {
        if (tok < 0 || tok >= model_.config.n_vocab)
            return invalid_argument("shown token id " + std::to_string(tok) +
                                    " is outside the vocabulary");
    }
    if (spec.cache_scope.size() > 256)
        return invalid_argument("a cache scope has at most 256 bytes");
    for (const std::string& stop : spec.stop) {
        if (stop.empty() || stop.size() > 1024) {
            return invalid_argument("a stop string must have 1 to 1024 bytes");
        }
    }
    if (spec.json_prefix.size() > 256 || spec.json_suffix.size() > 256)
        return invalid_argument("a response format's prefix and suffix have at most 256 bytes");
    if (spec.json_schema.empty() && !(spec.json_prefix.empty() && spec.json_suffix.empty()))
        return invalid_argument("a response format's prefix and suffix need its schema");
    if (spec.continued < 0 || spec.continued >= n || spec.continued_sent < 0)
        return invalid_argument("a continued turn's answer must be shorter than its tokens");
    if (spec.continued > 0 && spec.prompt_logprobs >= 0)
        return invalid_argument("a continued turn does not score its prompt");
    if (spec.max_tokens >= 0 && spec.continued >= spec.max_tokens)
        return invalid_argument("a continued turn's answer is already max_tokens long");
    std::unique_ptr<model::TokenConstraint> constraint;
    if (!spec.json_schema.empty()) {
        DS_ASSIGN_OR_RETURN(
            constraint, constraints_.make(spec.json_schema, spec.json_prefix, spec.json_suffix));
    }
    // A continued turn's answer so far comes off the prompt: the turn replays it (Turn::forced).
    const std::vector<int32_t> answer(spec.tokens.end() - spec.continued, spec.tokens.end());
    spec.tokens.resize(spec.tokens.size() - answer.size());
    const size_t sent_before = static_cast<size_t>(spec.continued_sent);
    auto t = std::make_shared<Turn>(std::move(spec), std::move(sink), model_);
    t->forced.assign(answer.begin(), answer.end());
    t->sent_before = sent_before;
    t->constraint = std::move(constraint);
    auto promoted = promote(t->spec);
    // A turn with no KV of its own here (stateless, or a session this worker holds nothing
    // of) starts from what the prefix cache has of its prompt, or the tiers' stored prefix
    // blocks when they hold more; only this turn sees the copy.
    std::unique_ptr<model::InferenceContext> from_cache;
    bool own = false;
    if (!t->spec.session_id.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(t->spec.session_id);
        own = it != sessions_.end() && it->second.ctx != nullptr;
    }
    // A turn that reports its prompt's log-probabilities computes the whole prompt: cached KV
    // comes without the logits.
    const bool whole_prompt = t->spec.prompt_logprobs >= 0;
    if (prefix_ && !own && !whole_prompt) from_cache = from_prefix_cache(t->spec);
    if (tiers_ && !own && !whole_prompt &&
        tiers_->prefix_held(t->spec.tokens, t->spec.cache_scope) >
            (from_cache ? from_cache->n_past() : 0)) {
        if (auto ctx = make_context(); ctx.ok()) {
            if (auto got = tiers_->load_prefix(t->spec.tokens, t->spec.cache_scope, **ctx,
                                               t->spec.turn_id)) {
                from_cache = std::move(*ctx);
                promoted = got->source;
            }
        }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return unavailable("the decode worker is stopping");
    if (turns_.count(t->spec.turn_id) != 0) {
        return invalid_argument("turn " + std::to_string(t->spec.turn_id) + " is already running");
    }
    if (!t->spec.session_id.empty()) {
        auto it = sessions_.find(t->spec.session_id);
        if (it != sessions_.end() && it->second.busy) {
            return failed_precondition("session " + t->spec.session_id +
                                       " already has a turn running");
        }
    }
    // What the prompt shares with the KV it starts from (the session's, or the prefix
    // cache's copy), and so what is prefilled, and where.
    size_t reuse = from_cache ? static_cast<size_t>(from_cache->n_past()) : 0;
    if (!t->spec.session_id.empty()) {
        auto it = sessions_.find(t->spec.session_id);
        if (it != sessions_.end() && it->second.ctx) {
            const auto& had = it->second.tokens;
            reuse = static_cast<size_t>(
                std::mismatch(had.begin(), had.end(), t->spec.tokens.begin(), t->spec.tokens.end())
                    .first -
                had.begin());
        }
    }
    // Evaluate at least one token to get logits.
    int32_t keep = static_cast<int32_t>(std::min(reuse, t->spec.tokens.size() - 1));
    // KV whose sliding-window layers no longer hold the window that ends at keep cannot
    // start there (a turn that rewinds a Gemma session): the prompt is computed again.
    const model::InferenceContext* start = from_cache.get();
    if (!t->spec.session_id.empty()) {
        auto it = sessions_.find(t->spec.session_id);
        if (it != sessions_.end() && it->second.ctx) start = it->second.ctx.get();
    }
    if (start != nullptr && keep > 0) keep = start->kept_by_truncate(keep);
    if (whole_prompt) keep = 0;
    const bool remote = shippable_ && !whole_prompt && n - keep > options_.local_prefill_max;
    DS_RETURN_IF_ERROR(book_locked(*t, remote ? 0 : n - keep));
    std::unique_ptr<model::InferenceContext> held;
    if (!t->spec.session_id.empty()) {
        Session& s = sessions_[t->spec.session_id];
        s.busy = true;
        s.scope = t->spec.cache_scope;
        s.last_used = now_ms();
        held = std::move(s.ctx);
        s.tokens.clear();  // the turn's now; the session gets them back when it ends
    }
    const bool own_kv = held != nullptr;  // the session's
    if (!held) held = std::move(from_cache);
    TurnPlan plan;
    plan.cached_tokens = keep;
    plan.remote_prefill = remote;
    t->end.prompt_tokens = n;
    t->end.cached_tokens = keep;
    if (keep > 0) {
        t->end.kv_source = promoted ? std::string(SessionTiers::source_name(*promoted))
                           : own_kv ? "decode"
                                    : "prefix";
    }
    if (plan.remote_prefill) {
        t->stage = Turn::Stage::kAwaitKv;
        t->kv_deadline = Clock::now() + std::chrono::milliseconds(options_.kv_wait_ms);
        if (keep > 0) {
            held->truncate(keep);
            t->history = std::move(held);
            plan.pull_tokens = keep;
            // The history stays until the prefill node pulled it, beside the KV coming back.
            const size_t history = probe_->kv_bytes_bound(keep);
            t->booked += history;
            booked_ += history;
        }
    } else {
        if (!held) {
            lock.unlock();
            auto ctx = make_context();
            lock.lock();
            if (!ctx.ok()) {
                if (!t->spec.session_id.empty()) sessions_.erase(t->spec.session_id);
                booked_ -= t->booked;
                return ctx.status();
            }
            held = std::move(*ctx);
        }
        held->truncate(keep);
        t->ctx = std::move(held);
        t->stage = Turn::Stage::kPrefillHere;
        t->look_again = prefix_ != nullptr && !own_kv && !whole_prompt;
    }
    t->prefilled = keep;
    t->arrival = arrivals_++;
    turns_[t->spec.turn_id] = t;
    lock.unlock();
    wake_.notify_all();
    return plan;
}

size_t DecodeWorkerImpl::idle_bytes_locked(const std::string& except) const {
    size_t bytes = 0;
    for (const auto& [id, sess] : sessions_) {
        if (sess.ctx && !sess.busy && id != except) bytes += sess.ctx->kv_held_bytes();
    }
    return bytes;
}

Status DecodeWorkerImpl::book_locked(Turn& t, int32_t prefill_here) {
    const int32_t n = static_cast<int32_t>(t.spec.tokens.size());
    const int32_t answer =
        t.spec.max_tokens < 0 ? n_ctx_ - n : std::min(t.spec.max_tokens, n_ctx_ - n);
    const int32_t total = n + answer;
    // A prompt prefilled here may hold more until its last chunk (a compressing cache's
    // prompt waits exact): booked too, and given back when the prompt is in.
    const size_t prefill = prefill_here > 0 ? probe_->kv_prefill_bytes_bound(n, prefill_here) : 0;
    const size_t need = probe_->kv_bytes_bound(total) + prefill;
    const size_t budget = options_.kv_memory;
    if (need > budget) {
        return resource_exhausted("the turn's KV can grow to " + format_byte_size(need) + " (" +
                                  std::to_string(total) +
                                  " tokens with max_tokens); the node's KV memory is " +
                                  format_byte_size(budget) + " (--kv-memory)");
    }
    // Refused before any idle session is dropped: dropping them all would not make room.
    if (booked_ + need > budget) {
        return resource_exhausted("KV memory is full: the running turns have booked " +
                                  format_byte_size(booked_) + " of " + format_byte_size(budget) +
                                  " (--kv-memory), this turn needs " + format_byte_size(need) +
                                  "; try again when one ends");
    }
    const std::string& own = t.spec.session_id;
    size_t idle = idle_bytes_locked(own);
    while (booked_ + idle + need > budget) {
        auto oldest = oldest_idle_locked(own);
        if (oldest == sessions_.end()) break;
        if (oldest->second.ctx) idle -= oldest->second.ctx->kv_held_bytes();
        drop_idle_locked(oldest);  // demoted, or recomputed on its next turn
    }
    if (booked_ + idle + need > budget) {  // what is left idle is pinned
        return resource_exhausted("KV memory is full: pinned sessions hold " +
                                  format_byte_size(idle) + " of " + format_byte_size(budget) +
                                  " (--kv-memory), this turn needs " + format_byte_size(need) +
                                  " (deltactl unpin frees them for the LRU)");
    }
    t.booked = need;
    t.prefill_booked = prefill;
    booked_ += need;
    return {};
}

std::unique_ptr<model::InferenceContext> DecodeWorkerImpl::from_prefix_cache(const TurnSpec& spec) {
    if (prefix_->held(spec.tokens, spec.cache_scope) == 0) return nullptr;
    auto ctx = make_context();
    if (!ctx.ok()) return nullptr;
    auto n = prefix_->load(spec.tokens, spec.cache_scope, **ctx);
    if (!n.ok()) {
        spdlog::warn("decode: the prefix cache's blocks did not load: {}", n.status().message());
        return nullptr;
    }
    return *n > 0 ? std::move(*ctx) : nullptr;
}

void DecodeWorkerImpl::take_late_prefix(Turn& t) {
    t.look_again = false;
    if (prefix_->held(t.spec.tokens, t.spec.cache_scope) <= t.prefilled) return;
    auto ctx = make_context();
    if (!ctx.ok()) return;
    auto n = prefix_->load(t.spec.tokens, t.spec.cache_scope, **ctx);
    if (!n.ok() || *n <= t.prefilled) return;
    std::lock_guard<std::mutex> tl(t.mu);
    t.ctx = std::move(*ctx);
    t.prefilled = *n;
    t.end.cached_tokens = *n;
}

void DecodeWorkerImpl::cancel(uint64_t turn_id, Status why) {
    if (auto t = find_turn(turn_id)) fail(t, why, why.ok());
}

void DecodeWorkerImpl::fail(const std::shared_ptr<Turn>& t, Status why, bool cancel) {
    {
        std::lock_guard<std::mutex> lock(t->mu);
        if (t->stage == Turn::Stage::kEnded || t->failed) return;
        if (t->stage != Turn::Stage::kAwaitKv) {  // the loop owns it: it ends it next step
            t->failure = why;
            t->cancel_requested = cancel;
            t->failed = true;
            wake_.notify_all();
            return;
        }
        t->stage = Turn::Stage::kEnded;
    }
    end_turn(t, cancel ? t->finish("cancelled") : Result<TurnEnd>(why));
}

void DecodeWorkerImpl::end_turn(const std::shared_ptr<Turn>& t, Result<TurnEnd> end) {
    {
        std::lock_guard<std::mutex> tl(t->mu);
        t->stage = Turn::Stage::kEnded;
    }
    // The answer's blocks too: the conversation's next request starts with them.
    // (A turn ended from another thread waits for its KV: it has no context.)
    if (end.ok()) cache_prefix(*t);
    // A prefix used a second time (found cached) goes to the tiers, where it outlives the
    // prefix cache's memory and the process. (A session's blocks go with the session.)
    // Beside the loop when there is a disk to write (the context goes with the job).
    if (end.ok() && tiers_ && t->ctx && t->spec.session_id.empty() && t->end.cached_tokens > 0 &&
        tiers_->prefix_held(t->cached, t->spec.cache_scope) < t->end.cached_tokens) {
        if (persister_) {
            std::shared_ptr<model::InferenceContext> ctx = std::move(t->ctx);
            persister_->push(
                [this, ctx, tokens = t->cached, scope = t->spec.cache_scope,
                 upto = t->end.cached_tokens] { tiers_->store_prefix(scope, *ctx, tokens, upto); });
        } else {
            tiers_->store_prefix(t->spec.cache_scope, *t->ctx, t->cached, t->end.cached_tokens);
        }
    }
    const model::InferenceContext* to_store = nullptr;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (t->reported) return;
        t->reported = true;
        turns_.erase(t->spec.turn_id);
        booked_ -= t->booked;
        t->booked = 0;
        ++stats_.turns;
        if (!t->spec.session_id.empty()) {
            auto it = sessions_.find(t->spec.session_id);
            if (it != sessions_.end()) {
                if (end.ok() && t->ctx) {
                    it->second.ctx = std::move(t->ctx);
                    it->second.tokens = std::move(t->cached);
                    it->second.last_used = now_ms();
                    // Stored before the end is reported: a turn whose end its client saw
                    // survives a crash. The session stays busy (untouched) until then.
                    if (persister_) {
                        to_store = it->second.ctx.get();
                    } else {
                        it->second.busy = false;
                    }
                } else {
                    sessions_.erase(it);  // recomputed next turn: slower, never wrong
                }
            }
        }
        t->ctx.reset();
        std::lock_guard<std::mutex> tl(t->mu);
        t->history.reset();
        t->incoming.reset();
    }
    if (to_store == nullptr) {
        t->sink->on_end(std::move(end));
        return;
    }
    persister_->push([this, t, to_store, end = std::move(end)]() mutable {
        const std::string& id = t->spec.session_id;
        std::vector<int32_t> tokens;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = sessions_.find(id);  // busy: nothing drops it meanwhile
            if (it != sessions_.end()) tokens = it->second.tokens;
        }
        if (!tokens.empty()) tiers_->persist(id, t->spec.cache_scope, *to_store, tokens, now_ms());
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = sessions_.find(id);
            if (it != sessions_.end()) it->second.busy = false;
        }
        t->sink->on_end(std::move(end));
    });
}

void DecodeWorkerImpl::forget_stale(int64_t now) {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
        const bool stale = !it->second.busy && !it->second.pinned &&
                           now - it->second.last_used > options_.session_ttl_ms;
        it = stale ? drop_idle_locked(it) : std::next(it);
    }
    while (static_cast<int32_t>(sessions_.size()) > options_.max_sessions) {
        auto oldest = oldest_idle_locked();
        if (oldest == sessions_.end()) break;
        drop_idle_locked(oldest);
    }
    // A demoted session lives as long as an idle one would, and then some.
    if (tiers_) tiers_->forget_older_than(now - 2 * options_.session_ttl_ms);
}

std::map<std::string, Session>::iterator DecodeWorkerImpl::drop_idle_locked(
    std::map<std::string, Session>::iterator it) {
    if (tiers_ && it->second.ctx && !it->second.tokens.empty() &&
        it->second.ctx->n_past() == static_cast<int32_t>(it->second.tokens.size())) {
        tiers_->demote(it->first, it->second.scope, *it->second.ctx, it->second.tokens, now_ms());
    }
    return sessions_.erase(it);
}

std::optional<SessionTiers::Source> DecodeWorkerImpl::promote(const TurnSpec& spec) {
    if (!tiers_ || spec.session_id.empty()) return std::nullopt;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(spec.session_id);
        if (it != sessions_.end() && (it->second.ctx || it->second.busy)) return std::nullopt;
    }
    const int32_t stored = tiers_->stored_tokens(spec.session_id);
    if (stored == 0) return std::nullopt;
    {
        // Room for the stored KV, as a turn makes room: idle sessions go, least recent first.
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(spec.session_id);
        if (it != sessions_.end() && (it->second.ctx || it->second.busy)) return std::nullopt;
        const size_t need = probe_->kv_bytes_bound(stored);
        size_t idle = idle_bytes_locked(spec.session_id);
        while (booked_ + idle + need > options_.kv_memory) {
            auto oldest = oldest_idle_locked(spec.session_id);
            if (oldest == sessions_.end()) break;
            if (oldest->second.ctx) idle -= oldest->second.ctx->kv_held_bytes();
            drop_idle_locked(oldest);
        }
    }
    auto ctx = make_context();
    if (!ctx.ok()) return std::nullopt;
    auto back = tiers_->promote(spec.session_id, spec.cache_scope, **ctx, spec.turn_id);
    if (!back) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(spec.session_id);
    if (it != sessions_.end() && (it->second.ctx || it->second.busy)) return std::nullopt;
    Session& s = sessions_[spec.session_id];
    s.ctx = std::move(*ctx);
    s.tokens = std::move(back->tokens);
    s.scope = spec.cache_scope;
    s.last_used = now_ms();
    return back->source;
}

std::map<std::string, Session>::iterator DecodeWorkerImpl::oldest_idle_locked(
    const std::string& except) {
    auto oldest = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
        if (it->second.busy || it->second.pinned || (!except.empty() && it->first == except))
            continue;
        if (oldest == sessions_.end() || it->second.last_used < oldest->second.last_used)
            oldest = it;
    }
    return oldest;
}

void DecodeWorkerImpl::run_loop() {
    std::vector<std::shared_ptr<Turn>> running;     // each with a token to evaluate
    std::vector<std::shared_ptr<Turn>> prefilling;  // prompts evaluated here, a chunk per step
    for (;;) {
        std::vector<std::shared_ptr<Turn>> arrived, expired;
        {
            std::unique_lock<std::mutex> lock(mu_);
            const auto has_work = [&] {
                if (stopping_ || !running.empty() || !prefilling.empty()) return true;
                for (auto& [id, t] : turns_) {
                    if (t->stage == Turn::Stage::kPrefillHere || t->admissible || t->failed)
                        return true;
                }
                return false;
            };
            wake_.wait_for(lock, std::chrono::milliseconds(100), has_work);
            if (stopping_) break;
            const auto now = Clock::now();
            for (auto& [id, t] : turns_) {
                if (t->stage == Turn::Stage::kPrefillHere) {
                    if (!t->in_loop) prefilling.push_back(t);
                    t->in_loop = true;
                } else if (t->stage == Turn::Stage::kAwaitKv) {
                    if (t->admissible) {
                        arrived.push_back(t);
                    } else if (now > t->kv_deadline.load()) {
                        expired.push_back(t);
                    }
                }
            }
            forget_stale(now_ms());
        }
        // First come, first served (turns_ is keyed by turn id): the earliest prompt takes
        // the step's budget, so prompts finish one after another, not all late together.
        // Except that a prompt whose rest fits in one pass's chunk (a session's new message,
        // a resent conversation past its cached prefix) goes before the longer ones: it waits
        // one pass, not a document's whole prefill, and delays that by its few tokens.
        std::sort(prefilling.begin(), prefilling.end(),
                  [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
        std::stable_partition(prefilling.begin(), prefilling.end(), [&](const auto& t) {
            return static_cast<int32_t>(t->spec.tokens.size()) - t->prefilled <=
                   options_.prefill_chunk;
        });
        for (auto& t : expired) {
            fail(t,
                 deadline_exceeded("nothing of the turn's KV arrived from the prefill node for " +
                                   std::to_string(options_.kv_wait_ms) + " ms"));
        }
        // Turns that failed or were cancelled in the loop end here.
        for (auto* list : {&running, &prefilling}) {
            std::erase_if(*list, [&](const std::shared_ptr<Turn>& t) {
                if (t->failed) end_failed(t);
                return t->failed.load();
            });
        }
        for (auto& t : arrived) {
            {
                std::lock_guard<std::mutex> tl(t->mu);
                if (t->stage != Turn::Stage::kAwaitKv) continue;
                t->stage = Turn::Stage::kRunning;
                t->ctx = std::move(t->incoming);
                t->history.reset();
            }
            cache_prefix(*t);  // before it generates: requests sharing the prompt come now
            t->sink->on_prompt_done();
            t->admit_remote();
            carry_on(t, running);
        }
        // One forward pass: up to max_batch turns, the running ones first (round robin when
        // there are more; one place kept for a waiting prompt), then chunks of the prompts
        // prefilled here (chunked prefill: at most prefill_chunk prompt tokens per pass, so that a
        // long prompt does not stall the rest; with no turn generating there is nothing to stall,
        // and a pass takes up to n_batch). A prompt waiting to be prefilled always gets a place:
        // with max_batch turns generating it would otherwise wait for one of them to end, however
        // long that is.
        const size_t max_batch = static_cast<size_t>(options_.max_batch);
        size_t generating = std::min(running.size(), max_batch);
        if (!prefilling.empty() && generating == max_batch && max_batch > 1) --generating;
        std::vector<std::shared_ptr<Turn>> batch(
            running.begin(), running.begin() + static_cast<std::ptrdiff_t>(generating));
        running.erase(running.begin(), running.begin() + static_cast<std::ptrdiff_t>(batch.size()));
        std::vector<std::span<const int32_t>> spans;
        for (auto& t : batch) spans.emplace_back(&t->next_token, 1);
        int32_t budget = batch.empty() ? std::max(options_.prefill_chunk, options_.context.n_batch)
                                       : options_.prefill_chunk;
        for (auto& t : prefilling) {
            if (batch.size() >= max_batch || budget <= 0) break;
            if (t->look_again) take_late_prefix(*t);
            const int32_t left = static_cast<int32_t>(t->spec.tokens.size()) - t->prefilled;
            // A chunk whose every row of logits is kept takes at most prefill_chunk rows.
            const int32_t n = std::min(
                {budget, left, t->spec.prompt_logprobs >= 0 ? options_.prefill_chunk : left});
            t->ctx->expect_more(left - n);  // a compressing cache compresses at the prompt's end
            batch.push_back(t);
            spans.push_back(std::span<const int32_t>(t->spec.tokens).subspan(t->prefilled, n));
            budget -= n;
        }
        if (!batch.empty()) step(batch, spans);
        for (auto& t : batch) {
            if (t->stage == Turn::Stage::kPrefillHere && !t->failed)
                continue;  // more chunks to come
            std::erase(prefilling, t);
            carry_on(t, running);
        }
        update_stats();
    }
}

void DecodeWorkerImpl::end_failed(const std::shared_ptr<Turn>& t) {
    end_turn(t,
             t->cancel_requested ? t->finish("cancelled") : Result<TurnEnd>(t->failure_status()));
}

void DecodeWorkerImpl::carry_on(const std::shared_ptr<Turn>& t,
                                std::vector<std::shared_ptr<Turn>>& next) {
    if (t->done) {
        end_turn(t, t->finish(t->finish_reason));
    } else if (t->failed) {
        end_failed(t);
    } else if (t->ctx->n_past() >= n_ctx_) {
        end_turn(t, t->finish("length"));
    } else {
        next.push_back(t);
    }
}

void DecodeWorkerImpl::step(const std::vector<std::shared_ptr<Turn>>& batch,
                            const std::vector<std::span<const int32_t>>& tokens) {
    step_contexts_.clear();
    for (auto& t : batch) step_contexts_.push_back(t->ctx.get());
    std::vector<float>& logits = step_logits_;
    const bool on_device = runner_.backend() != nullptr && !runner_.backend()->host_memory();
    step_all_.assign(batch.size(), 0);
    bool any_all = false;
    for (size_t i = 0; i < batch.size(); ++i) {
        const Turn& t = *batch[i];
        step_all_[i] = t.stage == Turn::Stage::kPrefillHere && t.spec.prompt_logprobs >= 0;
        any_all = any_all || step_all_[i] != 0;
    }
    const std::span<const uint8_t> all =
        any_all ? std::span<const uint8_t>(step_all_) : std::span<const uint8_t>();
    Status st;
    if (on_device) {
        step_wants_.assign(batch.size(), model::CandidateWant{});
        step_penalized_.resize(batch.size());
        for (size_t i = 0; i < batch.size(); ++i) {
            const Turn& t = *batch[i];
            if (t.stage == Turn::Stage::kPrefillHere) continue;
            if (t.wants_whole_row()) continue;
            step_penalized_[i] = t.sampler.penalized();
            step_wants_[i] = {t.sampler.candidates_wanted(), step_penalized_[i]};
        }
        st = runner_.run(step_contexts_, tokens, step_wants_, all, logits, step_candidates_);
    } else if (any_all) {
        st = runner_.run(step_contexts_, tokens, {}, all, logits, step_candidates_);
    } else {
        st = runner_.run(step_contexts_, tokens, logits);
    }
    const size_t nv = static_cast<size_t>(model_.config.n_vocab);
    size_t first_row = 0;  // turn i's rows start here (one each, or a row per new token)
    for (size_t i = 0; i < batch.size(); ++i) {
        Turn& t = *batch[i];
        const size_t n_rows = step_all_[i] != 0 ? tokens[i].size() : 1;
        const size_t at = std::exchange(first_row, first_row + n_rows);
        if (!st.ok()) {
            std::lock_guard<std::mutex> lock(t.mu);
            t.failure = st;
            t.failed = true;
            continue;
        }
        const std::span<const float> row(logits.data() + (at + n_rows - 1) * nv, nv);
        if (t.stage == Turn::Stage::kPrefillHere) {
            if (step_all_[i] != 0) report_prompt_logprobs(t, logits.data() + at * nv, n_rows);
            t.prefilled += static_cast<int32_t>(tokens[i].size());
            if (t.prefilled < static_cast<int32_t>(t.spec.tokens.size())) continue;
            t.cached = t.spec.tokens;
            t.stage = Turn::Stage::kRunning;
            {
                std::lock_guard<std::mutex> lock(mu_);
                booked_ -= t.prefill_booked;
                t.booked -= std::exchange(t.prefill_booked, 0);
            }
            cache_prefix(t);
            t.sink->on_prompt_done();
            t.admit_local(row);
        } else {
            t.cached.push_back(t.next_token);
            const model::RowCandidates* c = on_device ? &step_candidates_[i] : nullptr;
            if (c != nullptr && !c->ids.empty()) {
                if (!t.take_forced()) t.take(t.sampler.sample_candidates(c->ids, c->logits));
            } else {
                t.take_from(row);
            }
        }
    }
}

void DecodeWorkerImpl::report_prompt_logprobs(Turn& t, const float* rows, size_t n_rows) {
    const size_t nv = static_cast<size_t>(model_.config.n_vocab);
    for (size_t j = 0; j < n_rows; ++j) {
        // Row j follows prompt position prefilled + j: it scores the token after it.
        const size_t next = static_cast<size_t>(t.prefilled) + j + 1;
        if (next >= t.spec.tokens.size()) break;
        t.sink->on_logprobs(model::token_logprobs(std::span<const float>(rows + j * nv, nv),
                                                  t.spec.tokens[next], t.spec.prompt_logprobs));
    }
}

void DecodeWorkerImpl::update_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    DecodeStats s;
    size_t held = 0, kept = 0, full = 0;
    const auto add = [&](const model::InferenceContext* c) {
        if (c == nullptr) return;
        held += c->kv_held_bytes();
        kept += c->kv_bytes();
        full +=
            kvstore::full_fp16_bytes(c->n_past(), model_.config.n_layers, model_.config.kv_dim());
    };
    for (auto& [id, sess] : sessions_) add(sess.ctx.get());
    for (auto& [id, t] : turns_) {
        std::lock_guard<std::mutex> tl(t->mu);
        if (t->stage == Turn::Stage::kRunning) {
            ++s.running;
            add(t->ctx.get());
        } else {
            ++s.waiting;
            // A prompt this loop is prefilling holds the KV of its chunks so far.
            if (t->stage == Turn::Stage::kPrefillHere) add(t->ctx.get());
        }
    }
    s.kv_bytes = static_cast<int64_t>(held);
    s.keep_ratio = full == 0 ? 1.0 : static_cast<double>(kept) / static_cast<double>(full);
    s.turns = stats_.turns;
    add_prefix_stats(s);
    stats_ = s;
}

void DecodeWorkerImpl::serve(std::unique_ptr<transport::Connection> connection) {
    std::shared_ptr<transport::Connection> conn(std::move(connection));
    std::list<Reader> ended;
    {
        std::lock_guard<std::mutex> lock(mu_);
        // Readers whose connection ended are joined here, not at shutdown: a node that
        // served a million connections holds no million thread stacks.
        for (auto it = readers_.begin(); it != readers_.end();) {
            auto next = std::next(it);
            if (it->done->load()) ended.splice(ended.end(), readers_, it);
            it = next;
        }
        if (stopping_ || static_cast<int32_t>(readers_.size()) >= options_.max_data_connections) {
            if (!stopping_) {
                spdlog::warn("decode: refusing a data connection from {}: {} are open already",
                             conn->peer(), readers_.size());
            }
            conn->close();
        } else {
            auto done = std::make_shared<std::atomic<bool>>(false);
            readers_.push_back(Reader{conn, std::thread([this, conn, done] {
                                          read_connection(conn);
                                          done->store(true);
                                      }),
                                      done});
        }
    }
    for (Reader& r : ended) r.thread.join();
}

void DecodeWorkerImpl::read_connection(std::shared_ptr<transport::Connection> conn) {
    std::map<uint64_t, std::shared_ptr<Turn>> receiving;  // streams begun, not yet ended
    Status why = challenge_peer(*conn, options_.cluster_token,
                                transport::deadline_in(std::chrono::seconds(10)));
    if (!why.ok()) {
        spdlog::warn("decode: refusing the data connection from {}: {}", conn->peer(),
                     why.message());
        conn->close();
        return;
    }
    for (;;) {
        auto m = conn->receive(transport::deadline_in(std::chrono::milliseconds(500)));
        if (!m.ok()) {
            if (m.status().code() == StatusCode::kDeadlineExceeded) {
                std::lock_guard<std::mutex> lock(mu_);
                if (!stopping_) continue;
                why = unavailable("the decode worker stopped");
            } else {
                why = m.status();
            }
            break;
        }
        auto h = transport::decode_stream_header(m->header);
        if (!h.ok()) {
            // Nothing after a malformed message can be trusted to belong where it says.
            why = h.status();
            spdlog::warn("decode: dropping the connection from {}: {}", conn->peer(),
                         why.message());
            conn->close();
            break;
        }
        Status st = on_stream_message(*conn, *h, *m, receiving);
        if (!st.ok()) {
            auto it = receiving.find(h->turn);
            std::shared_ptr<Turn> t = it != receiving.end() ? it->second : find_turn(h->turn);
            if (it != receiving.end()) receiving.erase(it);
            if (t) fail(t, st);
        }
    }
    conn->close();  // its transport resources go now, not when the reader is joined
    // The turns whose KV was coming over this connection wait again: the gateway retries
    // their prefill on another node or ends them with the prefill's error (or the KV wait
    // runs out).
    for (auto& [id, t] : receiving) {
        std::lock_guard<std::mutex> tl(t->mu);
        if (t->kv_from != conn.get()) continue;
        spdlog::info("decode: turn {} lost its KV stream from {}: {}", id, conn->peer(),
                     why.message());
        t->incoming.reset();
        t->covered.clear();
        t->kv_from = nullptr;
    }
}

Status DecodeWorkerImpl::on_stream_message(transport::Connection& conn, const StreamHeader& h,
                                           transport::Message& m,
                                           std::map<uint64_t, std::shared_ptr<Turn>>& receiving) {
    const auto payload = std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(m.payload.data()), m.payload.size());
    kv_bytes_received_ += static_cast<int64_t>(m.payload.size());
    switch (h.kind) {
        case StreamKind::kPull:
            answer_pull(conn, h);
            return {};
        case StreamKind::kBegin: {
            auto t = find_turn(h.turn);
            if (!t) return {};  // ended meanwhile: the rest of its stream is dropped
            std::lock_guard<std::mutex> tl(t->mu);
            if (t->stage != Turn::Stage::kAwaitKv || t->admissible) {
                // A retried prefill whose first node finished after all: the turn has its KV.
                spdlog::info("decode: turn {} has its KV; the stream from {} is dropped", h.turn,
                             conn.peer());
                return {};
            }
            if (t->incoming && t->kv_from == &conn) {
                return failed_precondition("turn " + std::to_string(h.turn) +
                                           " began its KV stream twice");
            }
            if (t->incoming) {
                spdlog::info("decode: turn {} takes its KV from {} instead", h.turn, conn.peer());
            }
            if (h.session != t->spec.session_id ||
                h.n_tokens != static_cast<int32_t>(t->spec.tokens.size())) {
                return invalid_argument("the KV stream for turn " + std::to_string(h.turn) +
                                        " describes another session or prompt");
            }
            DS_ASSIGN_OR_RETURN(t->incoming, make_context());
            DS_RETURN_IF_ERROR(t->incoming->import_kv_state(payload));
            t->covered.assign(static_cast<size_t>(model_.config.n_layers), 0);
            t->kv_from = &conn;
            receiving[h.turn] = t;
            t->kv_deadline = Clock::now() + std::chrono::milliseconds(options_.kv_wait_ms);
            return {};
        }
        case StreamKind::kPart: {
            auto it = receiving.find(h.turn);
            if (it == receiving.end()) return {};
            Turn& t = *it->second;
            DS_ASSIGN_OR_RETURN(auto s, transport::decode_shipment(payload, options_.model_id,
                                                                   options_.profile_id));
            std::lock_guard<std::mutex> tl(t.mu);
            // It ended meanwhile, or another node's stream replaced this one.
            if (t.stage != Turn::Stage::kAwaitKv || !t.incoming || t.kv_from != &conn) return {};
            t.kv_deadline = Clock::now() + std::chrono::milliseconds(options_.kv_wait_ms);
            return import_part(*t.incoming, s, t.spec.session_id, t.covered);
        }
        case StreamKind::kEnd: {
            auto it = receiving.find(h.turn);
            if (it == receiving.end()) return {};
            auto t = it->second;
            receiving.erase(it);
            {
                std::lock_guard<std::mutex> tl(t->mu);
                if (t->stage != Turn::Stage::kAwaitKv || !t->incoming || t->kv_from != &conn)
                    return {};
                DS_RETURN_IF_ERROR(check_complete(*t->incoming, t->covered));
                DS_RETURN_IF_ERROR(t->incoming->import_kv_hints(payload));
                if (h.token < 0 || h.token >= model_.config.n_vocab) {
                    return invalid_argument("the prefill node sent first token " +
                                            std::to_string(h.token));
                }
                t->first_token = h.token;
                if (t->spec.logprobs >= 0) {
                    auto lp = model::decode_token_logprobs(h.message, model_.config.n_vocab);
                    if (!lp.ok()) {
                        return invalid_argument("the prefill node's first token: " +
                                                lp.status().message());
                    }
                    if (lp->chosen.token != h.token) {
                        return invalid_argument(
                            "the prefill node's logprobs are not its first token's");
                    }
                    t->first_logprobs = std::move(*lp);
                }
                t->cached = t->spec.tokens;
                t->admissible = true;
            }
            wake_.notify_all();
            return {};
        }
        case StreamKind::kAbort:
            receiving.erase(h.turn);
            return unavailable("the prefill node gave up on the turn: " + h.message);
        case StreamKind::kChallenge:
        case StreamKind::kProof:
            return invalid_argument("a handshake message after the handshake");
    }
    return {};
}

void DecodeWorkerImpl::answer_pull(transport::Connection& conn, const StreamHeader& h) {
    std::unique_ptr<model::InferenceContext> history;
    if (auto t = find_turn(h.turn)) {
        std::lock_guard<std::mutex> tl(t->mu);
        if (t->stage == Turn::Stage::kAwaitKv && t->history && t->spec.session_id == h.session &&
            t->history->n_past() == h.n_tokens) {
            history = std::move(t->history);  // the new KV replaces it
        }
    }
    Status st = history ? send_kv(conn, *history, h.turn, h.session, ids_, -1, "",
                                  transport::deadline_in(std::chrono::seconds(60)))
                        : failed_precondition("no cached KV of " + std::to_string(h.n_tokens) +
                                              " tokens for session " + h.session);
    if (!st.ok()) send_abort(conn, h.turn, st.message());
}

}  // namespace

Result<std::unique_ptr<DecodeWorker>> DecodeWorker::create(const model::Model& model,
                                                           DecodeOptions options) {
    if (options.max_batch < 1) return invalid_argument("max_batch must be at least 1");
    if (options.prefill_chunk <= 0) options.prefill_chunk = std::max(1, options.context.n_batch);
    if (options.max_sessions < 0) return invalid_argument("max_sessions must not be negative");
    model::ContextOptions& c = options.context;
    DS_RETURN_IF_ERROR(c.kv.validate());
    const kvstore::KvPolicyInfo& policy = **kvstore::find_kv_policy(c.kv.policy);
    if (policy.kind == kvstore::KvCacheKind::kDeltaKv && !c.deltakv_profile) {
        if (c.kv_profile.empty())
            return invalid_argument("the deltakv policy needs a profile (--kv-profile)");
        DS_ASSIGN_OR_RETURN(c.deltakv_profile,
                            model::load_deltakv_profile(c.kv_profile, model.config));
    }
    if (policy.kind == kvstore::KvCacheKind::kEvicting && !policy.profile_file.empty() &&
        !c.kv.gates && !c.kv_profile.empty()) {
        DS_ASSIGN_OR_RETURN(c.kv.gates, model::load_trimkv_gates(c.kv_profile, model.config));
    }
    // The process's pool when the caller gives one (serve shares it with its prefill worker).
    auto threads = c.threads ? c.threads : std::make_shared<ThreadPool>(options.threads);
    c.threads = threads;
    // Full KV on a device backend lives in the device's memory (BlockPool); by default it
    // takes half of what the device has free.
    kernels::Backend* const device =
        c.backend != nullptr && !c.backend->host_memory() ? c.backend : nullptr;
    if (options.kv_memory == 0) {
        options.kv_memory = default_kv_memory();
        if (policy.paged && device != nullptr && device->free_memory() > 0)
            options.kv_memory = device->free_memory() / 2;
    }
    // Only a policy whose prefix state is the prefix's alone shares blocks across prompts.
    const bool prefix_exact = policy.shareable;
    if (policy.paged && !c.kv_blocks) {  // one pool of blocks for every session's KV
        const model::ModelConfig& mc = model.config;
        // A block holds one layer group's rows (all layers, but for sliding-window models).
        DS_ASSIGN_OR_RETURN(const kvstore::KvLayerGroups groups, model::kv_layer_groups(mc));
        kvstore::BlockPoolOptions po{
            groups.group_layers, mc.kv_dim(), mc.n_kv_heads,
            c.kv_type == model::KvType::kF16 ? kernels::DType::kF16 : kernels::DType::kF32, 0};
        po.n_blocks = kvstore::BlockPool::blocks_in(po, options.kv_memory);
        po.backend = device;
        DS_ASSIGN_OR_RETURN(c.kv_blocks, kvstore::BlockPool::create(po));
    }
    DS_ASSIGN_OR_RETURN(auto probe, model::InferenceContext::create(model, c));
    const bool shippable = policy.shippable;
    return std::unique_ptr<DecodeWorker>(new DecodeWorkerImpl(
        model, std::move(options), std::move(probe), shippable, prefix_exact, std::move(threads)));
}

}  // namespace deltaserve::decode
