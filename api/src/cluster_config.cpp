#include "deltaserve/api/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "deltaserve/api/etcd_client.h"
#include "deltaserve/common/byte_size.h"
#include "deltaserve/kvstore/kv_policy.h"

namespace deltaserve::api {

namespace {

// Every scalar key, with how to set it from text.
using Setter = std::function<Status(ClusterConfig&, const std::string&)>;

Status parse_int(const std::string& key, const std::string& v, int32_t& out, int32_t lo,
                 int32_t hi) {
    try {
        size_t used = 0;
        const long x = std::stol(v, &used);
        if (used != v.size() || x < lo || x > hi) throw std::out_of_range(v);
        out = static_cast<int32_t>(x);
        return {};
    } catch (const std::exception&) {
        return invalid_argument(key + ": '" + v + "' is not an integer in [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "]");
    }
}

const std::map<std::string, Setter>& setters() {
    static const std::map<std::string, Setter> s = [] {
        std::map<std::string, Setter> m;
        const auto text = [&m](const char* key, std::string ClusterConfig::*field) {
            m[key] = [field](ClusterConfig& c, const std::string& v) {
                c.*field = v;
                return Status();
            };
        };
        const auto integer = [&m](const char* key, int32_t ClusterConfig::*field, int32_t lo,
                                  int32_t hi) {
            m[key] = [key, field, lo, hi](ClusterConfig& c, const std::string& v) {
                return parse_int(key, v, c.*field, lo, hi);
            };
        };
        text("model", &ClusterConfig::model);
        text("tokenizer", &ClusterConfig::tokenizer);
        m["kv_policy"] = [](ClusterConfig& c, const std::string& v) {
            DS_RETURN_IF_ERROR(kvstore::find_kv_policy(v).status().with_context("kv_policy"));
            c.kv_policy = v;
            return Status();
        };
        text("kv_profile", &ClusterConfig::kv_profile);
        text("transport_tls", &ClusterConfig::transport_tls);
        text("transport_rndv_scheme", &ClusterConfig::transport_rndv_scheme);
        text("gateway_host", &ClusterConfig::gateway_host);
        text("gateway_rpc", &ClusterConfig::gateway_rpc);
        text("log_level", &ClusterConfig::log_level);
        text("api_key", &ClusterConfig::api_key);
        text("admin_key", &ClusterConfig::admin_key);
        text("cluster_token", &ClusterConfig::cluster_token);
        text("allowed_hosts", &ClusterConfig::allowed_hosts);
        text("allowed_origins", &ClusterConfig::allowed_origins);
        m["insecure"] = [](ClusterConfig& c, const std::string& v) {
            if (v != "true" && v != "false") {
                return invalid_argument("insecure: '" + v + "' is not true or false");
            }
            c.insecure = v == "true";
            return Status();
        };
        integer("threads", &ClusterConfig::threads, 0, 1024);
        integer("ctx_size", &ClusterConfig::ctx_size, 0, 1 << 20);
        integer("batch_size", &ClusterConfig::batch_size, 1, 1 << 16);
        integer("gateway_port", &ClusterConfig::gateway_port, 0, 65535);
        integer("queue_timeout_ms", &ClusterConfig::queue_timeout_ms, 1, 1 << 30);
        integer("local_prefill_max", &ClusterConfig::local_prefill_max, 0, 1 << 20);
        integer("max_batch", &ClusterConfig::max_batch, 1, 4096);
        integer("prefill_chunk", &ClusterConfig::prefill_chunk, 0, 1 << 16);
        integer("max_sessions", &ClusterConfig::max_sessions, 1, 1 << 20);
        integer("session_ttl", &ClusterConfig::session_ttl, 1, 1 << 30);
        integer("max_stored_sessions", &ClusterConfig::max_stored_sessions, 1, 1 << 30);
        integer("max_stored_sessions_per_tenant", &ClusterConfig::max_stored_sessions_per_tenant, 1,
                1 << 30);
        for (const auto& [name, field] :
             {std::pair{"max_stored_bytes", &ClusterConfig::max_stored_bytes},
              std::pair{"max_stored_bytes_per_tenant",
                        &ClusterConfig::max_stored_bytes_per_tenant}}) {
            m[name] = [name = std::string(name), field = field](ClusterConfig& c,
                                                                const std::string& v) {
                auto bytes = parse_byte_size(v);
                if (!bytes) return bytes.status().with_context(name);
                if (*bytes == 0 || *bytes > static_cast<uint64_t>(INT64_MAX))
                    return invalid_argument(name + ": must be above 0");
                c.*field = *bytes;
                return Status();
            };
        }
        integer("prefix_cache_mib", &ClusterConfig::prefix_cache_mib, 0, 1 << 24);
        m["kv_memory"] = [](ClusterConfig& c, const std::string& v) {
            auto bytes = parse_byte_size(v);
            if (!bytes) return bytes.status().with_context("kv_memory");
            c.kv_memory = *bytes;
            return Status();
        };
        text("data_dir", &ClusterConfig::data_dir);
        m["etcd"] = [](ClusterConfig& c, const std::string& v) {
            c.etcd = split_etcd_endpoints(v);
            return Status();
        };
        text("etcd_user", &ClusterConfig::etcd_user);
        text("etcd_password", &ClusterConfig::etcd_password);
        m["etcd_prefix"] = [](ClusterConfig& c, const std::string& v) {
            if (v.size() < 2 || v.front() != '/' || v.back() != '/' || v.size() > 256) {
                return invalid_argument("etcd_prefix: '" + v +
                                        "' is not a key prefix that starts and ends with '/'");
            }
            c.etcd_prefix = v;
            return Status();
        };
        integer("member_ttl", &ClusterConfig::member_ttl, 2, 3600);
        integer("drain_seconds", &ClusterConfig::drain_seconds, 0, 3600);
        integer("turn_moves", &ClusterConfig::turn_moves, 0, 16);
        m["kv_host_memory"] = [](ClusterConfig& c, const std::string& v) {
            auto bytes = parse_byte_size(v);
            if (!bytes) return bytes.status().with_context("kv_host_memory");
            c.kv_host_memory = static_cast<int64_t>(*bytes);
            return Status();
        };
        text("device", &ClusterConfig::device);
        m["attention"] = [](ClusterConfig& c, const std::string& v) {
            if (v != "native" && v != "ggml")
                return invalid_argument("attention: '" + v + "' is not native or ggml");
            c.attention = v;
            return Status();
        };
        m["kv_device_memory"] = [](ClusterConfig& c, const std::string& v) {
            auto bytes = parse_byte_size(v);
            if (!bytes) return bytes.status().with_context("kv_device_memory");
            c.kv_device_memory = *bytes;
            return Status();
        };
        m["kv_disk"] = [](ClusterConfig& c, const std::string& v) {
            auto bytes = parse_byte_size(v);
            if (!bytes) return bytes.status().with_context("kv_disk");
            c.kv_disk = *bytes;
            return Status();
        };
        m["kv_keep"] = [](ClusterConfig& c, const std::string& v) {
            try {
                size_t used = 0;
                c.kv_keep = std::stof(v, &used);
                if (used == v.size() && c.kv_keep > 0.0f && c.kv_keep <= 1.0f) return Status();
            } catch (const std::exception&) {
            }
            return invalid_argument("kv_keep: '" + v + "' is not a ratio in (0, 1]");
        };
        return m;
    }();
    return s;
}

Status read_nodes(const YAML::Node& list, const std::string& key, bool needs_data,
                  std::vector<NodeEntry>& out) {
    if (!list) return {};
    if (!list.IsSequence()) return invalid_argument(key + ": must be a list of nodes");
    for (const auto& n : list) {
        if (!n.IsMap() || !n["name"] || !n["rpc"]) {
            return invalid_argument(key + ": every node needs a name and an rpc address");
        }
        NodeEntry e{n["name"].as<std::string>(), n["rpc"].as<std::string>(),
                    n["data"] ? n["data"].as<std::string>() : ""};
        if (needs_data && e.data.empty()) {
            return invalid_argument(key + ": node " + e.name + " needs a data address (host:port)");
        }
        out.push_back(std::move(e));
    }
    return {};
}

}  // namespace

const NodeEntry* ClusterConfig::find(const std::string& name) const {
    for (const auto* list : {&prefill, &decode}) {
        for (const NodeEntry& n : *list) {
            if (n.name == name) return &n;
        }
    }
    return nullptr;
}

Status apply_env_overrides(ClusterConfig& config) {
    for (const auto& [key, set] : setters()) {
        std::string env = "DELTASERVE_" + key;
        for (char& ch : env) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        if (const char* v = std::getenv(env.c_str())) {
            Status st = set(config, v);
            if (!st.ok()) return invalid_argument(env + ": " + st.message());
        }
    }
    return {};
}

Result<ClusterConfig> load_cluster_config(const std::string& path) {
    if (!std::filesystem::is_regular_file(path)) return not_found("no cluster config at " + path);
    ClusterConfig c;
    try {
        const YAML::Node root = YAML::LoadFile(path);
        if (!root.IsMap())
            return invalid_argument(path + ": the cluster config must be a YAML map");
        for (const auto& kv : root) {
            const std::string key = kv.first.as<std::string>();
            if (key == "prefill" || key == "decode") continue;
            if (key == "etcd" && kv.second.IsSequence()) {
                for (const auto& e : kv.second) {
                    if (!e.IsScalar())
                        return invalid_argument(path + ": etcd: a list of host:port");
                    c.etcd.push_back(e.as<std::string>());
                }
                continue;
            }
            if (key == "gateway" || key == "transport") {  // nested: gateway.host -> gateway_host
                if (!kv.second.IsMap())
                    return invalid_argument(path + ": " + key + " must be a map");
                for (const auto& sub : kv.second) {
                    const std::string full = key + "_" + sub.first.as<std::string>();
                    auto it = setters().find(full);
                    if (it == setters().end())
                        return invalid_argument(path + ": unknown key " + key + "." +
                                                sub.first.as<std::string>());
                    DS_RETURN_IF_ERROR(it->second(c, sub.second.as<std::string>()));
                }
                continue;
            }
            auto it = setters().find(key);
            if (it == setters().end())
                return invalid_argument(path + ": unknown key '" + key + "'");
            if (!kv.second.IsScalar())
                return invalid_argument(path + ": " + key + " must be a single value");
            DS_RETURN_IF_ERROR(it->second(c, kv.second.as<std::string>()));
        }
        DS_RETURN_IF_ERROR(read_nodes(root["prefill"], "prefill", false, c.prefill));
        DS_RETURN_IF_ERROR(read_nodes(root["decode"], "decode", true, c.decode));
    } catch (const YAML::Exception& e) {
        return invalid_argument(path + ": not valid YAML: " + e.what());
    }
    DS_RETURN_IF_ERROR(apply_env_overrides(c));
    std::set<std::string> names;
    for (const auto* list : {&c.prefill, &c.decode}) {
        for (const NodeEntry& n : *list) {
            if (!names.insert(n.name).second)
                return invalid_argument(path + ": two nodes named " + n.name);
        }
    }
    if (!c.etcd.empty()) {
        EtcdOptions o;
        o.endpoints = c.etcd;
        o.user = c.etcd_user;
        o.password = c.etcd_password;
        DS_RETURN_IF_ERROR(EtcdClient::create(o).status().with_context(path + ": etcd"));
    }
    if (c.decode.empty() && c.etcd.empty()) {
        return invalid_argument(path + ": no decode node (and no etcd for nodes to join through)");
    }
    return c;
}

}  // namespace deltaserve::api
