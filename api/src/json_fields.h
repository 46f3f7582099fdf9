// Reading a request's JSON fields with errors that name them: a field may be left out or
// null; otherwise it has to have the type asked for.
#pragma once

#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/model/tokenizer.h"

namespace deltaserve::api {

using RequestJson = nlohmann::ordered_json;  // a request keeps its keys' order

inline Status bad_field(const std::string& field, const std::string& what) {
    return invalid_argument("'" + field + "' " + what);
}

// The field, or nullptr where it is left out or null.
inline const RequestJson* field_of(const RequestJson& j, const char* field) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
}

// A number field, if present (its range is the caller's to check).
inline Status number_field(const RequestJson& j, const char* field, float& out) {
    const RequestJson* v = field_of(j, field);
    if (v == nullptr) return Status();
    if (!v->is_number()) return bad_field(field, "must be a number");
    out = static_cast<float>(v->get<double>());
    return Status();
}

// An integer field in [lo, hi], if present (given says whether it was).
inline Status integer_field(const RequestJson& j, const char* field, int64_t lo, int64_t hi,
                            int64_t& out, bool& given) {
    given = false;
    const RequestJson* v = field_of(j, field);
    if (v == nullptr) return Status();
    if (!v->is_number_integer()) return bad_field(field, "must be an integer");
    const bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX};
    const int64_t x = too_big ? INT64_MAX : v->get<int64_t>();
    if (too_big || x < lo || x > hi) {
        return bad_field(field,
                         "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    out = x;
    given = true;
    return Status();
}

// A boolean field, if present; errors name it `name` (a nested field's path).
inline Status boolean_field(const RequestJson& j, const char* field, const std::string& name,
                            bool& out) {
    const RequestJson* v = field_of(j, field);
    if (v == nullptr) return Status();
    if (!v->is_boolean()) return bad_field(name, "must be true or false");
    out = v->get<bool>();
    return Status();
}

// A string field, if present, of at most max_bytes bytes of valid UTF-8.
inline Status string_field(const RequestJson& j, const char* field, const std::string& name,
                           size_t max_bytes, std::string& out, bool& given) {
    given = false;
    const RequestJson* v = field_of(j, field);
    if (v == nullptr) return Status();
    if (!v->is_string()) return bad_field(name, "must be a string");
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max_bytes)
        return bad_field(name, "is longer than " + std::to_string(max_bytes) + " bytes");
    if (model::find_invalid_utf8(s) >= 0) return bad_field(name, "is not valid UTF-8");
    out = s;
    given = true;
    return Status();
}

}  // namespace deltaserve::api
