// The JSON of etcd's v3 gateway: the request bodies deltaserve sends and the parsers of what
// comes back (fuzzed: tests/fuzz/etcd_answer_fuzzer.cpp). Keys and values travel in base64,
// 64-bit integers as decimal strings; a field etcd leaves out is its zero value.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/api/etcd_client.h"

namespace deltaserve::api::etcd {

// The range_end that makes [prefix, range_end) every key starting with prefix ("\0": all).
std::string prefix_end(std::string_view prefix);

std::string range_request(std::string_view key, std::string_view range_end);
std::string put_request(std::string_view key, std::string_view value, int64_t lease);
std::string delete_request(std::string_view key, std::string_view range_end);
// A transaction: if the key's mod_revision is `expected`, put `value` (or delete the key when
// `put` is false); else read it.
std::string swap_request(std::string_view key, int64_t expected, bool put, std::string_view value,
                         int64_t lease);
std::string watch_request(std::string_view key, std::string_view range_end, int64_t start_revision);
std::string grant_request(int64_t ttl_seconds);
std::string lease_request(int64_t lease, bool with_keys = false);
std::string authenticate_request(std::string_view user, std::string_view password);

// The error of an answer that is not a success: etcd's {"error", "message", "code"} with its
// gRPC code mapped to ours, or unavailable for bytes that are not etcd's.
Status error_of(unsigned http_status, std::string_view body);
// Whether `s` is the refusal of an expired or unknown token (authenticate again).
bool is_token_refused(const Status& s);

Result<EtcdRange> parse_range(std::string_view body);
Result<int64_t> parse_revision(std::string_view body);  // the header's
Result<int64_t> parse_deleted(std::string_view body);
Result<EtcdSwap> parse_swap(std::string_view body);
Result<int64_t> parse_lease_id(std::string_view body);
// A keep-alive's answer (one streamed {"result": ...}): the TTL; not_found when it is gone.
Result<int64_t> parse_keep_alive(std::string_view body);
// timetolive: seconds left; not_found when it is gone.
Result<int64_t> parse_time_left(std::string_view body);
Result<std::string> parse_token(std::string_view body);

// One message of a watch's stream.
struct WatchMessage {
    bool created = false;
    bool canceled = false;
    int64_t compact_revision = 0;  // canceled because the store compacted past the start
    int64_t revision = 0;          // the header's
    std::string cancel_reason;
    std::vector<EtcdEvent> events;
};
Result<WatchMessage> parse_watch_message(std::string_view line);

}  // namespace deltaserve::api::etcd
