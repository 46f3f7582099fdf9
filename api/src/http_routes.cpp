// A request's route: the method rules (405 with Allow, HEAD as GET, OPTIONS and CORS
// preflights), the API key, and the answers of everything but a chat turn.
#include <nlohmann/json.hpp>

#include <charconv>
#include <optional>

#include "gateway_core.h"
#include "http_connection.h"
#include "json_body.h"
#include "tokenize_answer.h"

namespace deltaserve::api {

namespace http = boost::beast::http;

namespace {

nlohmann::json session_json(const SessionInfo& s) {
    return {{"id", s.id},
            {"object", "session"},
            {"turns", s.turns},
            {"messages", s.messages},
            {"tokens", s.tokens},
            {"cached_tokens", s.cached_tokens},
            {"idle_seconds", s.idle_seconds},
            {"running", s.running},
            {"stored", s.stored},
            {"history_lost", s.history_lost}};
}

// The value of `name` in a target's query ("a=1&b=2"), or nullopt.
std::optional<std::string_view> query_param(std::string_view target, std::string_view name) {
    const size_t q = target.find('?');
    if (q == std::string_view::npos) return std::nullopt;
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
        const size_t amp = query.find('&');
        const std::string_view pair = query.substr(0, amp);
        const size_t eq = pair.find('=');
        if (pair.substr(0, eq) == name)
            return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
        if (amp == std::string_view::npos) break;
        query.remove_prefix(amp + 1);
    }
    return std::nullopt;
}

// Whether `allow` ("GET, HEAD, POST") names the method.
bool allows(std::string_view allow, std::string_view method) {
    while (!allow.empty()) {
        const size_t comma = allow.find(',');
        if (allow.substr(0, comma) == method) return true;
        if (comma == std::string_view::npos) break;
        allow.remove_prefix(comma + 2);
    }
    return false;
}

}  // namespace

void Connection::route() {
    const auto& req = parser_->get();
    const std::string allow = allowed_methods(path_);
    if (allow.empty()) return answer(error_answer(404, "no route " + path_.substr(0, 256)));
    if (req.method() == http::verb::options) return options(allow);
    const std::string_view method(req.method_string().data(), req.method_string().size());
    if (!allows(allow, method)) {
        HttpAnswer a = error_answer(405, "use " + allow);
        a.allow = allow;
        return answer(a);
    }
    verb_ = head_ ? http::verb::get : req.method();
    if (path_ == "/health") {
        if (g_.stopping) return answer(error_answer(503, "the server is shutting down"));
        // Degraded: the disk tier stores nothing now (its disk is below the reserve, or it
        // had an I/O error); the service goes on from memory.
        const bool degraded = !g_.engine.stats().tiers.disk_admitting;
        return answer({200, degraded ? R"({"status":"ok","store":"degraded"})"
                                     : R"({"status":"ok","store":"ok"})"});
    }
    if (!authorize()) return;
    if (path_ == "/v1/models") {
        const nlohmann::json j = {{"object", "list"},
                                  {"data", nlohmann::json::array({{{"id", g_.engine.model_id()},
                                                                   {"object", "model"},
                                                                   {"created", 0},
                                                                   {"owned_by", "deltaserve"}}})}};
        return answer({200, j.dump()});
    }
    if (path_ == "/metrics") {
        return answer({200, g_.metrics.render(g_.engine.stats()), "text/plain; version=0.0.4"});
    }
    if (path_ == "/tokenizer_info") return answer({200, tokenizer_info_answer(g_.engine.model())});
    if (path_ == "/v1/chat/completions") return chat();
    if (path_ == "/v1/completions") return completion();
    if (path_ == "/tokenize" || path_ == "/detokenize") {
        const std::string& body = parser_->get().body();
        auto out = path_ == "/tokenize" ? tokenize_answer(g_.engine.model(), body)
                                        : detokenize_answer(g_.engine.model(), body);
        return answer(out.ok() ? HttpAnswer{200, std::move(*out)} : status_answer(out.status()));
    }
    return sessions(path_);
}

void Connection::options(const std::string& allow) {
    const auto& req = parser_->get();
    // An Origin that is not allowed was refused with the head (RequestRules::check).
    if (!allow_origin_.empty() && req.find("Access-Control-Request-Method") != req.end()) {
        return answer(preflight_answer(allow_origin_, allow));
    }
    HttpAnswer a{204, ""};
    a.allow = allow + ", OPTIONS";
    answer(a);
}

bool Connection::authorize() {
    // Everything but /health needs a key when the server has keys (/metrics only when asked).
    const bool keyed = path_.substr(0, 4) == "/v1/" || path_ == "/tokenize" ||
                       path_ == "/detokenize" || path_ == "/tokenizer_info" ||
                       (path_ == "/metrics" && g_.access.options().metrics_need_key);
    if (!keyed) return true;
    const auto& req = parser_->get();
    const auto h = req.find(http::field::authorization);
    const std::string_view authorization =
        h == req.end() ? std::string_view()
                       : std::string_view(h->value().data(), h->value().size());
    auto tenant = g_.access.tenant_of_header(authorization);
    if (!tenant.ok() && path_ == "/metrics") {
        const auto key = bearer_key(authorization);
        if (key && g_.access.admin(*key)) tenant = std::string();
    }
    if (!tenant.ok()) {
        g_.metrics.request_failed();
        answer(status_answer(tenant.status()));
        return false;
    }
    tenant_ = std::move(*tenant);
    return true;
}

// GET /v1/sessions: this key's sessions a page at a time, in id order (?limit=, default
// kSessionListLimit, at most kMaxSessionPage; ?after=ID, the last id of the page before).
void Connection::list_sessions() {
    const auto& req = parser_->get();
    const std::string_view target(req.target().data(), req.target().size());
    int32_t limit = kSessionListLimit;
    if (auto l = query_param(target, "limit")) {
        const auto r = std::from_chars(l->data(), l->data() + l->size(), limit);
        if (r.ec != std::errc() || r.ptr != l->data() + l->size() || limit < 1 ||
            limit > kMaxSessionPage)
            return answer(error_answer(
                400, "'limit' must be an integer in [1, " + std::to_string(kMaxSessionPage) + "]"));
    }
    std::string after;
    if (auto a = query_param(target, "after")) {
        after = std::string(*a);
        if (Status st = check_session_id(after, "after"); !st.ok())
            return answer(status_answer(st));
    }
    const ChatEngine::SessionList page = g_.engine.tenant_sessions(tenant_, after, limit);
    nlohmann::json list = nlohmann::json::array();
    for (const SessionInfo& s : page.data) list.push_back(session_json(s));
    nlohmann::json j = {{"object", "list"}, {"data", std::move(list)}, {"has_more", page.more}};
    j["first_id"] = page.data.empty() ? nlohmann::json() : nlohmann::json(page.data.front().id);
    j["last_id"] = page.data.empty() ? nlohmann::json() : nlohmann::json(page.data.back().id);
    return answer({200, j.dump()});
}

// route() let through only the methods allowed_methods names.
void Connection::sessions(std::string_view path) {
    const auto& req = parser_->get();
    if (path == "/v1/sessions") {
        if (verb_ == http::verb::get) return list_sessions();
        std::string id;
        if (!req.body().empty()) {  // {"id": NAME}, optional
            auto j = parse_json_body(req.body());
            if (!j.ok()) return answer(status_answer(j.status()));
            if (!j->is_object())
                return answer(error_answer(400, "the body must be a JSON object (or empty)"));
            if (auto it = j->find("id"); it != j->end() && !it->is_null()) {
                if (!it->is_string()) return answer(error_answer(400, "'id' must be a string"));
                id = it->get<std::string>();
                if (Status st = check_session_id(id, "id"); !st.ok())
                    return answer(status_answer(st));
            }
        }
        auto info = g_.engine.open_session(tenant_, id);
        if (!info.ok()) {
            const Status& st = info.status();
            return answer(status_answer(
                st, st.code() == StatusCode::kResourceExhausted ? "too_many_sessions" : ""));
        }
        HttpAnswer a{200, session_json(*info).dump()};
        a.session_id = info->id;
        return answer(a);
    }
    const std::string id(path.substr(13));
    if (Status st = check_session_id(id, "the session id in the path"); !st.ok()) {
        return answer(status_answer(st));
    }
    if (verb_ == http::verb::get) {
        auto info = g_.engine.session_info(tenant_, id);
        if (!info.ok()) return answer(session_error(info.status(), true));
        return answer({200, session_json(*info).dump()});
    }
    if (Status st = g_.engine.close_session(tenant_, id); !st.ok())  // DELETE
        return answer(session_error(st, true));
    answer(
        {200, nlohmann::json{{"id", id}, {"object", "session.deleted"}, {"deleted", true}}.dump()});
}

}  // namespace deltaserve::api
