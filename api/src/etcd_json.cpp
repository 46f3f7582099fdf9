#include "etcd_json.h"

#include <nlohmann/json.hpp>

#include <charconv>

#include "deltaserve/common/base64.h"

namespace deltaserve::api::etcd {
namespace {

using json = nlohmann::json;

std::string num(int64_t v) { return std::to_string(v); }

Result<json> parse_object(std::string_view body) {
    json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return unavailable("etcd answered bytes that are not JSON");
    if (!j.is_object()) return unavailable("etcd answered JSON that is not an object");
    return j;
}

// A 64-bit integer field: a decimal string (how the gateway writes int64) or a JSON integer;
// 0 when absent.
Result<int64_t> int_field(const json& j, const char* name) {
    const auto it = j.find(name);
    if (it == j.end() || it->is_null()) return int64_t{0};
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_string()) {
        const std::string& s = it->get_ref<const std::string&>();
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return v;
    }
    return data_loss(std::string("etcd's answer has a '") + name +
                     "' that is not a 64-bit integer");
}

Result<std::string> bytes_field(const json& j, const char* name) {
    const auto it = j.find(name);
    if (it == j.end() || it->is_null()) return std::string();
    if (!it->is_string()) {
        return data_loss(std::string("etcd's answer has a '") + name + "' that is not a string");
    }
    Result<std::string> b = base64_decode(it->get_ref<const std::string&>());
    if (!b.ok()) {
        return data_loss(std::string("etcd's answer has a '") + name +
                         "' that is not base64: " + b.error().message());
    }
    return b;
}

bool bool_field(const json& j, const char* name) {
    const auto it = j.find(name);
    return it != j.end() && it->is_boolean() && it->get<bool>();
}

Result<int64_t> header_revision(const json& j) {
    const auto it = j.find("header");
    if (it == j.end() || !it->is_object()) return data_loss("etcd's answer has no header");
    return int_field(*it, "revision");
}

Result<EtcdKeyValue> parse_kv(const json& j) {
    if (!j.is_object()) return data_loss("etcd's answer has a key-value that is not an object");
    EtcdKeyValue kv;
    DS_ASSIGN_OR_RETURN(kv.key, bytes_field(j, "key"));
    DS_ASSIGN_OR_RETURN(kv.value, bytes_field(j, "value"));
    DS_ASSIGN_OR_RETURN(kv.create_revision, int_field(j, "create_revision"));
    DS_ASSIGN_OR_RETURN(kv.mod_revision, int_field(j, "mod_revision"));
    DS_ASSIGN_OR_RETURN(kv.version, int_field(j, "version"));
    DS_ASSIGN_OR_RETURN(kv.lease, int_field(j, "lease"));
    return kv;
}

Result<std::vector<EtcdKeyValue>> parse_kvs(const json& j) {
    std::vector<EtcdKeyValue> out;
    const auto it = j.find("kvs");
    if (it == j.end() || it->is_null()) return out;
    if (!it->is_array()) return data_loss("etcd's answer has 'kvs' that is not a list");
    out.reserve(it->size());
    for (const json& e : *it) {
        DS_ASSIGN_OR_RETURN(EtcdKeyValue kv, parse_kv(e));
        out.push_back(std::move(kv));
    }
    return out;
}

// Answers of streamed calls come wrapped: {"result": {...}} or {"error": {...}}.
Result<json> unwrap_result(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    const auto err = j.find("error");
    if (err != j.end() && err->is_object()) return error_of(500, err->dump());
    const auto it = j.find("result");
    if (it == j.end() || !it->is_object()) return data_loss("etcd's streamed answer has no result");
    return std::move(*it);
}

}  // namespace

std::string prefix_end(std::string_view prefix) {
    std::string end(prefix);
    while (!end.empty()) {
        if (static_cast<uint8_t>(end.back()) < 0xff) {
            end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
            return end;
        }
        end.pop_back();
    }
    return std::string(1, '\0');
}

std::string range_request(std::string_view key, std::string_view range_end) {
    json j = {{"key", base64_encode(key)}};
    if (!range_end.empty()) j["range_end"] = base64_encode(range_end);
    return j.dump();
}

std::string put_request(std::string_view key, std::string_view value, int64_t lease) {
    json j = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
    if (lease != 0) j["lease"] = num(lease);
    return j.dump();
}

std::string delete_request(std::string_view key, std::string_view range_end) {
    return range_request(key, range_end);
}

std::string swap_request(std::string_view key, int64_t expected, bool put, std::string_view value,
                         int64_t lease) {
    const std::string k = base64_encode(key);
    json compare = {
        {"key", k}, {"target", "MOD"}, {"result", "EQUAL"}, {"mod_revision", num(expected)}};
    json then = put ? json{{"request_put", json::parse(put_request(key, value, lease))}}
                    : json{{"request_delete_range", {{"key", k}}}};
    return json{{"compare", json::array({compare})},
                {"success", json::array({then})},
                {"failure", json::array({{{"request_range", {{"key", k}}}}})}}
        .dump();
}

std::string watch_request(std::string_view key, std::string_view range_end,
                          int64_t start_revision) {
    json create = json::parse(range_request(key, range_end));
    if (start_revision > 0) create["start_revision"] = num(start_revision);
    return json{{"create_request", create}}.dump();
}

std::string grant_request(int64_t ttl_seconds) { return json{{"TTL", num(ttl_seconds)}}.dump(); }

std::string lease_request(int64_t lease, bool with_keys) {
    json j = {{"ID", num(lease)}};
    if (with_keys) j["keys"] = true;
    return j.dump();
}

std::string authenticate_request(std::string_view user, std::string_view password) {
    return json{{"name", user}, {"password", password}}.dump();
}

Status error_of(unsigned http_status, std::string_view body) {
    json j = json::parse(body.begin(), body.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
        return unavailable("the endpoint answered HTTP " + std::to_string(http_status) +
                           " with bytes that are not etcd's");
    }
    std::string message = "etcd: ";
    const auto m = j.find("message");
    const auto e = j.find("error");
    if (m != j.end() && m->is_string()) {
        message += m->get<std::string>();
    } else if (e != j.end() && e->is_string()) {
        message += e->get<std::string>();
    } else {
        message += "HTTP " + std::to_string(http_status);
    }
    const auto c = j.find("code");
    const int code = c != j.end() && c->is_number_integer() ? c->get<int>() : -1;
    switch (code) {  // gRPC's codes
        case 3:
        case 11:
            return invalid_argument(message);
        case 4:
            return deadline_exceeded(message);
        case 5:
            return not_found(message);
        case 6:
        case 10:
            return aborted(message);
        case 7:
            return permission_denied(message);
        case 8:
            return resource_exhausted(message);
        case 9:
            return failed_precondition(message);
        case 12:
            return unimplemented(message);
        case 14:
            return unavailable(message);
        case 15:
            return data_loss(message);
        case 16:
            return unauthenticated(message);
        default:
            return http_status >= 500 || code < 0 ? unavailable(message) : internal_error(message);
    }
}

bool is_token_refused(const Status& s) {
    if (s.ok()) return false;
    const std::string& m = s.message();
    return s.code() == StatusCode::kUnauthenticated ||
           m.find("invalid auth token") != std::string::npos ||
           (m.find("token") != std::string::npos && m.find("expired") != std::string::npos);
}

Result<EtcdRange> parse_range(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    EtcdRange r;
    DS_ASSIGN_OR_RETURN(r.revision, header_revision(j));
    DS_ASSIGN_OR_RETURN(r.kvs, parse_kvs(j));
    return r;
}

Result<int64_t> parse_revision(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    return header_revision(j);
}

Result<int64_t> parse_deleted(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    DS_RETURN_IF_ERROR(header_revision(j).status());
    return int_field(j, "deleted");
}

Result<EtcdSwap> parse_swap(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    EtcdSwap s;
    DS_ASSIGN_OR_RETURN(s.revision, header_revision(j));
    s.done = bool_field(j, "succeeded");
    if (s.done) return s;
    // The failure branch read the key: its one response_range.
    const auto rs = j.find("responses");
    if (rs == j.end() || !rs->is_array() || rs->size() != 1 || !(*rs)[0].is_object()) {
        return data_loss("etcd's transaction answer has no read of the key");
    }
    const auto range = (*rs)[0].find("response_range");
    if (range == (*rs)[0].end() || !range->is_object()) {
        return data_loss("etcd's transaction answer has no read of the key");
    }
    DS_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs, parse_kvs(*range));
    if (kvs.size() > 1) return data_loss("etcd's read of one key answered several");
    if (!kvs.empty()) s.current = std::move(kvs[0]);
    return s;
}

Result<int64_t> parse_lease_id(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    DS_ASSIGN_OR_RETURN(int64_t id, int_field(j, "ID"));
    const auto e = j.find("error");
    if (e != j.end() && e->is_string() && !e->get<std::string>().empty()) {
        return resource_exhausted("etcd granted no lease: " + e->get<std::string>());
    }
    if (id == 0) return data_loss("etcd's lease answer has no ID");
    return id;
}

Result<int64_t> parse_keep_alive(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json r, unwrap_result(body));
    DS_ASSIGN_OR_RETURN(int64_t ttl, int_field(r, "TTL"));
    if (ttl <= 0) return not_found("the lease has expired");
    return ttl;
}

Result<int64_t> parse_time_left(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    DS_ASSIGN_OR_RETURN(int64_t ttl, int_field(j, "TTL"));
    if (ttl < 0) return not_found("the lease has expired");
    return ttl;
}

Result<std::string> parse_token(std::string_view body) {
    DS_ASSIGN_OR_RETURN(json j, parse_object(body));
    const auto t = j.find("token");
    if (t == j.end() || !t->is_string() || t->get_ref<const std::string&>().empty()) {
        return data_loss("etcd's authentication answer has no token");
    }
    return t->get<std::string>();
}

Result<WatchMessage> parse_watch_message(std::string_view line) {
    DS_ASSIGN_OR_RETURN(json r, unwrap_result(line));
    WatchMessage m;
    DS_ASSIGN_OR_RETURN(m.revision, header_revision(r));
    m.created = bool_field(r, "created");
    m.canceled = bool_field(r, "canceled");
    DS_ASSIGN_OR_RETURN(m.compact_revision, int_field(r, "compact_revision"));
    const auto reason = r.find("cancel_reason");
    if (reason != r.end() && reason->is_string()) m.cancel_reason = reason->get<std::string>();
    const auto events = r.find("events");
    if (events == r.end() || events->is_null()) return m;
    if (!events->is_array())
        return data_loss("etcd's watch answer has 'events' that is not a list");
    for (const json& e : *events) {
        if (!e.is_object())
            return data_loss("etcd's watch answer has an event that is not an object");
        EtcdEvent ev;
        const auto type = e.find("type");
        if (type != e.end() && !type->is_null()) {
            if (!type->is_string())
                return data_loss("etcd's watch event has a 'type' that is not a string");
            const std::string& t = type->get_ref<const std::string&>();
            if (t == "DELETE") {
                ev.deleted = true;
            } else if (t != "PUT") {
                return data_loss("etcd's watch event has the type '" + t.substr(0, 32) + "'");
            }
        }
        const auto kv = e.find("kv");
        if (kv == e.end()) return data_loss("etcd's watch event has no kv");
        DS_ASSIGN_OR_RETURN(ev.kv, parse_kv(*kv));
        m.events.push_back(std::move(ev));
    }
    return m;
}

}  // namespace deltaserve::api::etcd
