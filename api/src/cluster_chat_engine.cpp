#include "deltaserve/api/cluster_chat_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <limits>
#include <optional>
#include <variant>

#include <nlohmann/json.hpp>

#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/api/version.h"
#include "deltaserve/common/logging.h"
#include "forced_tool_call.h"
#include "prefill_watch.h"
#include "random_id.h"
#include "session_quota.h"
#include "token_texts.h"
#include "tool_answer.h"

namespace deltaserve::api {

namespace {

int64_t now_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Wall-clock seconds at steady-clock second 0, taken once: a session's last use shows the
// same in every page (two clocks read apart would move it by a second now and then).
int64_t wall_offset() {
    static const int64_t offset = unix_seconds() - now_seconds();
    return offset;
}

// A session's record in the store: "gw/" and the session's key.
constexpr std::string_view kRecordPrefix = "gw/";
constexpr int kRecordVersion = 1;

// Hands the decode worker's pieces (and tokens' log-probabilities, in their order) to the
// request's thread: the worker's loop never waits on a slow client.
class QueueSink : public decode::TurnSink {
  public:
    bool on_piece(std::string_view piece) override {
        std::lock_guard<std::mutex> lock(mu_);
        items_.emplace_back(std::string(piece));
        cv_.notify_one();
        return true;
    }
    void on_logprobs(const model::TokenLogprobs& lp) override {
        std::lock_guard<std::mutex> lock(mu_);
        items_.emplace_back(lp);
        cv_.notify_one();
    }
    void on_prompt_done() override {
        std::lock_guard<std::mutex> lock(mu_);
        items_.emplace_back(PromptDone{});
        cv_.notify_one();
    }
    void on_token(int32_t token) override {
        std::lock_guard<std::mutex> lock(mu_);
        items_.emplace_back(Token{token});
        cv_.notify_one();
    }
    void on_end(Result<decode::TurnEnd> end) override {
        std::lock_guard<std::mutex> lock(mu_);
        end_.emplace(std::move(end));
        cv_.notify_one();
    }
    struct PromptDone {};
    struct Token {
        int32_t id;
    };
    using Item = std::variant<std::string, model::TokenLogprobs, PromptDone, Token>;
    enum class Next { kItem, kEnded, kNothingYet };
    // Waits up to `wait` for the next piece or log-probabilities (into item). kEnded once the
    // turn ended and every item was taken.
    Next next(std::chrono::milliseconds wait, Item& item) {
        std::unique_lock<std::mutex> lock(mu_);
        if (!cv_.wait_for(lock, wait, [&] { return !items_.empty() || end_.has_value(); })) {
            return Next::kNothingYet;
        }
        if (items_.empty()) return Next::kEnded;
        item = std::move(items_.front());
        items_.pop_front();
        return Next::kItem;
    }
    Result<decode::TurnEnd> end() {
        std::lock_guard<std::mutex> lock(mu_);
        return *end_;
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Item> items_;
    std::optional<Result<decode::TurnEnd>> end_;
};

// A prompt token's log-probabilities from the decode node: of that token, with the top
// tokens asked for.
Status check_prompt_logprobs(const model::TokenLogprobs& lp, int32_t token, int32_t n_top,
                             int32_t n_vocab) {
    DS_RETURN_IF_ERROR(model::check_token_logprobs(lp, n_vocab));
    if (lp.chosen.token != token)
        return unavailable("the decode node scored another token than the prompt's");
    if (lp.top.size() != static_cast<size_t>(std::min(n_top, n_vocab)) || lp.rank < 1)
        return unavailable("the decode node's prompt logprobs are not the ones asked for");
    return Status();
}

}  // namespace

ClusterChatEngine::ClusterChatEngine(const model::Model& model, std::string model_id,
                                     std::vector<DecodeNode*> decode,
                                     std::vector<PrefillNode*> prefill,
                                     ClusterEngineOptions options)
    : ClusterChatEngine(model, std::move(model_id),
                        static_node_set(std::move(decode), std::move(prefill)), options) {}

ClusterChatEngine::ClusterChatEngine(const model::Model& model, std::string model_id,
                                     std::shared_ptr<NodeSet> nodes, ClusterEngineOptions options)
    : model_(model),
      model_id_(std::move(model_id)),
      nodes_(std::move(nodes)),
      options_(options),
      watch_(std::make_unique<PrefillWatch>()),
      quota_(std::make_unique<SessionQuota>(
          SessionQuota::Caps{options_.max_stored_sessions, options_.max_stored_sessions_per_tenant,
                             options_.max_stored_bytes, options_.max_stored_bytes_per_tenant})) {
    tool_tokens_ = tool_call_tokens(*model_.tokenizer, model_.chat_template.tool_call_format());
    if (options_.records) recover();
    // Pins outlive a restart: the pinned sessions' KV back in their nodes' memory, off the
    // caller's thread (a node may be slow to answer).
    std::vector<std::pair<DecodeNode*, Session>> pinned;
    for (const auto& [key, s] : sessions_) {
        if (s.pinned && s.node != nullptr) pinned.emplace_back(s.node, s);
    }
    if (!pinned.empty()) {
        repin_ = std::thread([this, pinned = std::move(pinned)] {
            for (const auto& [node, s] : pinned) {
                const Status st = node->pin_session(key_of(s.tenant, s.id), true, s.tenant);
                if (!st.ok()) {
                    spdlog::warn(
                        "gateway: session {} stays pinned but its KV is not in {}'s "
                        "memory: {}",
                        s.id, node->name(), st.to_string());
                }
            }
        });
    }
}

bool ClusterChatEngine::save(const Session& s) const {
    if (!options_.records) return true;
    nlohmann::json history = nlohmann::json::array();
    for (const auto& m : s.history) {
        nlohmann::json e = {{"role", m.role}, {"content", m.content}};
        if (!m.json.empty()) e["message"] = m.json;  // with its tool calls, as the template sees it
        history.push_back(std::move(e));
    }
    // The idle time as a wall-clock time: the steady clock starts again with the process.
    nlohmann::json j = {{"v", kRecordVersion},
                        {"tenant", s.tenant},
                        {"id", s.id},
                        {"node", s.node != nullptr ? s.node->name() : ""},
                        {"turns", s.turns},
                        {"tokens", s.tokens},
                        {"cached_tokens", s.cached_tokens},
                        {"pinned", s.pinned},
                        {"last_used", s.last_used + wall_offset()},
                        {"history", std::move(history)}};
    if (s.history_lost) j["history_lost"] = true;
    const std::string key = key_of(s.tenant, s.id);
    const kvstore::DiskTier::Record r[] = {
        {std::string(kRecordPrefix) + key,
         j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}};
    if (Status st = options_.records->put_records(r); !st.ok()) {
        spdlog::warn("gateway: session {}'s record was not stored: {}", s.id, st.to_string());
        s.stored = false;
        return false;
    }
    quota_->recorded(key, s.tenant, static_cast<int64_t>(r[0].second.size()));
    s.stored = true;
    return true;
}

Status ClusterChatEngine::room_for(const std::string& tenant, bool opening) {
    if (!options_.records) return Status();
    std::string why = quota_->refusal(tenant, opening);
    if (why.empty()) return Status();
    sweep_expired_locked();  // those past their TTL go first
    why = quota_->refusal(tenant, opening);
    if (why.empty()) return Status();
    return resource_exhausted(why + "; delete sessions (DELETE /v1/sessions/ID) to go on");
}

void ClusterChatEngine::sweep_expired_locked() {
    auto records = options_.records->records(std::string(kRecordPrefix));
    if (!records.ok()) return;
    const int64_t now = now_seconds();
    for (const auto& [record_key, value] : *records) {
        const std::string key = record_key.substr(kRecordPrefix.size());
        if (sessions_.count(key) != 0) continue;
        auto s = parse_record(key, value);
        if (!s || (!s->pinned && now - s->last_used > options_.session_ttl_seconds)) unsave(key);
    }
}

void ClusterChatEngine::unsave(const std::string& key) const {
    if (!options_.records) return;
    const kvstore::DiskTier::Record r[] = {{std::string(kRecordPrefix) + key, ""}};
    if (Status st = options_.records->put_records(r); !st.ok()) {
        spdlog::warn("gateway: session {}'s record was not removed: {}", key, st.to_string());
        return;
    }
    quota_->removed(key);
}

std::optional<ClusterChatEngine::Session> ClusterChatEngine::parse_record(
    const std::string& key, const std::string& value) const {
    // A record is read as any outside input: what does not parse is dropped, not served.
    const int64_t now = now_seconds();
    Session s;
    try {
        const auto j = nlohmann::json::parse(value);
        if (j.at("v").get<int>() != kRecordVersion) throw std::runtime_error("another version");
        s.tenant = j.at("tenant").get<std::string>();
        s.id = j.at("id").get<std::string>();
        s.turns = j.at("turns").get<int32_t>();
        s.tokens = j.at("tokens").get<int64_t>();
        s.cached_tokens = j.at("cached_tokens").get<int64_t>();
        s.pinned = j.contains("pinned") && j.at("pinned").get<bool>();
        s.history_lost = j.contains("history_lost") && j.at("history_lost").get<bool>();
        // Not later than now (a record from a clock ahead of this one).
        s.last_used = std::min(now, j.at("last_used").get<int64_t>() - wall_offset());
        for (const auto& m : j.at("history")) {
            std::string role = m.at("role").get<std::string>();
            if (role != "system" && role != "user" && role != "assistant" && role != "tool")
                throw std::runtime_error("a message of role '" + role.substr(0, 32) + "'");
            std::string whole;
            if (m.contains("message")) {
                whole = m.at("message").get<std::string>();
                const auto w = nlohmann::json::parse(whole);
                if (!w.is_object() || w.at("role").get<std::string>() != role)
                    throw std::runtime_error("a message that is not its role's");
            }
            s.history.push_back({std::move(role), m.at("content").get<std::string>(), whole});
        }
        if (s.turns < 0 || s.tokens < 0 || s.cached_tokens < 0)
            throw std::runtime_error("negative counts");
        s.node = nodes_->decode_named(j.at("node").get<std::string>());
    } catch (const std::exception& e) {
        spdlog::warn("gateway: a session record ({}) does not parse: {}; dropped", key, e.what());
        return std::nullopt;
    }
    if (key_of(s.tenant, s.id) != key || !check_session_id(s.id, "id").ok()) {
        spdlog::warn("gateway: a session record ({}) names another session; dropped", key);
        return std::nullopt;
    }
    return s;
}

std::optional<ClusterChatEngine::Session> ClusterChatEngine::stored_locked(
    const std::string& key) const {
    if (!options_.records) return std::nullopt;
    auto value = options_.records->get_record(std::string(kRecordPrefix) + key);
    if (!value.ok() || !value->has_value()) return std::nullopt;
    auto s = parse_record(key, **value);
    if (!s || (!s->pinned && now_seconds() - s->last_used > options_.session_ttl_seconds)) {
        unsave(key);  // unreadable, or expired while it was out of memory
        return std::nullopt;
    }
    return s;
}

ClusterChatEngine::Session* ClusterChatEngine::find_locked(const std::string& key) {
    auto it = sessions_.find(key);
    if (it != sessions_.end()) return &it->second;
    auto s = stored_locked(key);
    if (!s) return nullptr;
    // Back in memory: the least recently used idle ones leave it (they stay stored).
    std::vector<std::pair<DecodeNode*, std::string>> none;
    make_room_locked(none);
    return &sessions_.emplace(key, std::move(*s)).first->second;
}

void ClusterChatEngine::recover() {
    const auto t0 = std::chrono::steady_clock::now();
    auto records = options_.records->records(std::string(kRecordPrefix));
    if (!records.ok()) {
        spdlog::error("gateway: the session records could not be read: {}",
                      records.status().to_string());
        return;
    }
    const int64_t now = now_seconds();
    std::vector<Session> live;
    std::vector<std::pair<DecodeNode*, std::string>> expired;
    size_t bad = 0;
    for (const auto& [record_key, value] : *records) {
        const std::string key = record_key.substr(kRecordPrefix.size());
        auto s = parse_record(key, value);
        if (!s) {
            ++bad;
            unsave(key);
        } else if (!s->pinned && now - s->last_used > options_.session_ttl_seconds) {
            expired.emplace_back(s->node, key);  // past its TTL while the server was down
            unsave(key);
        } else {
            quota_->recorded(key, s->tenant, static_cast<int64_t>(value.size()));
            live.push_back(std::move(*s));
        }
    }
    drop(expired);
    // The pinned and the most recently used in memory, up to max_sessions; the rest are read
    // when they come.
    std::sort(live.begin(), live.end(), [](const Session& a, const Session& b) {
        return a.pinned != b.pinned ? a.pinned : a.last_used > b.last_used;
    });
    for (size_t i = 0; i < live.size() && i < static_cast<size_t>(options_.max_sessions); ++i)
        sessions_[key_of(live[i].tenant, live[i].id)] = std::move(live[i]);
    recovered_ = static_cast<int64_t>(live.size());
    recovery_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info(
        "gateway: {} sessions recovered from the record store in {:.1f} ms ({} in "
        "memory, {} expired, {} unreadable)",
        recovered_, recovery_ms_, sessions_.size(), expired.size(), bad);
}

ClusterChatEngine::~ClusterChatEngine() {
    if (repin_.joinable()) repin_.join();
}

EngineStats ClusterChatEngine::stats() const {
    EngineStats s;
    {
        std::lock_guard<std::mutex> lock(mu_);
        s.sessions = static_cast<int64_t>(sessions_.size());
    }
    double held = 0, full = 0;
    for (auto* d : nodes_->decode()) {
        auto ds = d->stats();
        if (!ds.ok()) continue;
        s.queued += ds->waiting;
        s.kv_bytes += ds->kv_bytes;
        s.prefix_cache_bytes += ds->prefix_cache_bytes;
        s.kv_sessions += ds->sessions;
        s.kv_memory += ds->kv_memory;
        s.kv_booked += ds->kv_booked;
        s.kv_pool_used += ds->kv_pool_used;
        s.tiers += ds->tiers;
        held += static_cast<double>(ds->kv_bytes);
        full += ds->keep_ratio > 0 ? static_cast<double>(ds->kv_bytes) / ds->keep_ratio : 0;
    }
    s.keep_ratio = full > 0 ? held / full : 1.0;
    s.sessions_recovered = recovered_;
    s.sessions_recovery_ms = recovery_ms_;
    s.prefill_retries = prefill_retries_.load();
    s.turn_moves = turn_moves_.load();
    for (auto* p : nodes_->prefill()) {
        auto ps = p->stats();
        if (!ps.ok()) continue;
        s.queued += ps->queued;
        s.kv_bytes_shipped += ps->bytes_shipped;
        s.prefill_tokens += ps->tokens;
    }
    return s;
}

SessionInfo ClusterChatEngine::info_of(const Session& s, int64_t now) const {
    SessionInfo i;
    i.id = s.id;
    i.tenant = s.tenant;
    i.turns = s.turns;
    i.messages = static_cast<int32_t>(s.history.size());
    i.tokens = s.tokens;
    i.cached_tokens = s.cached_tokens;
    i.idle_seconds = s.running_turn != 0 ? 0 : now - s.last_used;
    i.running = s.running_turn != 0;
    i.history_lost = s.history_lost;
    i.stored = s.stored;
    return i;
}

std::vector<SessionInfo> ClusterChatEngine::sessions() const {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = now_seconds();
    std::vector<SessionInfo> out;
    for (const auto& [key, s] : sessions_) out.push_back(info_of(s, now));
    if (!options_.records) return out;
    // And those only stored (out of memory).
    auto records = options_.records->records(std::string(kRecordPrefix));
    if (!records.ok()) return out;
    for (const auto& [record_key, value] : *records) {
        const std::string key = record_key.substr(kRecordPrefix.size());
        if (sessions_.count(key) != 0) continue;
        auto s = parse_record(key, value);
        if (s && now - s->last_used <= options_.session_ttl_seconds)
            out.push_back(info_of(*s, now));
    }
    return out;
}

ChatEngine::SessionList ClusterChatEngine::tenant_sessions(const std::string& tenant,
                                                           const std::string& after,
                                                           int32_t limit) const {
    limit = std::clamp(limit, 1, kMaxSessionPage);
    const std::string prefix = key_of(tenant, "");  // "tenant/": ids hold no '/'
    const int64_t now = now_seconds();
    // The stored ones in the page's range, read before the lock, as many as could fill it
    // (those past their TTL are passed over).
    std::vector<Session> stored;
    if (options_.records) {
        const std::string records_prefix = std::string(kRecordPrefix) + prefix;
        std::string cursor = after;
        while (static_cast<int32_t>(stored.size()) <= limit) {
            auto page =
                options_.records->records(records_prefix, cursor, static_cast<size_t>(limit) + 1);
            if (!page.ok() || page->empty()) break;
            for (const auto& [record_key, value] : *page) {
                auto s = parse_record(record_key.substr(kRecordPrefix.size()), value);
                if (s && (s->pinned || now - s->last_used <= options_.session_ttl_seconds))
                    stored.push_back(std::move(*s));
            }
            if (page->size() <= static_cast<size_t>(limit)) break;
            cursor = page->back().first.substr(records_prefix.size());
        }
    }
    SessionList out;
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, SessionInfo> merged;  // key -> info: memory first, then the store
    for (auto it = sessions_.upper_bound(prefix + after);
         it != sessions_.end() && it->first.rfind(prefix, 0) == 0 &&
         static_cast<int32_t>(merged.size()) <= limit;
         ++it)
        merged.emplace(it->first, info_of(it->second, now));
    for (const Session& s : stored) merged.emplace(key_of(s.tenant, s.id), info_of(s, now));
    for (auto& [key, info] : merged) {
        if (static_cast<int32_t>(out.data.size()) == limit) {
            out.more = true;
            break;
        }
        out.data.push_back(std::move(info));
    }
    return out;
}

SessionPage ClusterChatEngine::session_page(const std::string& after, int32_t limit) const {
    limit = std::clamp(limit, 1, kMaxSessionPage);
    SessionPage page;
    std::map<std::string, DecodeNode*> node_of;  // key -> its node
    bool more = false;
    // The page's stored records, read and parsed before the lock (a record holds its whole
    // conversation); those of sessions in memory are passed over below.
    const int64_t now = now_seconds();
    std::vector<Session> stored;
    if (options_.records) {
        auto records = options_.records->records(std::string(kRecordPrefix), after,
                                                 static_cast<size_t>(limit) + 1);
        if (records.ok()) {
            for (const auto& [record_key, value] : *records) {
                auto s = parse_record(record_key.substr(kRecordPrefix.size()), value);
                if (s && now - s->last_used <= options_.session_ttl_seconds)
                    stored.push_back(std::move(*s));
            }
        }
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        // key -> (the session, in memory): the page's from memory, then the stored rest.
        std::map<std::string, std::pair<const Session*, bool>> merged;
        for (auto it = sessions_.upper_bound(after);
             it != sessions_.end() && static_cast<int32_t>(merged.size()) <= limit; ++it)
            merged.emplace(it->first, std::make_pair(&it->second, true));
        for (const auto& s : stored)
            merged.emplace(key_of(s.tenant, s.id), std::make_pair(&s, false));
        for (const auto& [key, entry] : merged) {
            if (static_cast<int32_t>(page.rows.size()) == limit) {
                more = true;
                break;
            }
            const Session& s = *entry.first;
            SessionRow row;
            row.key = key;
            row.info = info_of(s, now);
            row.node = s.node != nullptr ? s.node->name() : "";
            row.last_use_unix = s.last_used + wall_offset();
            row.ttl_left_seconds =
                s.pinned ? -1  // not forgotten while pinned
                : row.info.running
                    ? options_.session_ttl_seconds
                    : std::max<int64_t>(0, options_.session_ttl_seconds - row.info.idle_seconds);
            row.in_memory = entry.second;
            if (s.node != nullptr) node_of[key] = s.node;
            page.rows.push_back(std::move(row));
        }
    }
    if (more) page.next = page.rows.back().key;
    // Each node once, for its sessions of the page; outside the gateway's lock.
    std::map<DecodeNode*, std::vector<size_t>> by_node;
    for (size_t i = 0; i < page.rows.size(); ++i) {
        auto it = node_of.find(page.rows[i].key);
        if (it != node_of.end()) by_node[it->second].push_back(i);
    }
    for (const auto& [node, rows] : by_node) {
        std::vector<std::string> ids;
        for (size_t i : rows) ids.push_back(page.rows[i].key);
        auto kv = node->session_kv(ids);
        if (!kv.ok() || kv->size() != ids.size()) continue;
        for (size_t j = 0; j < rows.size(); ++j) page.rows[rows[j]].kv = std::move((*kv)[j]);
    }
    return page;
}

std::vector<NodeStats> ClusterChatEngine::node_stats() const {
    std::vector<NodeStats> out;
    for (auto* d : nodes_->decode()) {
        NodeStats n;
        n.name = d->name();
        n.rpc_address = d->rpc_address();
        n.data_address = d->data_address();
        n.version = d->version();
        auto s = d->stats();
        if (s.ok()) {
            n.stats = std::move(*s);
        } else {
            n.status = s.status();
        }
        out.push_back(std::move(n));
    }
    return out;
}

Result<std::vector<std::string>> ClusterChatEngine::checkpoint(const std::string& name) const {
    DS_RETURN_IF_ERROR(decode::check_checkpoint_name(name));
    std::vector<std::string> out;
    for (auto* d : nodes_->decode()) {
        auto path = d->checkpoint(name);
        if (!path.ok()) {
            return Status(path.status().code(),
                          "decode node " + d->name() + ": " + path.status().message());
        }
        out.push_back(std::move(*path));
    }
    if (options_.records && !options_.records_store.empty()) {
        const std::string dir = (std::filesystem::path(options_.checkpoint_root) / "checkpoints" /
                                 name / options_.records_store / "kv")
                                    .string();
        DS_RETURN_IF_ERROR(options_.records->checkpoint(dir));
        out.push_back(dir);
    }
    return out;
}

Status ClusterChatEngine::evict_session(const std::string& tenant, const std::string& id) {
    const std::string key = key_of(tenant, id);
    DecodeNode* node = nullptr;
    {
        std::lock_guard<std::mutex> lock(mu_);
        Session* s = find_locked(key);
        if (s == nullptr) return not_found("no session '" + id + "'");
        if (s->running_turn != 0)
            return failed_precondition("session '" + id + "' has a turn running");
        node = s->node;
    }
    if (node == nullptr) return not_found("session '" + id + "' has no KV on any node yet");
    const Status st = node->evict_session(key);
    if (st.code() == StatusCode::kNotFound)
        return not_found("session '" + id + "' is not in decode memory (" + node->name() + ")");
    if (!st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);  // an evict ends a pin
    if (Session* s = find_locked(key); s != nullptr && s->pinned) {
        s->pinned = false;
        save(*s);
    }
    return Status();
}

Result<decode::SessionBlocks> ClusterChatEngine::session_blocks(const std::string& tenant,
                                                                const std::string& id,
                                                                std::string* node_name) {
    const std::string key = key_of(tenant, id);
    DecodeNode* node = nullptr;
    {
        // A look: a session only the record store holds is not read back into memory.
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = sessions_.find(key); it != sessions_.end()) {
            node = it->second.node;
        } else if (auto s = stored_locked(key)) {
            node = s->node;
        } else {
            return not_found("no session '" + id + "'");
        }
        if (node == nullptr) return not_found("session '" + id + "' has no KV on any node yet");
    }
    *node_name = node->name();
    return node->session_blocks(key);
}

Result<std::string> ClusterChatEngine::read_block(const std::string& node, uint64_t key,
                                                  uint64_t limit) {
    if (DecodeNode* d = nodes_->decode_named(node)) return d->read_block(key, limit);
    return not_found("no decode node '" + node + "'");
}

Status ClusterChatEngine::pin_session(const std::string& tenant, const std::string& id,
                                      bool pinned) {
    const std::string key = key_of(tenant, id);
    DecodeNode* node = nullptr;
    {
        std::lock_guard<std::mutex> lock(mu_);
        Session* s = find_locked(key);
        if (s == nullptr) return not_found("no session '" + id + "'");
        node = s->node;
        if (node == nullptr) return not_found("session '" + id + "' has no KV on any node yet");
    }
    const Status st = node->pin_session(key, pinned, tenant);
    if (st.code() == StatusCode::kNotFound)
        return not_found("session '" + id + "' has no KV on " + node->name() +
                         " (neither in decode memory nor stored)");
    if (!st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (Session* s = find_locked(key); s != nullptr && s->pinned != pinned) {
        s->pinned = pinned;
        save(*s);  // a pin outlives a restart
    }
    return Status();
}

ClusterView ClusterChatEngine::cluster() const {
    ClusterView v;
    v.version = deltaserve_version();
    v.model_id = model_id_;
    v.decode = node_stats();
    for (auto* p : nodes_->prefill()) {
        PrefillNodeStats n;
        n.name = p->name();
        n.rpc_address = p->rpc_address();
        n.version = p->version();
        auto s = p->stats();
        if (s.ok()) {
            n.stats = *s;
        } else {
            n.status = s.status();
        }
        v.prefill.push_back(std::move(n));
    }
    return v;
}

Result<SessionInfo> ClusterChatEngine::open_session(const std::string& tenant,
                                                    const std::string& id) {
    std::string name = id.empty() ? random_id("sess_", 16) : id;
    DS_RETURN_IF_ERROR(check_session_id(name, "id"));
    std::vector<std::pair<DecodeNode*, std::string>> dropped;
    Result<SessionInfo> out = internal_error("unset");
    {
        std::lock_guard<std::mutex> lock(mu_);
        const int64_t now = now_seconds();
        const std::string key = key_of(tenant, name);
        if (sessions_.count(key) != 0 || stored_locked(key)) {
            return Status(StatusCode::kAlreadyExists, "the session '" + name + "' is open already");
        }
        // Room for one more: idle sessions go first; running ones are never dropped.
        forget_stale(now, dropped);
        if (Status room = room_for(tenant, /*opening=*/true); !room.ok()) {
            out = room;
        } else if (static_cast<int32_t>(sessions_.size()) >= options_.max_sessions) {
            out = resource_exhausted("the session table is full (" +
                                     std::to_string(options_.max_sessions) +
                                     " sessions, each running a turn); try again later");
        } else {
            Session& s = sessions_[key];
            s.tenant = tenant;
            s.id = name;
            s.last_used = now;
            out = info_of(s, now);
            out->stored = save(s);
        }
    }
    drop(dropped);
    return out;
}

Result<SessionInfo> ClusterChatEngine::session_info(const std::string& tenant,
                                                    const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = key_of(tenant, id);
    auto it = sessions_.find(key);
    if (it != sessions_.end()) return info_of(it->second, now_seconds());
    auto stored = stored_locked(key);
    if (!stored) return not_found("the session '" + id + "' does not exist");
    return info_of(*stored, now_seconds());
}

Status ClusterChatEngine::close_session(const std::string& tenant, const std::string& id) {
    const std::string key = key_of(tenant, id);
    DecodeNode* node = nullptr;
    uint64_t running = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        Session* s = find_locked(key);
        if (s == nullptr) return not_found("the session '" + id + "' does not exist");
        node = s->node;
        running = s->running_turn;
        sessions_.erase(key);
        unsave(key);
    }
    // A running turn ends now; its end finds no session and drops the KV then.
    if (node != nullptr && running != 0) node->cancel(running, Status());
    if (node != nullptr) node->drop_session(key);
    return Status();
}

void ClusterChatEngine::drop(const std::vector<std::pair<DecodeNode*, std::string>>& dropped) {
    for (const auto& [node, key] : dropped) {
        if (node != nullptr) node->drop_session(key);
    }
}

DecodeNode* ClusterChatEngine::least_loaded_decode(const DecodeNode* except) const {
    DecodeNode* best = nullptr;
    int64_t load = std::numeric_limits<int64_t>::max();
    for (auto* d : nodes_->decode()) {
        if (d == except) continue;
        auto st = d->stats();
        if (!st.ok()) continue;  // lost
        const int64_t l = st->running + st->waiting;
        if (l < load) best = d, load = l;
    }
    return best;
}

PrefillNode* ClusterChatEngine::least_loaded_prefill(
    const std::vector<PrefillNode*>& except) const {
    PrefillNode* best = nullptr;
    int64_t load = std::numeric_limits<int64_t>::max();
    for (auto* p : nodes_->prefill()) {
        if (std::find(except.begin(), except.end(), p) != except.end()) continue;
        auto st = p->stats();
        if (!st.ok()) continue;
        if (st->queued < load) best = p, load = st->queued;
    }
    return best;
}

Status ClusterChatEngine::prefill_turn(const decode::TurnSpec& spec, DecodeNode& node,
                                       int32_t pull_tokens) {
    // A continued turn's answer so far is the decode node's to replay, step by step: the
    // prefill node computes the prompt before it.
    decode::TurnSpec prompt = spec;
    prompt.tokens.resize(spec.tokens.size() - static_cast<size_t>(spec.continued));
    prompt.continued = prompt.continued_sent = 0;
    std::vector<PrefillNode*> tried;
    Status last = unavailable("no prefill node is reachable");
    while (PrefillNode* p = least_loaded_prefill(tried)) {
        if (!tried.empty()) {
            ++prefill_retries_;
            spdlog::warn("gateway: turn {}: {}; retrying on another prefill node", spec.turn_id,
                         last.message());
        }
        tried.push_back(p);
        auto r = p->prefill({prompt, node.data_address(), pull_tokens});
        if (r.ok()) return {};
        last = r.status();
        if (last.code() != StatusCode::kUnavailable) break;
    }
    return last;
}

void ClusterChatEngine::forget_stale(int64_t now,
                                     std::vector<std::pair<DecodeNode*, std::string>>& dropped) {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
        const bool stale = it->second.running_turn == 0 && !it->second.pinned &&
                           now - it->second.last_used > options_.session_ttl_seconds;
        if (!stale) {
            ++it;
            continue;
        }
        dropped.emplace_back(it->second.node, it->first);
        unsave(it->first);
        it = sessions_.erase(it);
    }
    make_room_locked(dropped);
}

void ClusterChatEngine::make_room_locked(
    std::vector<std::pair<DecodeNode*, std::string>>& dropped) {
    while (static_cast<int32_t>(sessions_.size()) >= options_.max_sessions) {
        auto oldest = sessions_.end();
        for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
            if (it->second.running_turn != 0 || it->second.pinned) continue;
            if (oldest == sessions_.end() || it->second.last_used < oldest->second.last_used) {
                oldest = it;
            }
        }
        if (oldest == sessions_.end()) break;  // all running or pinned
        // With a record store a session leaves memory only: it is stored.
        if (!options_.records) dropped.emplace_back(oldest->second.node, oldest->first);
        sessions_.erase(oldest);
    }
}

Status ClusterChatEngine::check_expected_turn(Session& s, const ChatRequest& request) const {
    const std::string turns = std::to_string(s.turns);
    if (s.history_lost && request.expected_turn != s.turns) {
        return data_loss("the session '" + s.id +
                         "' was recovered by a repair of its store and may have lost turns: "
                         "it holds " +
                         turns + " turns (" + std::to_string(s.history.size()) +
                         " messages). Send expected_turn " + turns +
                         " to go on from there, or delete it");
    }
    if (request.expected_turn >= 0 && request.expected_turn != s.turns) {
        return aborted("the session '" + s.id + "' holds " + turns + " turns, not the " +
                       std::to_string(request.expected_turn) + " the request expects");
    }
    if (s.history_lost) {  // its client knows this history: it is its own again
        s.history_lost = false;
        save(s);
    }
    return Status();
}

Result<std::vector<int32_t>> ClusterChatEngine::prompt_tokens(const ChatRequest& request) const {
    if (!request.session_id.empty())
        return invalid_argument("a text completion has no session (use chat completions)");
    const model::Tokenizer& tok = *model_.tokenizer;
    if (request.prompt_ids.empty()) {
        // Control tokens written in the prompt are parsed, as vLLM and llama-server do.
        return tok.encode(request.prompt_text, tok.vocab().add_bos, true);
    }
    for (int32_t id : request.prompt_ids) {
        if (id < 0 || id >= model_.config.n_vocab) {
            return invalid_argument("'prompt' holds token id " + std::to_string(id) +
                                    ", outside the vocabulary (" +
                                    std::to_string(model_.config.n_vocab) + " tokens)");
        }
    }
    return request.prompt_ids;
}

Result<TurnResult> ClusterChatEngine::run_turn(const ChatRequest& request,
                                               const TurnCallbacks& callbacks) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool with_tools = request.parse_tool_calls;
    if (with_tools) DS_RETURN_IF_ERROR(check_tools_servable(model_.chat_template));
    ForcedCall forced;
    if (request.force_tool_call) {
        DS_ASSIGN_OR_RETURN(forced, forced_tool_call(model_.chat_template.tool_call_format(),
                                                     request.tools_json, request.forced_tool_name));
    }
    if (callbacks.wanted && !callbacks.wanted()) {  // left while it queued for a thread
        TurnResult gone;
        gone.finish_reason = "cancelled";
        return gone;
    }
    std::vector<model::ChatMessage> conversation;
    DecodeNode* node = nullptr;
    const bool in_session = !request.session_id.empty();
    const std::string key = in_session ? key_of(request.tenant, request.session_id) : "";
    const uint64_t turn_id = random_u64();  // unguessable by other peers of the decode node
    if (in_session) {
        std::lock_guard<std::mutex> lock(mu_);
        Session* s = find_locked(key);
        if (s == nullptr) {
            return not_found("the session '" + request.session_id +
                             "' does not exist (open one with POST /v1/sessions)");
        }
        if (s->running_turn != 0) {
            return failed_precondition("the session '" + request.session_id +
                                       "' has a turn running");
        }
        DS_RETURN_IF_ERROR(check_expected_turn(*s, request));
        DS_RETURN_IF_ERROR(room_for(request.tenant, /*opening=*/false));
        s->running_turn = turn_id;
        conversation = s->history;
        node = s->node;
    }
    // However the turn ends, the session is free for the next one.
    auto release = [&](DecodeNode* on, TurnResult* done) {
        if (!in_session) return;
        bool closed = false, pinned = false;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = sessions_.find(key);
            closed = it == sessions_.end() || it->second.running_turn != turn_id;
            if (!closed) {
                Session& s = it->second;
                pinned = s.pinned;
                s.running_turn = 0;
                s.last_used = now_seconds();
                // A turn cancelled before it said anything leaves the conversation as it
                // was: its client saw no answer, and sends the same messages again (an SDK
                // retrying after its timeout) or none.
                const bool said = done != nullptr && (done->finish_reason != "cancelled" ||
                                                      done->usage.completion_tokens > 0);
                if (done != nullptr) s.node = on;
                if (said) {
                    s.history = conversation;
                    s.history.push_back(assistant_message(done->text, done->tool_calls));
                    ++s.turns;
                    s.tokens = done->usage.prompt_tokens + done->usage.completion_tokens;
                    s.cached_tokens = done->usage.cached_tokens;
                    done->session_turn = s.turns;
                    done->session_stored = save(s);  // before its client hears the end
                }
            }
        }
        if (closed && on != nullptr) on->drop_session(key);  // closed while it ran
        // A pinned session's KV stays where its turn left it (its node may have restarted
        // since, or it moved).
        if (!closed && pinned && on != nullptr) {
            if (Status st = on->pin_session(key, true, request.tenant); !st.ok())
                spdlog::warn("gateway: session {}'s pin on {}: {}", key, on->name(),
                             st.to_string());
        }
    };
    conversation.insert(conversation.end(), request.messages.begin(), request.messages.end());
    const model::Tokenizer& tok = *model_.tokenizer;
    decode::TurnSpec spec;
    model::ChatRenderOptions render;
    render.kwargs_json = request.chat_template_kwargs;
    render.tools_json = request.tools_json;
    auto tokens = request.raw_prompt
                      ? prompt_tokens(request)
                      : model::encode_chat(tok, model_.chat_template, conversation, render);
    if (!tokens.ok() || tokens->empty()) {
        release(nullptr, nullptr);
        return tokens.ok() ? invalid_argument("the conversation renders to no tokens")
                           : tokens.status();
    }
    spec.tokens = std::move(*tokens);
    spec.turn_id = turn_id;
    spec.session_id = key;
    spec.sampling = request.sampling;
    spec.max_tokens = request.max_tokens;
    spec.stop = request.stop;
    spec.logprobs = request.top_logprobs;
    spec.prompt_logprobs = request.prompt_logprobs;
    spec.cache_scope = request.tenant;  // tenants never meet in the prefix cache
    if (with_tools) spec.shown_tokens = tool_tokens_;
    spec.json_schema = request.json_schema;
    if (request.force_tool_call) {
        spec.json_schema = std::move(forced.schema);
        spec.json_prefix = std::move(forced.prefix);
        spec.json_suffix = std::move(forced.suffix);
    }
    // A session's home that takes no new turn (it drains, or left the cluster) is not used:
    // another node recomputes the history.
    if (node != nullptr && !nodes_->routable(node)) node = nullptr;
    if (node == nullptr) node = least_loaded_decode(nullptr);
    if (node == nullptr) {
        release(nullptr, nullptr);
        return unavailable("no decode node is reachable");
    }
    TurnResult result;
    ToolAnswer answer(
        with_tools ? model_.chat_template.tool_call_format() : model::ToolCallFormat::kNone,
        request.parallel_tool_calls, callbacks);
    bool first = true;
    bool cancelled = false;
    const auto cancel = [&] {
        cancelled = true;
        node->cancel(spec.turn_id, Status());
    };
    TokenTexts texts(*model_.tokenizer, spec.tokens.back());
    TokenTexts prompt_texts(*model_.tokenizer, spec.tokens.front());
    // The prompt's log-probabilities come first: one for each token after the first.
    size_t prompt_left = 0;
    if (spec.prompt_logprobs >= 0) {
        prompt_left = spec.tokens.size() - 1;
        result.prompt_logprobs.push_back(TokenTexts::unscored(*model_.tokenizer, spec.tokens[0]));
    }
    // A decode node lost mid-answer (kUnavailable): the turn goes on on another from its
    // prompt and the tokens its client has (TurnSpec::continued), at most max_turn_moves
    // times. generated: the answer's tokens the nodes reported; sent: their text's bytes.
    const size_t prompt_size = spec.tokens.size();
    std::vector<int32_t> generated;
    int32_t sent = 0;
    int32_t moves = 0;
    // The most tokens an answer can have: max_tokens, or the largest context (ctx_size).
    const int32_t budget = spec.max_tokens >= 0 ? spec.max_tokens : int32_t{1} << 20;
    Status bad_node;  // what the decode node should not have sent
    Result<decode::TurnEnd> ended = unavailable("the turn did not start");
    for (;;) {
        auto sink = std::make_shared<QueueSink>();
        auto planned = node->start_turn(spec, sink);
        if (!planned.ok() && (planned.status().code() == StatusCode::kUnavailable ||
                              planned.status().code() == StatusCode::kResourceExhausted)) {
            // The session's node is lost (its KV with it), or its KV memory is full: another
            // node recomputes the history.
            if (DecodeNode* other = least_loaded_decode(node)) {
                node = other;
                planned = node->start_turn(spec, sink);
            }
        }
        if (!planned.ok()) {
            release(node, nullptr);
            return planned.status();
        }
        const decode::TurnPlan plan = *planned;
        if (plan.remote_prefill) {
            // This thread waits on the prefill node; the watch asks the caller meanwhile, and
            // a turn no longer wanted ends on the decode node and leaves the prefill node's
            // queue (or stops after its chunk there).
            const uint64_t id = spec.turn_id;
            watch_->add(id, &callbacks.wanted, [this, node, id] {
                node->cancel(id, Status());
                for (auto* p : nodes_->prefill()) p->cancel(id);
            });
            Status st = prefill_turn(spec, *node, plan.pull_tokens);
            cancelled = watch_->remove(id) || cancelled;
            if (!st.ok() && !cancelled) node->cancel(id, st);
        }
        // This node's generated tokens' log-probabilities, counted from the answer's start: a
        // moved turn's again for the tokens the lost node had held back are not passed twice.
        size_t scored = generated.size();
        QueueSink::Item item;
        for (;;) {
            const auto next =
                sink->next(std::chrono::milliseconds(TurnCallbacks::kWantedPollMs), item);
            if (next == QueueSink::Next::kEnded) break;
            if (next == QueueSink::Next::kNothingYet) {
                if (!cancelled && callbacks.wanted && !callbacks.wanted()) cancel();
                continue;
            }
            if (std::holds_alternative<QueueSink::PromptDone>(item)) {
                if (!cancelled && callbacks.on_prompt_done) callbacks.on_prompt_done();
                continue;
            }
            if (const auto* token = std::get_if<QueueSink::Token>(&item)) {
                if (token->id < 0 || token->id >= model_.config.n_vocab ||
                    static_cast<int32_t>(generated.size()) >= budget) {
                    bad_node = unavailable("the decode node reported tokens it cannot have made");
                    cancel();
                    continue;
                }
                generated.push_back(token->id);
                continue;
            }
            if (const auto* lp = std::get_if<model::TokenLogprobs>(&item)) {
                if (cancelled) continue;
                const bool of_prompt = prompt_left > 0;
                const size_t at = prompt_size - prompt_left;  // the prompt token it scores
                Status st = of_prompt
                                ? check_prompt_logprobs(*lp, spec.tokens[at], spec.prompt_logprobs,
                                                        model_.config.n_vocab)
                            : spec.logprobs < 0
                                ? unavailable("the decode node sent logprobs no one asked for")
                                : model::check_token_logprobs(*lp, model_.config.n_vocab);
                if (!st.ok()) {
                    bad_node = st;
                    cancel();
                    continue;
                }
                if (of_prompt) {
                    --prompt_left;
                    result.prompt_logprobs.push_back(prompt_texts.entry(*lp));
                    continue;
                }
                LogprobEntry entry = texts.entry(*lp);
                if (scored++ < result.logprobs.size()) continue;
                if (callbacks.on_logprobs) callbacks.on_logprobs(entry);
                result.logprobs.push_back(std::move(entry));
                continue;
            }
            const std::string& piece = std::get<std::string>(item);
            if (first) {
                result.ttft_seconds =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                first = false;
            }
            sent += static_cast<int32_t>(piece.size());
            if (!cancelled && !answer.feed(piece)) cancel();
        }
        ended = sink->end();
        if (bad_node.ok() && ended.ok() && prompt_left > 0 && !cancelled)
            bad_node = unavailable("the decode node left prompt tokens unscored");
        if (!bad_node.ok()) ended = bad_node.with_context("decode node " + node->name());
        const bool lost = !ended.ok() && ended.status().code() == StatusCode::kUnavailable &&
                          bad_node.ok() && !cancelled && prompt_left == 0 &&
                          static_cast<int32_t>(generated.size()) < budget;
        DecodeNode* next =
            lost && moves < options_.max_turn_moves ? least_loaded_decode(node) : nullptr;
        if (next == nullptr) break;
        ++moves;
        turn_moves_.fetch_add(1);
        spdlog::warn(
            "gateway: decode node {} was lost {} tokens into a turn ({}); it goes on on {}",
            node->name(), generated.size(), ended.status().message(), next->name());
        spec.tokens.resize(prompt_size);
        spec.tokens.insert(spec.tokens.end(), generated.begin(), generated.end());
        spec.continued = static_cast<int32_t>(generated.size());
        spec.continued_sent = sent;
        spec.prompt_logprobs = -1;
        spec.turn_id = random_u64();  // a new KV stream
        node = next;
    }
    if (!ended.ok()) {
        release(node, nullptr);
        return ended.status();
    }
    decode::TurnEnd& end = *ended;
    if (first) {
        result.ttft_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (!cancelled && !answer.finish()) cancelled = true;  // the turn has ended already
    result.text = with_tools ? answer.content() : std::move(end.text);
    result.tool_calls = answer.calls();
    result.finish_reason = cancelled ? "cancelled" : end.finish_reason;
    if (!result.tool_calls.empty() && result.finish_reason == "stop")
        result.finish_reason = "tool_calls";
    // A moved turn's prompt there held the answer so far: the client's prompt is the first.
    result.usage.prompt_tokens = std::max(0, end.prompt_tokens - spec.continued);
    result.usage.cached_tokens = std::min(end.cached_tokens, result.usage.prompt_tokens);
    result.usage.kv_source = end.kv_source;
    result.usage.completion_tokens = end.completion_tokens;
    result.turn_moves = moves;
    release(node, &result);
    return result;
}

}  // namespace deltaserve::api
