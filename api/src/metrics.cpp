#include "metrics.h"

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>

namespace deltaserve::api {

namespace {

// The process's resident bytes (/proc/self/statm), -1 where unknown.
double resident_bytes() {
    long pages = -1, resident = -1;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
        std::fclose(f);
    }
    return resident < 0
               ? -1
               : static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// File descriptors open (/proc/self/fd, less the one reading it), -1 where unknown.
double open_fds() {
    DIR* d = opendir("/proc/self/fd");
    if (d == nullptr) return -1;
    int n = 0;
    while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;
}

// Bytes malloc has handed out and not taken back (its arenas' blocks in use and its mmapped
// blocks): what the process allocated, where the resident set also counts what the allocator
// keeps for later.
double heap_bytes() {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<double>(m.uordblks + m.hblkhd);
}

}  // namespace

void Metrics::request_done(const TurnResult& t, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_;
    prompt_tokens_ += t.usage.prompt_tokens;
    cached_tokens_ += t.usage.cached_tokens;
    if (t.usage.cached_tokens > 0 && !t.usage.kv_source.empty())
        cached_by_source_[t.usage.kv_source] += t.usage.cached_tokens;
    generated_ += t.usage.completion_tokens;
    ttft_sum_ += t.ttft_seconds;
    duration_sum_ += seconds;
    if (t.usage.completion_tokens > 1) {  // the gaps between tokens after the first
        itl_sum_ += seconds - t.ttft_seconds;
        itl_count_ += t.usage.completion_tokens - 1;
    }
}

void Metrics::choice_done(const TurnResult& t) {
    std::lock_guard<std::mutex> lock(mu_);
    prompt_tokens_ += t.usage.prompt_tokens;
    cached_tokens_ += t.usage.cached_tokens;
    if (t.usage.cached_tokens > 0 && !t.usage.kv_source.empty())
        cached_by_source_[t.usage.kv_source] += t.usage.cached_tokens;
    generated_ += t.usage.completion_tokens;
}

void Metrics::request_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    ++failed_;
}

std::string Metrics::render(const EngineStats& e) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    char line[256];
    // Built as strings: a help text of any length is never cut.
    auto number = [](double v) {
        char b[32];
        std::snprintf(b, sizeof b, "%.9g", v);
        return std::string(b);
    };
    auto metric = [&](const char* name, const char* type, const char* help, double value) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
               name + " " + number(value) + "\n";
    };
    auto summary = [&](const char* name, const char* help, double sum, int64_t count) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " summary\n" +
               name + "_sum " + number(sum) + "\n" + name + "_count " + std::to_string(count) +
               "\n";
    };
    metric("deltaserve_requests_total", "counter", "Chat completions answered.",
           static_cast<double>(requests_));
    metric("deltaserve_requests_failed_total", "counter",
           "Chat completions that ended in an error.", static_cast<double>(failed_));
    metric("deltaserve_prompt_tokens_total", "counter", "Prompt tokens of answered requests.",
           static_cast<double>(prompt_tokens_));
    metric("deltaserve_prompt_tokens_cached_total", "counter",
           "Prompt tokens whose KV was held (a session's, or the prefix cache's).",
           static_cast<double>(cached_tokens_));
    // One series per source, each there from the start (a rate over a missing series is
    // empty, not zero).
    out +=
        "# HELP deltaserve_cached_tokens_total Cached prompt tokens by where their KV came "
        "from: the session's in decode memory, the host or disk tier, the prefix cache.\n"
        "# TYPE deltaserve_cached_tokens_total counter\n";
    for (const char* source : {"decode", "host", "disk", "prefix"}) {
        auto it = cached_by_source_.find(source);
        std::snprintf(line, sizeof line, "deltaserve_cached_tokens_total{source=\"%s\"} %lld\n",
                      source,
                      static_cast<long long>(it == cached_by_source_.end() ? 0 : it->second));
        out += line;
    }
    metric("deltaserve_generation_tokens_total", "counter", "Tokens generated.",
           static_cast<double>(generated_));
    summary("deltaserve_time_to_first_token_seconds", "Request start to the first token.",
            ttft_sum_, requests_);
    summary("deltaserve_inter_token_latency_seconds", "Time between generated tokens.", itl_sum_,
            itl_count_);
    summary("deltaserve_request_duration_seconds", "Request start to its last token.",
            duration_sum_, requests_);
    metric("deltaserve_http_connections", "gauge", "HTTP connections open.",
           static_cast<double>(connections_.load()));
    metric("deltaserve_http_connections_refused_total", "counter",
           "HTTP connections refused at the connection limit.",
           static_cast<double>(refused_.load()));
    metric("deltaserve_http_timeouts_total", "counter",
           "HTTP connections dropped for missing a read or write deadline.",
           static_cast<double>(timeouts_.load()));
    metric("deltaserve_sessions", "gauge", "Chat sessions remembered.",
           static_cast<double>(e.sessions));
    metric("deltaserve_queue_length", "gauge", "Turns waiting for the model.",
           static_cast<double>(e.queued));
    metric("deltaserve_kv_bytes", "gauge", "Bytes the KV cache holds.",
           static_cast<double>(e.kv_bytes));
    metric("deltaserve_kv_sessions", "gauge", "Sessions whose KV the decode workers hold.",
           static_cast<double>(e.kv_sessions));
    metric("deltaserve_kv_memory_bytes", "gauge", "The decode workers' KV memory (--kv-memory).",
           static_cast<double>(e.kv_memory));
    metric("deltaserve_kv_booked_bytes", "gauge",
           "KV memory booked by running turns (the most their KV can grow to).",
           static_cast<double>(e.kv_booked));
    metric("deltaserve_kv_pool_used_bytes", "gauge",
           "Bytes of the full-KV block pools in use (a shared block counts once).",
           static_cast<double>(e.kv_pool_used));
    metric("deltaserve_prefix_cache_bytes", "gauge",
           "Bytes of KV blocks kept for later prompts that start the same way.",
           static_cast<double>(e.prefix_cache_bytes));
    metric("deltaserve_kv_bytes_shipped_total", "counter",
           "KV bytes prefill workers shipped to decode workers (headers included).",
           static_cast<double>(e.kv_bytes_shipped));
    metric("deltaserve_prefill_tokens_total", "counter",
           "Prompt tokens prefill workers computed, counted when a prefill ends well.",
           static_cast<double>(e.prefill_tokens));
    metric("deltaserve_prefill_retries_total", "counter",
           "Prefills tried again on another prefill node after one was lost.",
           static_cast<double>(e.prefill_retries));
    metric("deltaserve_turn_moves_total", "counter",
           "Turns that went on on another decode node after theirs was lost mid-answer.",
           static_cast<double>(e.turn_moves));
    const decode::TierStats& t = e.tiers;
    metric("deltaserve_device_tier_bytes", "gauge",
           "Bytes of stored KV blocks in the device tier (--kv-device-memory).",
           static_cast<double>(t.device_bytes));
    metric("deltaserve_device_tier_capacity_bytes", "gauge", "The device tier's capacity.",
           static_cast<double>(t.device_capacity));
    metric("deltaserve_device_tier_blocks", "gauge", "Stored KV blocks in the device tier.",
           static_cast<double>(t.device_blocks));
    metric("deltaserve_host_tier_bytes", "gauge",
           "Bytes of stored KV blocks in the host tier (--kv-host-memory).",
           static_cast<double>(t.host_bytes));
    metric("deltaserve_host_tier_capacity_bytes", "gauge", "The host tier's capacity.",
           static_cast<double>(t.host_capacity));
    metric("deltaserve_host_tier_blocks", "gauge", "Stored KV blocks in the host tier.",
           static_cast<double>(t.host_blocks));
    metric("deltaserve_host_tier_leases", "gauge",
           "Leases on host tier blocks (held by turns taking them back).",
           static_cast<double>(t.host_leases));
    metric("deltaserve_disk_tier_bytes", "gauge",
           "Bytes of stored KV blocks in the disk tier (--data-dir).",
           static_cast<double>(t.disk_bytes));
    metric("deltaserve_disk_tier_capacity_bytes", "gauge", "The disk tier's cap (--kv-disk).",
           static_cast<double>(t.disk_capacity));
    metric("deltaserve_disk_tier_blocks", "gauge", "Stored KV blocks in the disk tier.",
           static_cast<double>(t.disk_blocks));
    metric("deltaserve_disk_tier_admitting", "gauge",
           "1 while the disk tier takes new blocks; 0 after an I/O error (ENOSPC, EIO) stopped it.",
           t.disk_admitting ? 1.0 : 0.0);
    metric("deltaserve_disk_tier_io_errors_total", "counter",
           "I/O errors of the disk tier (the first stops its admission).",
           static_cast<double>(t.disk_io_errors));
    metric("deltaserve_disk_tier_dropped_total", "counter",
           "Disk tier blocks dropped because a reader found them bad.",
           static_cast<double>(t.disk_dropped));
    metric("deltaserve_disk_tier_recovery_seconds", "gauge",
           "Time the disk tier's index took to open at start (recovery).",
           t.disk_recovery_ms / 1000.0);
    metric("deltaserve_sessions_recovered", "gauge",
           "Sessions the gateway read back from its records at start.",
           static_cast<double>(e.sessions_recovered));
    metric("deltaserve_sessions_demoted_total", "counter",
           "Idle sessions dropped from KV memory into the tiers.",
           static_cast<double>(t.sessions_demoted));
    const auto by_tier = [&](const std::string& name, const char* help, int64_t device,
                             int64_t host, int64_t disk) {
        out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name +
               "{tier=\"device\"} " + std::to_string(device) + "\n" + name + "{tier=\"host\"} " +
               std::to_string(host) + "\n" + name + "{tier=\"disk\"} " + std::to_string(disk) +
               "\n";
    };
    by_tier("deltaserve_sessions_promoted_total",
            "Sessions whose stored KV came back for a turn, by the lowest tier it came from.",
            t.promoted_device, t.promoted_host, t.promoted_disk);
    by_tier("deltaserve_prefixes_loaded_total",
            "Turns that started from a stored prefix (full KV), by the lowest tier it came from.",
            t.prefix_device, t.prefix_host, t.prefix_disk);
    metric("deltaserve_promoted_tokens_total", "counter",
           "Tokens of history sessions took back from the tiers instead of prefilling them.",
           static_cast<double>(t.promoted_tokens));
    metric("deltaserve_tier_blocks_missing_total", "counter",
           "Stored blocks a returning session found evicted from the tiers (recomputed).",
           static_cast<double>(t.blocks_missing));
    metric("deltaserve_tier_blocks_refused_total", "counter",
           "Stored blocks or records that failed their checks (checksum, fingerprint, key, "
           "format): dropped, recomputed.",
           static_cast<double>(t.blocks_refused));
    metric("deltaserve_sessions_persisted_total", "counter",
           "Session turns whose KV was stored (host and disk tiers) as they ended.",
           static_cast<double>(t.sessions_persisted));
    metric("deltaserve_sessions_persist_failed_total", "counter",
           "Session turns whose KV could not be stored (the session recomputes after a restart).",
           static_cast<double>(t.persist_failed));
    metric("deltaserve_tier_bytes_written_total", "counter",
           "Bytes of KV blocks written to the disk tier (only blocks that changed).",
           static_cast<double>(t.bytes_written));
    const auto histogram = [&](const char* name, const char* help,
                               const decode::LatencyHistogram& h) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
        int64_t cumulative = 0;
        for (size_t i = 0; i < h.counts.size(); ++i) {
            cumulative += h.counts[i];
            if (i < h.kBounds.size()) {
                std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %lld\n", name, h.kBounds[i],
                              static_cast<long long>(cumulative));
            } else {
                std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %lld\n", name,
                              static_cast<long long>(cumulative));
            }
            out += line;
        }
        std::snprintf(line, sizeof line, "%s_sum %.9g\n%s_count %lld\n", name, h.sum, name,
                      static_cast<long long>(h.count));
        out += line;
    };
    histogram("deltaserve_tier_store_seconds",
              "A session turn's end stored in the tiers (export, host and disk writes).",
              t.store_seconds);
    histogram("deltaserve_tier_load_seconds", "Stored KV blocks taken back into a context.",
              t.load_seconds);
    metric("deltaserve_kv_keep_ratio", "gauge",
           "KV bytes held over the same tokens in fp16 full KV.", e.keep_ratio);
    metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
           resident_bytes());
    metric("process_open_fds", "gauge", "Number of open file descriptors.", open_fds());
    metric("deltaserve_heap_bytes", "gauge",
           "Bytes allocated and not freed (malloc's blocks in use, mmapped ones included).",
           heap_bytes());
    return out;
}

}  // namespace deltaserve::api
