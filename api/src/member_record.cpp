#include <nlohmann/json.hpp>

#include "deltaserve/api/membership.h"
#include "etcd_http.h"

namespace deltaserve::api {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxRecordBytes = 16 * 1024;
constexpr size_t kMaxFieldBytes = 512;

bool name_ok(const std::string& n) {
    return !n.empty() && n.size() <= 64 && n != "." && n != ".." &&
           n.find_first_not_of(
               "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
               std::string::npos;
}

Status bad(const std::string& field, const std::string& why) {
    return invalid_argument("member record: '" + field + "' " + why);
}

Result<std::string> text(const json& j, const char* field, bool required) {
    const auto it = j.find(field);
    if (it == j.end() || it->is_null()) {
        if (required) return bad(field, "is missing");
        return std::string();
    }
    if (!it->is_string()) return bad(field, "is not a string");
    const std::string& s = it->get_ref<const std::string&>();
    if (s.size() > kMaxFieldBytes) return bad(field, "is longer than 512 bytes");
    return s;
}

Status check_address(const std::string& field, const std::string& a, bool required) {
    if (a.empty()) return required ? bad(field, "is missing") : Status();
    if (!etcd::parse_endpoint(a).ok()) return bad(field, "is not host:port");
    return Status();
}

}  // namespace

const char* member_role_name(MemberRole role) {
    switch (role) {
        case MemberRole::kGateway:
            return "gateway";
        case MemberRole::kPrefill:
            return "prefill";
        case MemberRole::kDecode:
            return "decode";
    }
    return "?";
}

std::string member_key(std::string_view prefix, MemberRole role, std::string_view name) {
    return std::string(prefix) + "members/" + member_role_name(role) + "/" + std::string(name);
}

std::string encode_member_record(const MemberRecord& r) {
    json j = {{"role", member_role_name(r.role)},
              {"name", r.name},
              {"rpc", r.rpc},
              {"model", r.model},
              {"kv", r.kv},
              {"version", r.version},
              {"capacity", r.capacity},
              {"draining", r.draining},
              {"started_ms", r.started_ms}};
    if (!r.data.empty()) j["data"] = r.data;
    if (!r.http.empty()) j["http"] = r.http;
    return j.dump();
}

Result<MemberRecord> parse_member_record(std::string_view value) {
    if (value.size() > kMaxRecordBytes)
        return invalid_argument("member record: longer than 16 KiB");
    const json j = json::parse(value.begin(), value.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return invalid_argument("member record: not a JSON object");
    MemberRecord r;
    DS_ASSIGN_OR_RETURN(const std::string role, text(j, "role", true));
    if (role == "gateway") {
        r.role = MemberRole::kGateway;
    } else if (role == "prefill") {
        r.role = MemberRole::kPrefill;
    } else if (role == "decode") {
        r.role = MemberRole::kDecode;
    } else {
        return bad("role", "is not gateway, prefill or decode");
    }
    DS_ASSIGN_OR_RETURN(r.name, text(j, "name", true));
    if (!name_ok(r.name)) return bad("name", "is not 1-64 of A-Z a-z 0-9 . _ -");
    DS_ASSIGN_OR_RETURN(r.rpc, text(j, "rpc", r.role != MemberRole::kGateway));
    DS_RETURN_IF_ERROR(check_address("rpc", r.rpc, r.role != MemberRole::kGateway));
    DS_ASSIGN_OR_RETURN(r.data, text(j, "data", false));
    DS_RETURN_IF_ERROR(check_address("data", r.data, r.role == MemberRole::kDecode));
    DS_ASSIGN_OR_RETURN(r.http, text(j, "http", false));
    DS_RETURN_IF_ERROR(check_address("http", r.http, false));
    DS_ASSIGN_OR_RETURN(r.model, text(j, "model", false));
    DS_ASSIGN_OR_RETURN(r.kv, text(j, "kv", false));
    DS_ASSIGN_OR_RETURN(r.version, text(j, "version", false));
    const auto cap = j.find("capacity");
    if (cap != j.end()) {
        if (!cap->is_number_integer() || cap->get<int64_t>() < 0 ||
            cap->get<int64_t>() > 1'000'000) {
            return bad("capacity", "is not an integer in [0, 1000000]");
        }
        r.capacity = cap->get<int32_t>();
    }
    const auto draining = j.find("draining");
    if (draining != j.end()) {
        if (!draining->is_boolean()) return bad("draining", "is not a boolean");
        r.draining = draining->get<bool>();
    }
    const auto started = j.find("started_ms");
    if (started != j.end()) {
        if (!started->is_number_integer()) return bad("started_ms", "is not an integer");
        r.started_ms = started->get<int64_t>();
    }
    return r;
}

}  // namespace deltaserve::api
