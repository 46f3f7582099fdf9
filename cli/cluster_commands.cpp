// deltaserve gateway|prefill|decode --config cluster.yaml: one role per process (DESIGN.md
// "Processes"). Control plane: Cap'n Proto RPC (api/rpc_server.h, rpc_client.h); data plane:
// UCX (KV streams from prefill to decode nodes).
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>

#include "access_flags.h"
#include "cluster_membership.h"
#include "commands.h"
#include "data_dir.h"
#include "deltaserve/api/cluster_chat_engine.h"
#include "deltaserve/api/cluster_config.h"
#include "deltaserve/api/member_nodes.h"
#include "deltaserve/api/rpc_client.h"
#include "deltaserve/api/rpc_server.h"
#include "deltaserve/kvstore/host_tier.h"
#include "deltaserve/transport/transport_factory.h"
#include "gateway_loop.h"
#include "run_options.h"
#include "stop_signals.h"

namespace deltaserve::cli {

namespace {

struct RoleFlags {
    std::string config, name, model, rpc, data, ready_file;
    int32_t threads = -1, port = -1;
};

// Parses the role's flags and reads the config (flags override it). nullopt: exit with code.
std::optional<int> load(const char* command, const char* summary, int argc, char** argv,
                        RoleFlags& f, api::ClusterConfig& c, bool named) {
    ArgParser p(command, summary);
    p.add("config", &f.config, "the cluster config (YAML; deploy/cluster.yaml is an example)");
    if (!named) p.add("name", &f.name, "with etcd: this gateway's member name");
    if (named) {
        p.add("name", &f.name,
              "this node's name (in the config's node list, or any new name with etcd)");
        p.add("rpc", &f.rpc, "host:port of its RPC service (overrides the config's entry)");
        p.add("data", &f.data, "decode: host:port where it takes KV (overrides the config's)");
        p.add("ready-file", &f.ready_file,
              "a file written once the node serves (and is registered in etcd), removed when it "
              "drains or stops: a readiness probe's");
    }
    p.add("model", &f.model, "overrides the config's model");
    p.add("threads", &f.threads, "overrides the config's threads");
    if (!named) p.add("port", &f.port, "overrides the config's gateway port (0 = any free port)");
    if (auto exit_code = parse_flags(p, argc, argv)) return exit_code;
    if (f.config.empty() || (named && f.name.empty())) {
        print_error(
            invalid_argument(named ? "--config and --name are required" : "--config is required"));
        return 2;
    }
    auto cfg = api::load_cluster_config(f.config);
    if (!cfg) {
        print_error(cfg.error());
        return 2;
    }
    c = std::move(*cfg);
    if (!f.model.empty()) c.model = f.model;
    if (f.threads >= 0) c.threads = f.threads;
    if (f.port >= 0) c.gateway_port = f.port;
    if (named && c.find(f.name) == nullptr && (c.etcd.empty() || f.rpc.empty())) {
        print_error(invalid_argument(
            f.config + " has no node named " + f.name +
            (c.etcd.empty() ? "" : " (a node that joins through etcd needs --rpc)")));
        return 2;
    }
    return std::nullopt;
}

// The node's entry: the config's, with the flags' addresses over it, or the flags' alone for
// a node that joins through etcd.
std::optional<api::NodeEntry> node_entry(const api::ClusterConfig& c, const RoleFlags& f,
                                         bool decode_role) {
    api::NodeEntry me;
    if (const api::NodeEntry* listed = c.find(f.name)) me = *listed;
    me.name = f.name;
    if (!f.rpc.empty()) me.rpc = f.rpc;
    if (!f.data.empty()) me.data = f.data;
    if (decode_role && me.data.empty()) {
        print_error(invalid_argument("decode node " + f.name + " needs a data address (--data)"));
        return std::nullopt;
    }
    return me;
}

// A gateway's member name when none is given: gateway-<host name>-<HTTP port>, in the
// names' alphabet.
std::string gateway_name(uint16_t port) {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    std::string name = "gateway-";
    for (const char* h = host; *h != '\0' && name.size() < 48; ++h) {
        const char ch = *h;
        name += std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' ? ch : '_';
    }
    return name + "-" + std::to_string(port);
}

RunOptions run_options(const api::ClusterConfig& c) {
    RunOptions o;
    o.model_path = c.model;
    o.tokenizer_path = c.tokenizer;
    o.threads = c.threads;
    o.ctx_size = c.ctx_size;
    o.batch_size = c.batch_size;
    o.kv_policy = c.kv_policy;
    o.kv_keep = c.kv_keep;
    o.kv_profile = c.kv_profile;
    o.log_level = c.log_level;
    o.device = c.device;
    o.attention = c.attention;
    return o;
}

// Where a node (or the gateway) keeps its store: data_dir/<name>; "" for none.
std::string node_data_dir(const api::ClusterConfig& c, const std::string& name) {
    if (c.data_dir == "none") return "";
    const std::string root = c.data_dir.empty() ? default_data_dir() : c.data_dir;
    return root.empty() ? "" : (std::filesystem::path(root) / name).string();
}

std::string model_id(const api::ClusterConfig& c) {
    return std::filesystem::path(c.model).filename().string();
}

// A prefill or decode node: its worker, its RPC service, until a stop signal.
int node_main(bool decode_role, int argc, char** argv) {
    RoleFlags f;
    api::ClusterConfig c;
    const char* command = decode_role ? "deltaserve decode" : "deltaserve prefill";
    if (auto code =
            load(command,
                 decode_role ? "Runs a decode node of the cluster: it takes KV from prefill "
                               "nodes and generates, batching every session's turn."
                             : "Runs a prefill node of the cluster: it computes prompts' KV "
                               "and ships it to decode nodes.",
                 argc, argv, f, c, true)) {
        return *code;
    }
    const std::optional<api::NodeEntry> entry = node_entry(c, f, decode_role);
    if (!entry) return 2;
    const api::NodeEntry& me = *entry;
    for (const std::string& address : {me.rpc, me.data}) {
        if (address.empty()) continue;
        if (Status st = api::check_cluster_bind(address, c.cluster_token, c.insecure); !st.ok()) {
            print_error(st);
            return 2;
        }
    }
    const sigset_t stop_signals = block_stop_signals();
    const RunOptions o = run_options(c);
    auto model = load_model_for_run(o);
    if (!model) {
        print_error(model.error());
        return 1;
    }
    transport::TransportOptions to;
    to.ucx_tls = c.transport_tls;
    to.ucx_rndv_scheme = c.transport_rndv_scheme;
    auto transport = transport::make_transport("ucx", to);
    if (!transport) {
        print_error(transport.error());
        return 1;
    }
    api::NodeRoles roles;
    roles.name = me.name;
    roles.model_id = model_id(c);
    std::unique_ptr<decode::DecodeWorker> decode;
    std::unique_ptr<prefill::PrefillWorker> prefill;
    if (decode_role) {
        decode::DecodeOptions d;
        d.context = o.context();
        d.threads = c.threads;
        d.max_batch = c.max_batch;
        d.prefill_chunk = c.prefill_chunk;
        d.max_sessions = c.max_sessions;
        d.session_ttl_ms = static_cast<int64_t>(c.session_ttl) * 1000;
        d.local_prefill_max = c.local_prefill_max;
        d.prefix_cache_bytes = static_cast<size_t>(c.prefix_cache_mib) << 20;
        d.kv_memory = c.kv_memory;
        d.model_id = roles.model_id;
        d.cluster_token = c.cluster_token;
        const uint64_t host = c.kv_host_memory < 0 ? default_host_tier_bytes()
                                                   : static_cast<uint64_t>(c.kv_host_memory);
        if (host > 0) {
            kvstore::HostTier::Options ho;
            ho.capacity_bytes = host;
            d.host_tier = std::make_shared<kvstore::HostTier>(ho);
        }
        if (c.kv_device_memory > 0) {
            auto tier = o.device_tier(c.kv_device_memory);
            if (!tier) {
                print_error(tier.error().with_context("kv_device_memory"));
                return 1;
            }
            d.device_tier = std::move(*tier);
        }
        if (auto dir = node_data_dir(c, me.name); !dir.empty()) {
            auto disk = open_data_dir(dir, c.kv_disk);
            auto identity = disk ? store_identity(c.model, c.tokenizer, d.context)
                                 : Result<std::string>(disk.status());
            if (!identity) {
                print_error(identity.error());
                return 1;
            }
            std::fprintf(stderr, "deltaserve: data dir %s: %llu stored KV blocks in %.1f ms\n",
                         dir.c_str(), static_cast<unsigned long long>((*disk)->stats().blocks),
                         (*disk)->stats().recovery_ms);
            d.disk_tier = *disk;
            d.store_id = *identity;
            d.checkpoint_root = std::filesystem::path(dir).parent_path().string();
            d.checkpoint_store = me.name;
        }
        auto w = decode::DecodeWorker::create(**model, d);
        auto address = w ? (*w)->listen(**transport, me.data) : Result<std::string>(w.status());
        if (!address) {
            print_error(address.error());
            return 1;
        }
        decode = std::move(*w);
        roles.decode = decode.get();
        roles.data_address = *address;
    } else {
        prefill::PrefillOptions p;
        p.context = o.context();
        p.model_id = roles.model_id;
        p.cluster_token = c.cluster_token;
        auto w = prefill::PrefillWorker::create(**model, p, **transport);
        if (!w) {
            print_error(w.error());
            return 1;
        }
        prefill = std::move(*w);
        roles.prefill = prefill.get();
    }
    auto server = api::RpcServer::start(me.rpc, roles, c.cluster_token);
    if (!server) {
        print_error(server.error());
        return 1;
    }
    api::MemberRecord record;
    record.role = decode_role ? api::MemberRole::kDecode : api::MemberRole::kPrefill;
    record.name = me.name;
    record.rpc = me.rpc;
    record.data = decode_role ? roles.data_address : "";
    record.model = roles.model_id;
    record.kv = c.kv_policy;
    record.capacity = decode_role ? c.max_batch : 1;
    auto membership = join_cluster(c, record);
    if (!membership) {
        print_error(membership.error());
        return 1;
    }
    std::fprintf(stderr, "deltaserve: %s node %s serving RPC on %s%s%s\n",
                 decode_role ? "decode" : "prefill", me.name.c_str(), me.rpc.c_str(),
                 decode_role ? ", KV on " : "", decode_role ? roles.data_address.c_str() : "");
    std::fflush(stderr);
    ReadyFile ready(f.ready_file, membership->get());
    std::fprintf(stderr, "deltaserve: %s, stopping\n", wait_for_stop(stop_signals));
    ready.withdraw();
    if (*membership) {
        const auto busy = [&]() -> int64_t {
            if (decode) {
                const decode::DecodeStats s = decode->stats();
                return s.running + s.waiting;
            }
            return prefill->stats().queued;
        };
        drain_and_leave(**membership, busy, std::chrono::seconds(c.drain_seconds));
    }
    server->reset();
    prefill.reset();
    decode.reset();
    return 0;
}

}  // namespace

int decode_main(int argc, char** argv) { return node_main(true, argc, argv); }
int prefill_main(int argc, char** argv) { return node_main(false, argc, argv); }

int gateway_main(int argc, char** argv) {
    RoleFlags f;
    api::ClusterConfig c;
    if (auto code =
            load("deltaserve gateway",
                 "Runs the cluster's OpenAI-compatible HTTP gateway: it renders and tokenizes "
                 "conversations and runs each turn on the session's decode node and the "
                 "least-loaded prefill node.",
                 argc, argv, f, c, false)) {
        return *code;
    }
    const sigset_t stop_signals = block_stop_signals();
    auto model = load_model_for_run(run_options(c));  // for its tokenizer and chat template
    if (!model) {
        print_error(model.error());
        return 1;
    }
    std::vector<std::unique_ptr<api::RpcClient>> clients;
    std::vector<api::DecodeNode*> decode;
    std::vector<api::PrefillNode*> prefill;
    // With etcd the nodes are its members, as they come and go (the config's lists are the
    // addresses of the nodes that register with them); without, the config's lists.
    auto etcd = connect_etcd(c);
    if (!etcd) {
        print_error(etcd.error());
        return 1;
    }
    std::shared_ptr<api::MemberNodes> members;
    if (*etcd) {
        api::MemberNodesOptions mo;
        mo.prefix = c.etcd_prefix;
        mo.model_id = model_id(c);
        mo.cluster_token = c.cluster_token;
        members = std::make_shared<api::MemberNodes>(**etcd, mo);
        if (!members->wait_synced(std::chrono::seconds(10))) {
            std::fprintf(stderr,
                         "deltaserve: etcd not read within 10 s; serving the members as "
                         "they come\n");
        }
        std::fprintf(stderr, "deltaserve: etcd lists %zu decode and %zu prefill nodes\n",
                     members->usable_decode(), members->usable_prefill());
    }
    for (const auto* list : {&c.decode, &c.prefill}) {
        if (members) break;
        for (const api::NodeEntry& n : *list) {
            auto client = api::RpcClient::connect(n.rpc, std::chrono::seconds(60), c.cluster_token);
            if (!client) {
                print_error(Status(client.error().code(),
                                   "node " + n.name + ": " + client.error().message()));
                return 1;
            }
            if (list == &c.decode) {
                auto d = (*client)->decode_node();
                if (!d) {
                    print_error(d.error());
                    return 1;
                }
                decode.push_back(*d);
            } else {
                auto p = (*client)->prefill_node();
                if (!p) {
                    print_error(p.error());
                    return 1;
                }
                prefill.push_back(*p);
            }
            clients.push_back(std::move(*client));
        }
    }
    api::ClusterEngineOptions eo;
    eo.max_sessions = c.max_sessions;
    eo.session_ttl_seconds = c.session_ttl;
    eo.max_turn_moves = c.turn_moves;
    eo.max_stored_sessions = c.max_stored_sessions;
    eo.max_stored_sessions_per_tenant = c.max_stored_sessions_per_tenant;
    eo.max_stored_bytes = static_cast<int64_t>(c.max_stored_bytes);
    eo.max_stored_bytes_per_tenant = static_cast<int64_t>(c.max_stored_bytes_per_tenant);
    if (auto dir = node_data_dir(c, "gateway"); !dir.empty()) {
        auto records = open_data_dir(dir, 0);
        if (!records) {
            print_error(records.error());
            return 1;
        }
        eo.records = *records;
        eo.checkpoint_root = std::filesystem::path(dir).parent_path().string();
        eo.records_store = "gateway";
    }
    const std::string id = model_id(c);
    std::shared_ptr<api::NodeSet> nodes = members;
    if (!nodes) nodes = api::static_node_set(decode, prefill);
    api::ClusterChatEngine engine(**model, id, nodes, eo);
    if (eo.records) {
        std::fprintf(stderr, "deltaserve: %lld sessions recovered in %.1f ms\n",
                     static_cast<long long>(engine.sessions_recovered()), engine.recovery_ms());
    }
    api::GatewayOptions go;
    go.host = c.gateway_host;
    go.port = static_cast<uint16_t>(c.gateway_port);
    auto keys = parse_keys(c.api_key, "api_key");
    auto admin_keys = keys ? parse_keys(c.admin_key, "admin_key") : keys;
    if (!admin_keys) {
        print_error(admin_keys.error());
        return 1;
    }
    go.access.api_keys = *keys;
    go.access.admin_keys = *admin_keys;
    go.access.insecure = c.insecure;
    go.allowed_hosts = api::split_keys(c.allowed_hosts);
    go.allowed_origins = api::split_keys(c.allowed_origins);
    go.queue_timeout_ms = c.queue_timeout_ms;
    const std::string nodes_text = members ? " (nodes from etcd)"
                                           : " (" + std::to_string(decode.size()) + " decode, " +
                                                 std::to_string(prefill.size()) + " prefill nodes)";
    // With etcd the gateway is a member too (deltactl cluster lists it), under the name
    // --name gives or "gateway-<host>-<port>".
    std::unique_ptr<ClusterMembership> me;
    const auto join = [&](uint16_t port) -> Status {
        if (!members) return Status();
        api::MemberRecord record;
        record.role = api::MemberRole::kGateway;
        record.name = !f.name.empty() ? f.name : gateway_name(port);
        record.rpc = c.gateway_rpc;
        record.http = c.gateway_host + ":" + std::to_string(port);
        record.model = id;
        record.kv = c.kv_policy;
        DS_ASSIGN_OR_RETURN(me, join_cluster(c, record));
        return Status();
    };
    return serve_gateway(engine, go, c.gateway_rpc, nodes_text, stop_signals, join,
                         [&] { me.reset(); });
}

}  // namespace deltaserve::cli
