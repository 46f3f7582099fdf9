// deltaserve serve: the embedded mode (DESIGN.md "Processes"). The OpenAI-compatible gateway,
// a prefill worker and a decode worker in one process, over the in-process transport;
// listening on 127.0.0.1:8000 unless told otherwise; stops on SIGINT or SIGTERM.
#include <cstdio>
#include <filesystem>
#include <limits>

#include <unistd.h>

#include "access_flags.h"
#include "commands.h"
#include "data_dir.h"
#include "deltaserve/api/cluster_chat_engine.h"
#include "deltaserve/common/byte_size.h"
#include "deltaserve/kvstore/host_tier.h"
#include "deltaserve/transport/transport_factory.h"
#include "gateway_loop.h"
#include "run_options.h"
#include "stop_signals.h"

namespace deltaserve::cli {

int serve_main(int argc, char** argv) {
    RunOptions o;
    std::string host = "127.0.0.1";
    int32_t port = 8000, max_tokens = -1, rpc_port = -1;
    api::ClusterEngineOptions eo;
    decode::DecodeOptions dopt;
    // One process, one set of cores: every prompt is prefilled in the decode worker's steps,
    // beside the turns generating, unless --local-prefill-max sends longer ones to the
    // prefill worker (whose own threads would compete with the decode worker's).
    dopt.local_prefill_max = -1;
    int32_t ttl = static_cast<int32_t>(eo.session_ttl_seconds);
    int32_t kv_sessions = 0;
    api::GatewayOptions go;
    int32_t max_connections = go.max_connections;
    int32_t prefix_cache_mib = static_cast<int32_t>(dopt.prefix_cache_bytes >> 20);
    int32_t drain_seconds = static_cast<int32_t>(go.drain_timeout_ms / 1000);
    int32_t queue_timeout_ms = static_cast<int32_t>(go.queue_timeout_ms);
    std::string kv_memory, kv_host_memory, kv_device_memory, kv_disk = "0",
                                                             kv_disk_reserve = "64MiB";
    std::string data_dir = default_data_dir();
    ArgParser p("deltaserve serve",
                "Serves --model over an OpenAI-compatible HTTP API (POST /v1/chat/completions, "
                "/v1/completions, /tokenize, /detokenize; GET /v1/models, /health, /metrics), with "
                "a prefill and a decode worker in this process. "
                "Sampling flags are the defaults for requests that leave a field out. A session "
                "(X-Session-ID header or session_id field) keeps its history and its KV between "
                "turns: send only the new messages.");
    o.register_flags(p);
    AccessFlags access;
    access.register_flags(p);
    p.add("host", &host, "address to listen on");
    p.add("port", &port, "port to listen on; 0 = any free port (printed at start)");
    p.add("rpc-port", &rpc_port,
          "port of the Cap'n Proto chat and admin service (api/schema/chat.capnp) on --host; "
          "0 = any free port (printed at start), -1 = none");
    p.add("max-tokens", &max_tokens,
          "tokens per answer when a request gives no max_tokens; -1 = no limit");
    p.add("max-sessions", &eo.max_sessions,
          "sessions remembered at most (least recently used go first)");
    p.add("session-ttl", &ttl, "seconds an idle session is remembered");
    uint64_t max_stored = static_cast<uint64_t>(eo.max_stored_sessions);
    uint64_t max_stored_tenant = static_cast<uint64_t>(eo.max_stored_sessions_per_tenant);
    std::string max_stored_bytes = "1GiB", max_stored_bytes_tenant = "1GiB";
    p.add("max-stored-sessions", &max_stored,
          "sessions kept in --data-dir at most; opening one more is 429 too_many_sessions "
          "(default 10000)");
    p.add("max-stored-sessions-per-tenant", &max_stored_tenant, "... per API key (default 10000)");
    p.add("max-stored-bytes", &max_stored_bytes,
          "bytes of stored conversations (the sessions' records) at most; a turn beyond is "
          "429");
    p.add("max-stored-bytes-per-tenant", &max_stored_bytes_tenant, "... per API key");
    p.add("kv-block-tokens", &dopt.tier_block_tokens,
          "tokens per stored KV block in the host and disk tiers (a prefix is found in the "
          "tiers by whole blocks)");
    p.add("kv-sessions", &kv_sessions,
          "idle sessions whose KV stays in --kv-memory (beyond, the least recently used go to "
          "the host and disk tiers); default: --max-sessions");
    p.add("max-batch", &dopt.max_batch, "turns the decode worker runs per forward pass");
    p.add("prefill-chunk", &dopt.prefill_chunk,
          "prompt tokens the decode worker prefills per forward pass beside the turns "
          "generating (the step's token budget: a prompt stalls their next token by one such "
          "chunk at most; with none generating a pass takes up to --batch-size); 0 = "
          "--batch-size");
    p.add("local-prefill-max", &dopt.local_prefill_max,
          "uncached prompt tokens the decode worker prefills itself; longer prompts go to the "
          "prefill worker; -1 = every prompt (its threads would compete with the decode "
          "worker's)");
    p.add("kv-memory", &kv_memory,
          "KV memory for sessions, running turns and the prefix cache, e.g. 4GiB; a turn is "
          "booked the most its KV can grow to (prompt and max_tokens) and gets 429 when "
          "running turns have booked it all; default: a quarter of physical memory (full KV "
          "on a GPU: half the GPU's free memory)");
    p.add("kv-host-memory", &kv_host_memory,
          "host memory for the KV of idle sessions dropped from --kv-memory (the tiered "
          "store's host tier): a session's next turn takes it back instead of prefilling its "
          "history again; e.g. 8GiB, 0 = off; default: an eighth of physical memory");
    p.add("kv-device-memory", &kv_device_memory,
          "GPU memory for stored KV blocks above the host tier (the tiered store's device "
          "tier), on --device's GPU: a session's next turn looks there first; e.g. 2GiB; "
          "default 0 = off");
    p.add("data-dir", &data_dir,
          "where sessions are kept across restarts: the tiered store's disk tier (every "
          "session's KV, written at the end of each turn) and the sessions' records; one "
          "server per directory; none = memory only. Default: $XDG_DATA_HOME/deltaserve, else "
          "~/.local/share/deltaserve");
    p.add("kv-disk", &kv_disk,
          "bytes of --data-dir the stored KV may use, e.g. 20GiB (least recently written "
          "blocks go first); 0 = half the free space, at most 64GiB");
    p.add("kv-disk-reserve", &kv_disk_reserve,
          "free space kept on --data-dir's disk: below it no KV block is stored (the service "
          "goes on from memory; /health says the store is degraded) and session records use "
          "the reserve's last half; storing resumes when space returns");
    p.add("prefix-cache-mib", &prefix_cache_mib,
          "MiB of KV blocks kept for later prompts that start the same way (a conversation "
          "sent whole again, a shared system prompt; full KV only); 0 = off");
    p.add("max-connections", &max_connections,
          "HTTP connections open at once; more get 503 and are closed");
    p.add_list("allowed-host", &go.allowed_hosts,
               "a Host header value the HTTP API answers besides the loopback names (NAME: any "
               "port, NAME:PORT, * any); repeatable or comma-separated. Without --api-key only "
               "loopback names are answered (against DNS rebinding); given, Host is checked with "
               "a key too");
    p.add_list("allowed-origin", &go.allowed_origins,
               "a browser origin (scheme://host[:port], * any) whose cross-origin requests the "
               "HTTP API serves (CORS); repeatable or comma-separated; requests from other "
               "origins get 403");
    p.add("queue-timeout-ms", &queue_timeout_ms,
          "milliseconds a chat request waits for a turn thread when every one is taken; then "
          "503 with Retry-After");
    p.add("drain-timeout", &drain_seconds,
          "seconds running turns get to finish on SIGTERM / SIGINT before they are ended "
          "(finish_reason \"shutdown\")");
    if (auto exit_code = parse_flags(p, argc, argv)) return *exit_code;
    // Before any thread starts (the host tier's janitor is one): a thread that does not block
    // them would take SIGTERM's default action and end the process uncleanly.
    const sigset_t stop_signals = block_stop_signals();
    if (port < 0 || port > 65535 || rpc_port < -1 || rpc_port > 65535 || eo.max_sessions < 1 ||
        ttl < 1 || dopt.max_batch < 1 || dopt.local_prefill_max < -1 || max_connections < 1 ||
        queue_timeout_ms < 1 || drain_seconds < 0 || prefix_cache_mib < 0 ||
        dopt.prefill_chunk < 0 || kv_sessions < 0 || dopt.tier_block_tokens < 1) {
        print_error(invalid_argument(
            "--port must be in [0, 65535], --rpc-port in [-1, 65535], "
            "--max-sessions, --session-ttl, --max-batch, --max-connections and "
            "--queue-timeout-ms >= 1, --local-prefill-max, --drain-timeout, --prefix-cache-mib, "
            "--kv-sessions and --prefill-chunk >= 0, --kv-block-tokens >= 1"));
        return 2;
    }
    {
        auto total = parse_byte_size(max_stored_bytes);
        auto tenant = parse_byte_size(max_stored_bytes_tenant);
        if (!total || !tenant || *total == 0 || *tenant == 0 || max_stored == 0 ||
            max_stored_tenant == 0 || max_stored > INT64_MAX || max_stored_tenant > INT64_MAX) {
            print_error(invalid_argument(
                "--max-stored-sessions(-per-tenant) and --max-stored-bytes(-per-tenant) must be "
                "above 0 (bytes as 512MiB, 2GiB, ...)"));
            return 2;
        }
        eo.max_stored_sessions = static_cast<int64_t>(max_stored);
        eo.max_stored_sessions_per_tenant = static_cast<int64_t>(max_stored_tenant);
        eo.max_stored_bytes = static_cast<int64_t>(*total);
        eo.max_stored_bytes_per_tenant = static_cast<int64_t>(*tenant);
    }
    if (!kv_memory.empty()) {
        auto bytes = parse_byte_size(kv_memory);
        if (bytes && *bytes == 0) bytes = invalid_argument("a KV memory of 0 bytes holds nothing");
        if (!bytes) {
            print_error(bytes.status().with_context("--kv-memory"));
            return 2;
        }
        dopt.kv_memory = *bytes;
    }
    uint64_t host_bytes = default_host_tier_bytes();
    if (!kv_host_memory.empty()) {
        auto bytes = parse_byte_size(kv_host_memory);
        if (!bytes) {
            print_error(bytes.status().with_context("--kv-host-memory"));
            return 2;
        }
        host_bytes = *bytes;
    }
    uint64_t device_bytes = 0;
    if (!kv_device_memory.empty()) {
        auto bytes = parse_byte_size(kv_device_memory);
        if (!bytes) {
            print_error(bytes.status().with_context("--kv-device-memory"));
            return 2;
        }
        device_bytes = *bytes;
    }
    uint64_t disk_bytes = 0;
    {
        auto bytes = parse_byte_size(kv_disk);
        if (!bytes) {
            print_error(bytes.status().with_context("--kv-disk"));
            return 2;
        }
        disk_bytes = *bytes;
    }
    uint64_t disk_reserve = 0;
    {
        auto bytes = parse_byte_size(kv_disk_reserve);
        if (!bytes) {
            print_error(bytes.status().with_context("--kv-disk-reserve"));
            return 2;
        }
        disk_reserve = *bytes;
    }
    if (data_dir.empty()) {
        print_error(invalid_argument(
            "--data-dir: no default (neither XDG_DATA_HOME nor HOME is set); give one, or none"));
        return 2;
    }
    if (host_bytes > 0) {
        kvstore::HostTier::Options ho;
        ho.capacity_bytes = host_bytes;
        dopt.host_tier = std::make_shared<kvstore::HostTier>(ho);
    }
    eo.session_ttl_seconds = ttl;
    auto access_options = access.resolve(p);
    if (!access_options) {
        print_error(access_options.error());
        return 2;
    }
    go.access = *access_options;
    if (Status st = api::check_bind(host, go.access); !st.ok()) {
        print_error(st);
        return 2;
    }
    if (device_bytes > 0) {  // made before the model loads: a flag that cannot work fails at once
        auto tier = o.device_tier(device_bytes);
        if (!tier) {
            print_error(tier.error().with_context("--kv-device-memory"));
            return 2;
        }
        dopt.device_tier = std::move(*tier);
    }

    auto model = load_model_for_run(o);
    if (!model) {
        print_error(model.error());
        return 1;
    }
    const std::string model_id = std::filesystem::path(o.model_path).filename().string();
    if (data_dir != "none") {
        auto disk = open_data_dir(data_dir, disk_bytes, disk_reserve);
        auto identity = disk ? store_identity(o.model_path, o.tokenizer_path, o.context())
                             : Result<std::string>(disk.status());
        if (!identity) {
            print_error(identity.error());
            return 1;
        }
        const auto st = (*disk)->stats();
        std::fprintf(stderr, "deltaserve: data dir %s: %llu stored KV blocks (%s) in %.1f ms\n",
                     data_dir.c_str(), static_cast<unsigned long long>(st.blocks),
                     format_byte_size(st.bytes).c_str(), st.recovery_ms);
        dopt.disk_tier = *disk;
        dopt.store_id = *identity;
        dopt.checkpoint_root = data_dir;  // its records are in the decode worker's store
        eo.records = *disk;
    }
    auto transport = transport::make_transport("inproc", {});
    if (!transport) {
        print_error(transport.error());
        return 1;
    }
    // One pool for the process: the decode worker's steps and the prefill worker's chunks take
    // turns on it instead of two pools' threads contending for the same cores.
    auto threads = std::make_shared<ThreadPool>(o.threads);
    dopt.context = o.context();
    dopt.context.threads = threads;
    dopt.threads = o.threads;
    dopt.max_sessions = kv_sessions > 0 ? std::min(kv_sessions, eo.max_sessions) : eo.max_sessions;
    dopt.session_ttl_ms = static_cast<int64_t>(ttl) * 1000;
    dopt.prefix_cache_bytes = static_cast<size_t>(prefix_cache_mib) << 20;
    if (dopt.local_prefill_max < 0) dopt.local_prefill_max = std::numeric_limits<int32_t>::max();
    dopt.model_id = model_id;
    auto decode = decode::DecodeWorker::create(**model, dopt);
    prefill::PrefillOptions popt;
    popt.context = o.context();
    popt.context.threads = threads;
    popt.model_id = model_id;
    auto prefill = decode ? prefill::PrefillWorker::create(**model, popt, **transport)
                          : Result<std::unique_ptr<prefill::PrefillWorker>>(decode.status());
    auto address = prefill ? (*decode)->listen(**transport, "decode-0")
                           : Result<std::string>(prefill.status());
    if (!address) {
        print_error(address.error());
        return 1;
    }
    auto decode_node = api::local_decode_node("decode-0", **decode, *address);
    auto prefill_node = api::local_prefill_node("prefill-0", **prefill);
    api::ClusterChatEngine engine(**model, model_id, {decode_node.get()}, {prefill_node.get()}, eo);
    if (eo.records) {
        std::fprintf(stderr, "deltaserve: %lld sessions recovered in %.1f ms\n",
                     static_cast<long long>(engine.sessions_recovered()), engine.recovery_ms());
    }
    go.max_connections = max_connections;
    go.drain_timeout_ms = static_cast<int64_t>(drain_seconds) * 1000;
    go.queue_timeout_ms = queue_timeout_ms;
    go.host = host;
    go.port = static_cast<uint16_t>(port);
    go.sampling = o.sampling(p);
    go.default_max_tokens = max_tokens;
    return serve_gateway(engine, go, rpc_port >= 0 ? host + ":" + std::to_string(rpc_port) : "", "",
                         stop_signals);
}

}  // namespace deltaserve::cli
