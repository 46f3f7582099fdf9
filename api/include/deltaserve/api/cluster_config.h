// A cluster's configuration (`deltaserve gateway|prefill|decode --config cluster.yaml`): the
// model and KV settings every node shares, the gateway's address, and the static list of
// prefill and decode nodes with their RPC (control) and data (KV) addresses. deploy/ has an
// example. DELTASERVE_<KEY> environment variables override the file's top-level keys (e.g.
// DELTASERVE_MODEL, DELTASERVE_THREADS, DELTASERVE_GATEWAY_PORT, DELTASERVE_TRANSPORT_TLS);
// the commands' flags override both. Paths are taken as written (a relative one is relative
// to where the command runs, as on the command line).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::api {

struct NodeEntry {
    std::string name;
    std::string rpc;   // host:port of its Cap'n Proto service
    std::string data;  // decode nodes: host:port where prefill nodes ship KV (UCX)
};

struct ClusterConfig {
    std::string model;
    std::string tokenizer;
    int32_t threads = 0;  // per worker; 0 = one per hardware thread
    int32_t ctx_size = 0;
    int32_t batch_size = 512;
    std::string kv_policy = "full";
    float kv_keep = 1.0f;
    std::string kv_profile;
    std::string transport_tls;  // UCX_TLS of the data plane; "" = UCX's own choice
    // UCX_RNDV_SCHEME of the data plane; "" = UCX's own choice. On one host KV goes through
    // the transport's shared pool whatever it is; get_zcopy is not safe there when a node
    // dies (transport/README.md).
    std::string transport_rndv_scheme;
    std::string gateway_host = "127.0.0.1";
    int32_t gateway_port = 8000;
    std::string
        gateway_rpc;  // host:port of the gateway's Cap'n Proto chat and admin service; "" = none
    int32_t local_prefill_max = 512;
    int32_t max_batch = 32;
    int32_t prefill_chunk = 128;  // a decode node's prompt tokens per pass (0 = batch_size)
    int32_t max_sessions = 64;
    int32_t session_ttl = 3600;  // seconds
    // The gateway's record store: sessions kept, in all and per key, and the bytes of their
    // conversations (ClusterEngineOptions; "max_stored_bytes: 2GiB").
    int32_t max_stored_sessions = 10000, max_stored_sessions_per_tenant = 10000;
    uint64_t max_stored_bytes = uint64_t{1} << 30, max_stored_bytes_per_tenant = uint64_t{1} << 30;
    int32_t prefix_cache_mib = 1024;  // a decode node's prefix cache (0 = off)
    // A decode node's KV memory in bytes ("kv_memory: 4GiB"; decode::DecodeOptions::kv_memory);
    // 0 = a quarter of the node's physical memory.
    uint64_t kv_memory = 0;
    // The tiered store (as serve's flags): where each decode node keeps its disk tier and the
    // gateway its session records, each in DIR/<node name> (DIR/gateway); "" = the per-user
    // data folder (~/.local/share/deltaserve), "none" = memory only. kv_host_memory: a decode
    // node's host tier in bytes (-1 = an eighth of physical memory, 0 = off); kv_disk: its
    // disk tier's cap (0 = half the free space, at most 64 GiB).
    std::string data_dir;
    int64_t kv_host_memory = -1;
    uint64_t kv_disk = 0;
    // Where nodes run the model ("cpu", "cuda"; "" = cuda when a node finds a GPU, else the
    // CPU), and a decode node's device tier above its host tier, in that GPU's memory (bytes;
    // 0 = off, the default; refused on the CPU).
    std::string device;
    uint64_t kv_device_memory = 0;
    // The attention's arithmetic (serve's --attention): "native", or "ggml" (llama.cpp's
    // dot-product order, as its logits round).
    std::string attention = "native";
    // Access (api/access.h): the gateway's API keys and admin keys, comma-separated
    // (DELTASERVE_API_KEY, DELTASERVE_ADMIN_KEY); "" = none (then loopback only, unless
    // insecure). cluster_token: the secret nodes and gateways prove to each other on RPC and
    // the KV data plane (DELTASERVE_CLUSTER_TOKEN); "" = none (loopback only, unless insecure).
    std::string api_key;
    std::string admin_key;
    std::string cluster_token;
    bool insecure = false;
    // The gateway's HTTP rules (GatewayOptions): Host names and browser origins it answers
    // besides its own, comma-separated ("" = none), and how long a chat request waits for a
    // turn thread (ms).
    std::string allowed_hosts, allowed_origins;
    int32_t queue_timeout_ms = 30'000;
    std::string log_level = "warn";
    // Membership on etcd (membership.h): its endpoints ("etcd: [host:2379, ...]", or
    // DELTASERVE_ETCD="a:2379,b:2379"); empty = the static lists below alone. etcd_user /
    // etcd_password: etcd's authentication (DELTASERVE_ETCD_PASSWORD); etcd_prefix: the
    // cluster's keys (one etcd can hold several clusters); member_ttl: seconds a member's
    // lease lives without its keep-alives (a dead node is dropped within it).
    std::vector<std::string> etcd;
    std::string etcd_user, etcd_password;
    std::string etcd_prefix = "/deltaserve/default/";
    int32_t member_ttl = 10;
    // A stopped (SIGTERM) node registered in etcd drains: it is marked draining, takes no new
    // turn and leaves once its running turns end, or after this many seconds.
    int32_t drain_seconds = 25;
    // A turn whose decode node is lost mid-answer goes on on another, at most this many times
    // (0 = it ends with the node's error).
    int32_t turn_moves = 2;
    std::vector<NodeEntry> prefill;
    std::vector<NodeEntry> decode;

    // The node of that name (either list), or nullptr.
    const NodeEntry* find(const std::string& name) const;
};

// Reads a YAML file, then the environment's overrides. Errors: kNotFound (no file),
// kInvalidArgument naming the key that is malformed, unknown, missing or out of range (a
// config without etcd needs a decode node).
Result<ClusterConfig> load_cluster_config(const std::string& path);
// The overrides alone (for tests): DELTASERVE_<UPPER_KEY> for every scalar key.
Status apply_env_overrides(ClusterConfig& config);

}  // namespace deltaserve::api
