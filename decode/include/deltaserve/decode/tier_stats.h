// What the tiered store did on a decode node (DecodeStats::tiers), summed over nodes by the
// gateway and shown at /metrics: each tier's use, promotions and demotions, what was missing
// or refused, what was stored, and how long loads and stores took.
#pragma once

#include <array>
#include <cstdint>

namespace deltaserve::decode {

// Seconds in Prometheus's cumulative form: counts[i] holds what took at most kBounds[i] (the
// last, anything longer), not yet cumulated.
struct LatencyHistogram {
    static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                       0.1,   0.25,   0.5,   1.0,  2.5,   10.0};
    std::array<int64_t, kBounds.size() + 1> counts{};
    double sum = 0.0;
    int64_t count = 0;

    void add(double seconds) {
        size_t i = 0;
        while (i < kBounds.size() && seconds > kBounds[i]) ++i;
        ++counts[i];
        sum += seconds;
        ++count;
    }
    LatencyHistogram& operator+=(const LatencyHistogram& o) {
        for (size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
        sum += o.sum;
        count += o.count;
        return *this;
    }
};

struct TierStats {
    // The device tier (DecodeOptions::device_tier), above the host tier.
    int64_t device_bytes = 0, device_capacity = 0, device_blocks = 0;
    // The host tier (DecodeOptions::host_tier; shared by whatever else uses it).
    int64_t host_bytes = 0, host_capacity = 0, host_blocks = 0, host_leases = 0;
    // The disk tier (DecodeOptions::disk_tier): whether it admits new blocks (an I/O error
    // stops it), blocks dropped as bad, I/O errors, the time its index took to open.
    int64_t disk_bytes = 0, disk_capacity = 0, disk_blocks = 0;
    bool disk_admitting = true;
    int64_t disk_dropped = 0, disk_io_errors = 0;
    double disk_recovery_ms = 0.0;
    // Sessions dropped from decode memory into the tiers and brought back (by the lowest
    // tier a block came from), and the tokens they brought back.
    int64_t sessions_demoted = 0, promoted_device = 0, promoted_host = 0, promoted_disk = 0,
            promoted_tokens = 0;
    // Prefixes a turn without KV of its own took from the tiers (full KV), and their tokens.
    int64_t prefix_device = 0, prefix_host = 0, prefix_disk = 0, prefix_tokens = 0;
    // Stored blocks found gone when wanted, or refused by their checks (then recomputed).
    int64_t blocks_missing = 0, blocks_refused = 0;
    // Session turns stored as they ended (write-through), stores that failed, and the blocks
    // and bytes written to disk (only what changed).
    int64_t sessions_persisted = 0, persist_failed = 0, blocks_written = 0, bytes_written = 0;
    LatencyHistogram store_seconds;  // a turn's end stored (export, host and disk writes)
    LatencyHistogram load_seconds;   // stored blocks taken back into a context

    int64_t sessions_promoted() const { return promoted_device + promoted_host + promoted_disk; }

    // Sums another node's.
    TierStats& operator+=(const TierStats& o) {
        device_bytes += o.device_bytes;
        device_capacity += o.device_capacity;
        device_blocks += o.device_blocks;
        host_bytes += o.host_bytes;
        host_capacity += o.host_capacity;
        host_blocks += o.host_blocks;
        host_leases += o.host_leases;
        disk_bytes += o.disk_bytes;
        disk_capacity += o.disk_capacity;
        disk_blocks += o.disk_blocks;
        disk_admitting = disk_admitting && o.disk_admitting;
        disk_dropped += o.disk_dropped;
        disk_io_errors += o.disk_io_errors;
        disk_recovery_ms =
            disk_recovery_ms > o.disk_recovery_ms ? disk_recovery_ms : o.disk_recovery_ms;
        sessions_demoted += o.sessions_demoted;
        promoted_device += o.promoted_device;
        promoted_host += o.promoted_host;
        promoted_disk += o.promoted_disk;
        promoted_tokens += o.promoted_tokens;
        prefix_device += o.prefix_device;
        prefix_host += o.prefix_host;
        prefix_disk += o.prefix_disk;
        prefix_tokens += o.prefix_tokens;
        blocks_missing += o.blocks_missing;
        blocks_refused += o.blocks_refused;
        sessions_persisted += o.sessions_persisted;
        persist_failed += o.persist_failed;
        blocks_written += o.blocks_written;
        bytes_written += o.bytes_written;
        store_seconds += o.store_seconds;
        load_seconds += o.load_seconds;
        return *this;
    }
};

}  // namespace deltaserve::decode
