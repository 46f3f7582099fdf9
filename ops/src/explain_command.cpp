// deltactl explain: what a session's next turn, or a new session's first turn with a given
// prompt, would take from a store's tiers, block by block, and why each block it would not
// take is not: checks that fail, blocks the tier removed (its log of removals: when and
// why), blocks never stored, another KV identity, the prompt's tail.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "command_support.h"
#include "commands.h"
#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/decode/session_record.h"
#include "deltaserve/model/model.h"
#include "session_view.h"
#include "table.h"

namespace deltaserve::ops {

namespace {

using Removal = kvstore::DiskTier::Removal;

constexpr const char* kFollowsAMiss =
    "follows a block that is not taken (blocks chain: each needs those before it)";

// The last logged removal of each block of the store.
std::map<uint64_t, Removal> removals_of(const Store& store) {
    std::map<uint64_t, Removal> out;
    auto all = store.tier->removals();
    if (!all.ok()) return out;
    for (auto& r : *all) out[r.key] = std::move(r);  // oldest first: the last one stays
    return out;
}

std::string when(const Removal& r) { return utc(r.unix_ms / 1000); }

// Why a block not in the disk tier is not, from the tier's log of removals.
std::string gone_reason(const Removal* r, bool was_stored) {
    if (r == nullptr) {
        return was_stored ? "not in the disk tier, and not among its logged removals (removed "
                            "before the log's last ones)"
                          : "never stored";
    }
    if (r->reason == "cap")
        return "evicted by the disk tier's cap at " + when(*r) + " (least recently written first)";
    if (r->reason == "refused")
        return "dropped at " + when(*r) + " as bad (a node's checks, or deltactl verify --drop)";
    if (r->reason == "erased")
        return "removed at " + when(*r) + " with its session (closed, dropped or expired)";
    if (r->reason == "lost") return "its file was gone when the store opened at " + when(*r);
    return "removed at " + when(*r) + " (" + r->reason + ")";
}

// Why a stored block of a session would not be taken by its next turn.
std::string miss_reason(const std::string& check, const Removal* removed) {
    if (check == "missing") return gone_reason(removed, true);
    if (check == "checksum") return "checksum failed: a node refuses it and recomputes";
    if (check == "another export")
        return "another export of the session than its record names: refused";
    if (check == "fingerprint") return "made for another model, tokenizer or profile";
    if (check == "unreadable") return "its file cannot be read";
    return check + ": refused";
}

// The blocks of an explanation (its JSON "blocks"), one row each: taken, or why not.
Table block_table(const json& blocks) {
    Table t({"BLOCK", "KEY", "TOKENS", "TAKEN", "WHY NOT"});
    for (const json& b : blocks) {
        t.add({std::to_string(b["block"].get<int>()), b["key"].get<std::string>().substr(0, 12),
               std::to_string(b["begin"].get<int>()) + "-" + std::to_string(b["end"].get<int>()),
               b["taken"].get<bool>() ? "disk" : "no",
               b.contains("reason") ? b["reason"].get<std::string>() : ""});
    }
    return t;
}

// A prompt file: a chat completion request's body, or text as one user message.
Result<std::vector<model::ChatMessage>> prompt_messages(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot read the prompt file " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("messages")) {
        auto req = api::parse_chat_request(text, model::SamplingParams{});
        if (!req.ok()) return invalid_argument(path + ": " + req.status().message());
        return req->messages;
    }
    return std::vector<model::ChatMessage>{{"user", text}};
}

// One KV identity of a store, as its session records name it.
struct Identity {
    int32_t block_tokens = 0;  // the longest first block of its records
    uint64_t sample_block = 0;
    int32_t sessions = 0;
};

int explain_prompt(const Common& c, const std::string& path, const std::string& model_path,
                   const std::string& tenant) {
    auto messages = prompt_messages(path);
    if (!messages.ok()) return store_error(messages.status());
    model::LoadOptions lo;
    lo.show_progress = false;
    lo.repack = false;
    auto m = model::load_model(model_path, lo);
    if (!m.ok()) return store_error(m.status());
    if (!(*m)->tokenizer) return store_error(failed_precondition("the model has no tokenizer"));
    auto tokens = model::encode_chat(*(*m)->tokenizer, (*m)->chat_template, *messages, true);
    if (!tokens.ok()) return store_error(tokens.status());
    int code = 0;
    auto view = open_view(c, &code);
    if (!view) return code;
    const int32_t n = static_cast<int32_t>(tokens->size());
    json stores = json::array();
    for (const auto& store : view->stores()) {
        std::map<uint64_t, Identity> ids;
        if (auto ds = store->tier->records("ds/"); ds.ok()) {
            for (const auto& [k, v] : *ds) {
                uint64_t fp = 0;
                std::string session;
                auto r = decode::decode_session_record(v);
                if (!decode::parse_session_record_key(k, &fp, &session) || !r || r->keys.empty())
                    continue;
                Identity& id = ids[fp];
                ++id.sessions;
                if (r->ends[0] > id.block_tokens) id.block_tokens = r->ends[0];
                id.sample_block = r->keys[0];
            }
        }
        const auto removed = removals_of(*store);
        for (const auto& [fp, id] : ids) {
            json j = {{"node", store->name},
                      {"store", store->dir},
                      {"fingerprint", hex64(fp)},
                      {"sessions", id.sessions},
                      {"block_tokens", id.block_tokens}};
            auto head = view->read_header(*store, id.sample_block);
            const std::string policy = head.ok() ? codec_name(head->codec) : kUnknown;
            j["policy"] = policy == kUnknown ? json() : json(policy);
            json blocks = json::array();
            int32_t taken_tokens = 0;
            if (policy != "full") {
                j["note"] = policy == "deltakv"
                                ? "DeltaKV's blocks depend on what followed them in their "
                                  "session: a new session shares none, and prefills its "
                                  "whole prompt (a node's prefix cache in memory may hold it)"
                                : "the blocks' policy is not known: none is matched";
            } else {
                const auto keys = decode::prefix_chain(fp, tenant, *tokens, id.block_tokens);
                bool broken = false;
                for (size_t i = 0; i < keys.size(); ++i) {
                    const int32_t b = static_cast<int32_t>(i) * id.block_tokens;
                    json bj = {{"block", i},
                               {"key", hex64(keys[i])},
                               {"begin", b},
                               {"end", b + id.block_tokens}};
                    std::string why;
                    if (broken) {
                        why = kFollowsAMiss;
                    } else if (!store->tier->contains(keys[i])) {
                        auto r = removed.find(keys[i]);
                        why = gone_reason(r != removed.end() ? &r->second : nullptr, false);
                        if (r != removed.end())
                            bj["removed"] = {{"unix_ms", r->second.unix_ms},
                                             {"reason", r->second.reason}};
                    } else {
                        std::string fault;
                        auto bytes = view->read_block(*store, keys[i]);
                        auto v = bytes.ok() ? parse_any_block(*bytes, &fault)
                                            : Result<kvstore::KvBlockView>(bytes.status());
                        if (!v.ok()) {
                            why = miss_reason(fault.empty() ? "unreadable" : fault, nullptr);
                        } else if (v->meta.begin != b || v->meta.end != b + id.block_tokens) {
                            why = miss_reason("another block", nullptr);
                        }
                    }
                    bj["taken"] = why.empty();
                    if (why.empty()) {
                        bj["tier"] = "disk";
                        taken_tokens = b + id.block_tokens;
                    } else {
                        broken = true;
                        bj["reason"] = why;
                    }
                    blocks.push_back(std::move(bj));
                }
                const int32_t whole = static_cast<int32_t>(keys.size()) * id.block_tokens;
                j["tail"] = {{"begin", whole},
                             {"end", n},
                             {"reason", n - whole < id.block_tokens
                                            ? "shorter than a block: prefilled"
                                            : "the prompt's last token: a turn evaluates one "
                                              "at least"}};
            }
            j["taken_tokens"] = taken_tokens;
            j["prefilled_tokens"] = n - taken_tokens;
            j["blocks"] = std::move(blocks);
            stores.push_back(std::move(j));
        }
    }
    const json out = {{"prompt", path},
                      {"prompt_tokens", n},
                      {"tenant", tenant},
                      {"identities", std::move(stores)}};
    if (c.as_json) {
        std::printf("%s\n", json_text(c, out).c_str());
        return 0;
    }
    std::printf("Prompt %s: %d tokens (the chat template applied: a new session's first turn)",
                path.c_str(), n);
    if (!tenant.empty()) std::printf(", tenant %s", tenant.c_str());
    std::printf(".\n");
    if (out["identities"].empty()) {
        std::printf(
            "No session record in %s names a KV identity (model, profile, policy) to match the "
            "prompt against: nothing stored would be taken.\n",
            c.data_dir.c_str());
        return 0;
    }
    for (const json& s : out["identities"]) {
        const std::string node = s["node"].get<std::string>();
        const std::string policy = s["policy"].is_null() ? kUnknown : s["policy"];
        const int taken = s["taken_tokens"].get<int>();
        std::printf(
            "\n%s%s (%s, fingerprint %s, %d sessions): ", node.empty() ? "The store" : "Node ",
            node.c_str(), policy.c_str(), s["fingerprint"].get<std::string>().substr(0, 12).c_str(),
            s["sessions"].get<int>());
        if (taken > 0) {
            std::printf("takes tokens 0-%d from disk, prefills %d-%d.\n", taken, taken, n);
        } else {
            std::printf("takes nothing from disk, prefills the whole prompt.\n");
        }
        if (s.contains("note")) {
            std::printf("  %s.\n", s["note"].get<std::string>().c_str());
            continue;
        }
        Table t = block_table(s["blocks"]);
        const json& tail = s["tail"];
        t.add({"tail", kUnknown,
               std::to_string(tail["begin"].get<int>()) + "-" +
                   std::to_string(tail["end"].get<int>()),
               "no", tail["reason"].get<std::string>()});
        t.print();
    }
    return 0;
}

}  // namespace

int explain_main(int argc, char** argv) {
    const std::string id = take_id(argc, argv);
    Common c;
    ArgParser p("deltactl explain ID | --prompt FILE --model M",
                "What the session's next turn (or a new session's first turn with the prompt "
                "FILE) would take from the stored tiers, block by block, and why each block "
                "that would not be taken is not (a stopped node's store, or a checkpoint of a "
                "running one).");
    add_common(p, c);
    std::string prompt, model_path, tenant;
    p.add("prompt", &prompt,
          "a prompt file: a chat completion request's JSON body, or text sent as one user "
          "message");
    p.add("model", &model_path,
          "--prompt: the served model, whose chat template and tokenizer "
          "make the prompt's tokens");
    p.add("tenant", &tenant, "--prompt: the tenant asking (blocks are shared within one)");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = offline_only(c, "deltactl explain")) return code;
    init_logging("warn");
    if (p.given("prompt")) {
        if (!id.empty()) return usage_error("deltactl explain: a session ID or --prompt, not both");
        if (model_path.empty())
            return usage_error("deltactl explain --prompt needs --model (its tokens)");
        return explain_prompt(c, prompt, model_path, tenant);
    }
    if (id.empty()) return usage_error("deltactl explain: which session? (ID or TENANT/ID)");
    int code = 0;
    auto view = open_view(c, &code);
    if (!view) return code;
    auto s = view->session(id);
    if (!s.ok()) return store_error(s.status());
    json out = {{"session", s->name()}};
    std::vector<std::string> others;
    for (uint64_t fp : s->other_fingerprints) others.push_back(hex64(fp));
    out["other_fingerprints"] = others;
    if (!s->has_kv_record) {
        out["stored"] = false;
        out["reason"] =
            "never stored: no KV record (a server without a data dir, or no turn of it ended)";
        out["blocks"] = json::array();
    } else {
        const Described d = describe_blocks(*s, store_reader(*view, *s->store));
        const auto removed = removals_of(*s->store);
        json blocks = json::array();
        int64_t taken_tokens = 0;
        bool broken = false;
        size_t taken = 0;
        for (size_t i = 0; i < d.blocks.size(); ++i) {
            const BlockRow& b = d.blocks[i];
            json j = {{"block", i},
                      {"key", hex64(b.key)},
                      {"begin", b.begin},
                      {"end", b.end},
                      {"check", b.check}};
            if (broken) {
                j["taken"] = false;
                j["reason"] = kFollowsAMiss;
            } else if (b.check == "ok") {
                j["taken"] = true;
                j["tier"] = "disk";
                taken_tokens = b.end;
                ++taken;
            } else {
                broken = true;
                j["taken"] = false;
                auto r = removed.find(b.key);
                j["reason"] = miss_reason(b.check, r != removed.end() ? &r->second : nullptr);
                if (r != removed.end()) {
                    j["removed"] = {{"unix_ms", r->second.unix_ms}, {"reason", r->second.reason}};
                }
            }
            blocks.push_back(std::move(j));
        }
        out["stored"] = true;
        out["fingerprint"] = hex64(s->fingerprint);
        out["policy"] = d.policy == kUnknown ? json() : json(d.policy);
        out["stored_tokens"] = s->record.tokens.size();
        out["taken_tokens"] = taken_tokens;
        out["taken_blocks"] = taken;
        out["recomputed_tokens"] = static_cast<int64_t>(s->record.tokens.size()) - taken_tokens;
        out["blocks"] = std::move(blocks);
    }
    if (c.as_json) {
        std::printf("%s\n", json_text(c, out).c_str());
        return 0;
    }
    std::printf("Session %s", s->name().c_str());
    if (!s->has_kv_record) {
        std::printf(": %s.\n", out["reason"].get<std::string>().c_str());
    } else {
        const int64_t stored = out["stored_tokens"], taken_tokens = out["taken_tokens"];
        const std::string policy = out["policy"].is_null() ? kUnknown : out["policy"];
        std::printf(
            " (%s, fingerprint %s), out of decode memory or after a restart: its next "
            "turn takes %zu of %zu blocks (tokens 0-%lld) from disk",
            policy.c_str(), short_hash(s->fingerprint).c_str(), out["taken_blocks"].get<size_t>(),
            out["blocks"].size(), static_cast<long long>(taken_tokens));
        if (taken_tokens < stored) {
            std::printf(", computes tokens %lld-%lld again", static_cast<long long>(taken_tokens),
                        static_cast<long long>(stored));
        }
        std::printf(", then its new message.\n\n");
        Table t = block_table(out["blocks"]);
        t.print();
    }
    if (!others.empty()) {
        std::printf(
            "\nAlso stored under %zu other fingerprint(s) (another model, tokenizer, "
            "profile or policy): a server uses only the records of its own.\n",
            others.size());
    }
    return 0;
}

}  // namespace deltaserve::ops
