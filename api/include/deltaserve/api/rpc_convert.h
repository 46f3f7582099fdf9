// Between deltaserve's types and cluster.capnp's.
#pragma once

#include <kj/exception.h>

#include "cluster.capnp.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/model/token_logprobs.h"
#include "deltaserve/prefill/prefill_worker.h"

namespace deltaserve::api::rpc {

inline void to_capnp(const Status& s, Error::Builder e) {
    e.setCode(static_cast<uint8_t>(s.code()));
    e.setMessage(s.message());
}
// A code no deltaserve Status has (a peer that is newer, or hostile) is kInternal; OK is not
// an error either.
inline Status from_capnp(Error::Reader e) {
    const uint8_t code = e.getCode();
    const bool known = code > static_cast<uint8_t>(StatusCode::kOk) &&
                       code <= static_cast<uint8_t>(StatusCode::kAborted);
    return Status(known ? static_cast<StatusCode>(code) : StatusCode::kInternal,
                  e.getMessage().cStr());
}
// A call that failed in Cap'n Proto itself (the peer is gone, or broke the protocol).
inline Status from_exception(const kj::Exception& e, const std::string& peer) {
    return unavailable("the " + peer + " is unreachable: " + e.getDescription().cStr());
}

inline void to_capnp(const decode::TurnSpec& s, TurnSpec::Builder b) {
    b.setTurnId(s.turn_id);
    b.setSessionId(s.session_id);
    auto tokens = b.initTokens(static_cast<unsigned>(s.tokens.size()));
    for (unsigned i = 0; i < s.tokens.size(); ++i) tokens.set(i, s.tokens[i]);
    auto m = b.initSampling();
    m.setTemperature(s.sampling.temperature);
    m.setTopK(s.sampling.top_k);
    m.setTopP(s.sampling.top_p);
    m.setMinP(s.sampling.min_p);
    m.setRepeatPenalty(s.sampling.repeat_penalty);
    m.setRepeatLastN(s.sampling.repeat_last_n);
    m.setSeed(s.sampling.seed);
    m.setPresencePenalty(s.sampling.presence_penalty);
    m.setFrequencyPenalty(s.sampling.frequency_penalty);
    b.setMaxTokens(s.max_tokens);
    auto stop = b.initStop(static_cast<unsigned>(s.stop.size()));
    for (unsigned i = 0; i < s.stop.size(); ++i) stop.set(i, s.stop[i]);
    b.setCacheScope(s.cache_scope);
    auto shown = b.initShownTokens(static_cast<unsigned>(s.shown_tokens.size()));
    for (unsigned i = 0; i < s.shown_tokens.size(); ++i) shown.set(i, s.shown_tokens[i]);
    b.setJsonSchema(s.json_schema);
    b.setJsonPrefix(s.json_prefix);
    b.setJsonSuffix(s.json_suffix);
    b.setLogprobs(s.logprobs);
    b.setPromptLogprobs(s.prompt_logprobs);
    b.setContinued(s.continued);
    b.setContinuedSent(s.continued_sent);
}
inline decode::TurnSpec from_capnp(TurnSpec::Reader r) {
    decode::TurnSpec s;
    s.turn_id = r.getTurnId();
    s.session_id = r.getSessionId();
    for (int32_t t : r.getTokens()) s.tokens.push_back(t);
    auto m = r.getSampling();
    s.sampling.temperature = m.getTemperature();
    s.sampling.top_k = m.getTopK();
    s.sampling.top_p = m.getTopP();
    s.sampling.min_p = m.getMinP();
    s.sampling.repeat_penalty = m.getRepeatPenalty();
    s.sampling.repeat_last_n = m.getRepeatLastN();
    s.sampling.seed = m.getSeed();
    s.sampling.presence_penalty = m.getPresencePenalty();
    s.sampling.frequency_penalty = m.getFrequencyPenalty();
    s.max_tokens = r.getMaxTokens();
    for (auto t : r.getStop()) s.stop.emplace_back(t.cStr());
    s.cache_scope = r.getCacheScope();
    for (int32_t t : r.getShownTokens()) s.shown_tokens.push_back(t);
    s.json_schema = r.getJsonSchema();
    s.json_prefix = r.getJsonPrefix();
    s.json_suffix = r.getJsonSuffix();
    s.logprobs = r.getLogprobs();
    s.prompt_logprobs = r.getPromptLogprobs();
    s.continued = r.getContinued();
    s.continued_sent = r.getContinuedSent();
    return s;
}

// Log-probabilities as a peer sent them: at most model::kMaxTopLogprobs top tokens are read;
// the receiver checks the ids and values (model::check_token_logprobs).
inline void to_capnp(const model::TokenLogprobs& lp, TokenLogprobs::Builder b) {
    b.initChosen().setToken(lp.chosen.token);
    b.getChosen().setLogprob(lp.chosen.logprob);
    auto top = b.initTop(static_cast<unsigned>(lp.top.size()));
    for (unsigned i = 0; i < lp.top.size(); ++i) {
        top[i].setToken(lp.top[i].token);
        top[i].setLogprob(lp.top[i].logprob);
    }
    b.setRank(lp.rank);
}
inline model::TokenLogprobs from_capnp(TokenLogprobs::Reader r) {
    model::TokenLogprobs lp;
    lp.chosen = {r.getChosen().getToken(), r.getChosen().getLogprob()};
    for (auto e : r.getTop()) {
        if (lp.top.size() == static_cast<size_t>(model::kMaxTopLogprobs)) break;
        lp.top.push_back({e.getToken(), e.getLogprob()});
    }
    lp.rank = r.getRank();
    return lp;
}

inline void to_capnp(const Result<decode::TurnEnd>& end, TurnEnd::Builder b) {
    if (!end.ok()) return to_capnp(end.status(), b.initError());
    auto d = b.initDone();
    d.setFinishReason(end->finish_reason);
    d.setText(end->text);
    d.setPromptTokens(end->prompt_tokens);
    d.setCachedTokens(end->cached_tokens);
    d.setCompletionTokens(end->completion_tokens);
    d.setKvSource(end->kv_source);
}
inline Result<decode::TurnEnd> from_capnp(TurnEnd::Reader r) {
    if (r.isError()) return from_capnp(r.getError());
    auto d = r.getDone();
    decode::TurnEnd e;
    e.finish_reason = d.getFinishReason();
    e.text = d.getText();
    e.prompt_tokens = d.getPromptTokens();
    e.cached_tokens = d.getCachedTokens();
    e.completion_tokens = d.getCompletionTokens();
    // A peer's word, shown to clients: one of the known names, else none.
    const std::string_view source = d.getKvSource().cStr();
    for (std::string_view known : {"decode", "host", "disk", "prefix"}) {
        if (source == known) e.kv_source = std::string(known);
    }
    return e;
}

// Each struct both ways, so that a field added to one side is added in one place.
inline void to_capnp(const decode::LatencyHistogram& h, Histogram::Builder b) {
    auto counts = b.initCounts(static_cast<unsigned>(h.counts.size()));
    for (unsigned i = 0; i < counts.size(); ++i) counts.set(i, h.counts[i]);
    b.setSum(h.sum);
    b.setCount(h.count);
}
inline decode::LatencyHistogram from_capnp(Histogram::Reader r) {
    decode::LatencyHistogram h;
    // A peer's word: another bucket count, or counts that do not add up, is no histogram.
    const auto counts = r.getCounts();
    if (counts.size() != h.counts.size()) return h;
    int64_t total = 0;
    for (unsigned i = 0; i < counts.size(); ++i) {
        if (counts[i] < 0) return decode::LatencyHistogram();
        h.counts[i] = counts[i];
        total += counts[i];
    }
    if (total != r.getCount()) return decode::LatencyHistogram();
    h.sum = r.getSum();
    h.count = r.getCount();
    return h;
}

inline void to_capnp(const decode::TierStats& t, TierStats::Builder b) {
    b.setHostBytes(t.host_bytes);
    b.setHostCapacity(t.host_capacity);
    b.setHostBlocks(t.host_blocks);
    b.setHostLeases(t.host_leases);
    b.setDiskBytes(t.disk_bytes);
    b.setDiskCapacity(t.disk_capacity);
    b.setDiskBlocks(t.disk_blocks);
    b.setDiskAdmitting(t.disk_admitting);
    b.setDiskDropped(t.disk_dropped);
    b.setDiskIoErrors(t.disk_io_errors);
    b.setDiskRecoveryMs(t.disk_recovery_ms);
    b.setSessionsDemoted(t.sessions_demoted);
    b.setPromotedHost(t.promoted_host);
    b.setPromotedDisk(t.promoted_disk);
    b.setPromotedTokens(t.promoted_tokens);
    b.setPrefixHost(t.prefix_host);
    b.setPrefixDisk(t.prefix_disk);
    b.setPrefixTokens(t.prefix_tokens);
    b.setBlocksMissing(t.blocks_missing);
    b.setBlocksRefused(t.blocks_refused);
    b.setSessionsPersisted(t.sessions_persisted);
    b.setPersistFailed(t.persist_failed);
    b.setBlocksWritten(t.blocks_written);
    b.setBytesWritten(t.bytes_written);
    to_capnp(t.store_seconds, b.initStoreSeconds());
    to_capnp(t.load_seconds, b.initLoadSeconds());
    b.setDeviceBytes(t.device_bytes);
    b.setDeviceCapacity(t.device_capacity);
    b.setDeviceBlocks(t.device_blocks);
    b.setPromotedDevice(t.promoted_device);
    b.setPrefixDevice(t.prefix_device);
}
inline decode::TierStats from_capnp(TierStats::Reader r) {
    decode::TierStats t;
    t.host_bytes = r.getHostBytes();
    t.host_capacity = r.getHostCapacity();
    t.host_blocks = r.getHostBlocks();
    t.host_leases = r.getHostLeases();
    t.disk_bytes = r.getDiskBytes();
    t.disk_capacity = r.getDiskCapacity();
    t.disk_blocks = r.getDiskBlocks();
    t.disk_admitting = r.getDiskAdmitting();
    t.disk_dropped = r.getDiskDropped();
    t.disk_io_errors = r.getDiskIoErrors();
    t.disk_recovery_ms = r.getDiskRecoveryMs();
    t.sessions_demoted = r.getSessionsDemoted();
    t.promoted_host = r.getPromotedHost();
    t.promoted_disk = r.getPromotedDisk();
    t.promoted_tokens = r.getPromotedTokens();
    t.prefix_host = r.getPrefixHost();
    t.prefix_disk = r.getPrefixDisk();
    t.prefix_tokens = r.getPrefixTokens();
    t.blocks_missing = r.getBlocksMissing();
    t.blocks_refused = r.getBlocksRefused();
    t.sessions_persisted = r.getSessionsPersisted();
    t.persist_failed = r.getPersistFailed();
    t.blocks_written = r.getBlocksWritten();
    t.bytes_written = r.getBytesWritten();
    t.store_seconds = from_capnp(r.getStoreSeconds());
    t.load_seconds = from_capnp(r.getLoadSeconds());
    t.device_bytes = r.getDeviceBytes();
    t.device_capacity = r.getDeviceCapacity();
    t.device_blocks = r.getDeviceBlocks();
    t.promoted_device = r.getPromotedDevice();
    t.prefix_device = r.getPrefixDevice();
    return t;
}

inline void to_capnp(const decode::DecodeStats& s, DecodeStats::Builder b) {
    b.setSessions(s.sessions);
    b.setRunning(s.running);
    b.setWaiting(s.waiting);
    b.setKvBytes(s.kv_bytes);
    b.setKeepRatio(s.keep_ratio);
    b.setKvBytesReceived(s.kv_bytes_received);
    b.setTurns(s.turns);
    b.setPrefixCacheBytes(s.prefix_cache_bytes);
    b.setPrefixCacheBlocks(s.prefix_cache_blocks);
    b.setPrefixCacheHitTokens(s.prefix_cache_hit_tokens);
    b.setKvMemory(s.kv_memory);
    b.setKvBooked(s.kv_booked);
    b.setKvPoolUsed(s.kv_pool_used);
    b.setKvPoolPeak(s.kv_pool_peak);
    to_capnp(s.tiers, b.initTiers());
}
inline decode::DecodeStats from_capnp(DecodeStats::Reader r) {
    decode::DecodeStats s;
    s.sessions = r.getSessions();
    s.running = r.getRunning();
    s.waiting = r.getWaiting();
    s.kv_bytes = r.getKvBytes();
    s.keep_ratio = r.getKeepRatio();
    s.kv_bytes_received = r.getKvBytesReceived();
    s.turns = r.getTurns();
    s.prefix_cache_bytes = r.getPrefixCacheBytes();
    s.prefix_cache_blocks = r.getPrefixCacheBlocks();
    s.prefix_cache_hit_tokens = r.getPrefixCacheHitTokens();
    s.kv_memory = r.getKvMemory();
    s.kv_booked = r.getKvBooked();
    s.kv_pool_used = r.getKvPoolUsed();
    s.kv_pool_peak = r.getKvPoolPeak();
    s.tiers = from_capnp(r.getTiers());
    return s;
}

inline void to_capnp(const decode::SessionKv& k, SessionKv::Builder b) {
    b.setId(k.id);
    b.setRunning(k.running);
    b.setTokens(k.tokens);
    b.setDecodeBytes(k.decode_bytes);
    b.setKeepRatio(k.keep_ratio);
    b.setPolicy(k.policy);
    b.setStoredTokens(k.stored_tokens);
    b.setHostBytes(k.host_bytes);
    b.setDiskBytes(k.disk_bytes);
    b.setBlocks(k.blocks);
    b.setPinned(k.pinned);
    b.setDeviceBytes(k.device_bytes);
}
inline decode::SessionKv from_capnp(SessionKv::Reader r) {
    decode::SessionKv k;
    k.id = r.getId().cStr();
    k.running = r.getRunning();
    k.tokens = r.getTokens();
    k.decode_bytes = r.getDecodeBytes();
    k.keep_ratio = r.getKeepRatio();
    k.policy = r.getPolicy().cStr();
    k.stored_tokens = r.getStoredTokens();
    k.host_bytes = r.getHostBytes();
    k.disk_bytes = r.getDiskBytes();
    k.blocks = r.getBlocks();
    k.pinned = r.getPinned();
    k.device_bytes = r.getDeviceBytes();
    return k;
}

inline void to_capnp(const decode::SessionBlocks& s, SessionBlocks::Builder b) {
    b.setRecord(kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.record.data()), s.record.size()));
    b.setFingerprint(s.fingerprint);
    auto list = b.initBlocks(static_cast<unsigned>(s.blocks.size()));
    for (unsigned i = 0; i < s.blocks.size(); ++i) {
        const decode::StoredBlockPlace& p = s.blocks[i];
        list[i].setKey(p.key);
        list[i].setHostBytes(p.host_bytes);
        list[i].setDiskBytes(p.disk_bytes);
        list[i].setDeviceBytes(p.device_bytes);
        auto leases = list[i].initLeases(static_cast<unsigned>(p.leases.size()));
        for (unsigned j = 0; j < p.leases.size(); ++j) {
            leases[j].setOwner(p.leases[j].owner);
            leases[j].setSecondsLeft(p.leases[j].seconds_left);
        }
    }
}
inline decode::SessionBlocks from_capnp(SessionBlocks::Reader r) {
    decode::SessionBlocks s;
    const auto record = r.getRecord();
    s.record.assign(reinterpret_cast<const char*>(record.begin()), record.size());
    s.fingerprint = r.getFingerprint();
    for (auto p : r.getBlocks()) {
        decode::StoredBlockPlace b;
        b.key = p.getKey();
        b.host_bytes = p.getHostBytes();
        b.disk_bytes = p.getDiskBytes();
        b.device_bytes = p.getDeviceBytes();
        for (auto l : p.getLeases()) b.leases.push_back({l.getOwner().cStr(), l.getSecondsLeft()});
        s.blocks.push_back(std::move(b));
    }
    return s;
}

inline void to_capnp(const prefill::PrefillStats& s, PrefillStats::Builder b) {
    b.setQueued(s.queued);
    b.setRequests(s.requests);
    b.setFailures(s.failures);
    b.setTokens(s.tokens);
    b.setBytesShipped(s.bytes_shipped);
}
inline prefill::PrefillStats from_capnp(PrefillStats::Reader r) {
    prefill::PrefillStats s;
    s.queued = r.getQueued();
    s.requests = r.getRequests();
    s.failures = r.getFailures();
    s.tokens = r.getTokens();
    s.bytes_shipped = r.getBytesShipped();
    return s;
}

inline void to_capnp(const prefill::PrefillResult& p, PrefillResult::Builder b) {
    b.setFirstToken(p.first_token);
    b.setPulledTokens(p.pulled_tokens);
    b.setPrefilledTokens(p.prefilled_tokens);
    b.setBytesShipped(p.bytes_shipped);
    b.setSeconds(p.seconds);
}
inline prefill::PrefillResult from_capnp(PrefillResult::Reader r) {
    prefill::PrefillResult p;
    p.first_token = r.getFirstToken();
    p.pulled_tokens = r.getPulledTokens();
    p.prefilled_tokens = r.getPrefilledTokens();
    p.bytes_shipped = r.getBytesShipped();
    p.seconds = r.getSeconds();
    return p;
}

}  // namespace deltaserve::api::rpc
