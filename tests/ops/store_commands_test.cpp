// deltactl's offline views of a stored cache (ops/README.md) against a real server's data
// dir: a DeltaKV server holds two sessions and is killed; deltactl reads what it stored.
// sessions, session describe, blocks, tiers and verify give the rows and JSON a user checks
// against what the server said; a flipped bit is found by verify and describe, and dropped
// with --drop; a running server's store is refused; bad usage exits 2, store errors 1. A full
// KV server's sessions that begin alike share blocks, and blocks says so.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

// ~200 tokens: long enough that DeltaKV compresses part of it, several 64-token blocks.
const std::string kLong =
    "My name is Ada and I keep bees on a hill above the river. Every spring I open the hives, "
    "count the frames, and look for the queen; every summer I take the honey and leave the "
    "bees enough for the winter. My neighbours buy the honey at the market on Saturdays, and "
    "the children ask how the bees find their way home. I tell them about the sun, the smell of "
    "the clover, and the dance the bees do on the comb to tell each other where the flowers "
    "are. Say hello to me, and tell me one thing about bees I may not know.";

CliResult deltactl(const std::vector<std::string>& args) {
    return run_binary(deltactl_binary(), args, "", std::chrono::seconds(60));
}

json json_of(const CliResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return json::parse(r.out, nullptr, false);
}

json chat(uint16_t port, const std::string& session, const std::string& message) {
    HttpResponse r = post_chat(port, chat_body(message, 16), "X-Session-ID: " + session + "\r\n");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
}

class StoreCommandsTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (!file_exists(default_gguf_model())) return;
        dir_ =
            (fs::temp_directory_path() / ("ds_store_cmds_" + std::to_string(::getpid()))).string();
        fs::remove_all(dir_);
        ServingProcess server(
            serve_args({"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-profile",
                        default_deltakv_profile(), "--data-dir", dir_}));
        ASSERT_NE(server.port(), 0) << server.log();
        ASSERT_EQ(open_session(server.port(), "ada"), 200);
        ASSERT_EQ(open_session(server.port(), "bob"), 200);
        chat(server.port(), "ada", kLong);
        chat(server.port(), "ada", "What do bees make? One sentence.");
        chat(server.port(), "bob", "Hello, who are you?");
        const HttpResponse info = http_request(server.port(), "GET", "/v1/sessions/ada");
        ada_info_ = json::parse(info.body, nullptr, false);
        // A running server's store is not read.
        running_ = deltactl({"sessions", "--data-dir", dir_});
        running_pid_ = server.pid();
        server.kill9();
    }
    static void TearDownTestSuite() {
        if (!dir_.empty()) fs::remove_all(dir_);
    }
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        ASSERT_FALSE(dir_.empty());
    }

    // The views, each on the store the suite's server left (one test: the server runs once
    // per test process).
    void running_store_refused();
    void sessions_listed();
    void described();
    void blocks_and_tiers();
    void fidelity();

    static inline std::string dir_;
    static inline json ada_info_;
    static inline CliResult running_;
    static inline pid_t running_pid_ = 0;
};

void StoreCommandsTest::running_store_refused() {
    EXPECT_EQ(running_.exit_code, 1) << running_.describe();
    EXPECT_NE(running_.err.find("running server (pid " + std::to_string(running_pid_) + ")"),
              std::string::npos)
        << running_.err;
}

void StoreCommandsTest::sessions_listed() {
    const json all = json_of(deltactl({"sessions", "--data-dir", dir_, "--json"}));
    ASSERT_TRUE(all.is_array()) << all.dump();
    ASSERT_EQ(all.size(), 2u) << all.dump();
    const json& ada = all[0]["id"] == "ada" ? all[0] : all[1];
    EXPECT_EQ(ada["turns"], 2);
    EXPECT_EQ(ada["tokens"], ada_info_["tokens"]) << ada_info_.dump();
    // The answer's last token has no KV until the next turn evaluates it.
    EXPECT_EQ(ada["stored_tokens"], ada_info_["tokens"].get<int64_t>() - 1);
    EXPECT_EQ(ada["messages"], 4);
    EXPECT_EQ(ada["policy"], "deltakv");
    EXPECT_EQ(ada["blocks_held"], ada["blocks"]);
    EXPECT_GT(ada["disk_bytes"].get<int64_t>(), 0);
    // Short sessions keep their sinks and recent buffer exact: between the target and 1.
    EXPECT_GT(ada["keep_ratio"].get<double>(), 0.25);
    EXPECT_LT(ada["keep_ratio"].get<double>(), 1.0);
    EXPECT_TRUE(ada["host_bytes"].is_null() && ada["ttl_left_seconds"].is_null())
        << "offline, what only a server knows is null, never 0";

    const CliResult table = deltactl({"sessions", "--data-dir", dir_, "--sort-by", "tokens"});
    ASSERT_EQ(table.exit_code, 0) << table.describe();
    std::istringstream lines(table.out);
    std::string header, first, second;
    std::getline(lines, header);
    std::getline(lines, first);
    std::getline(lines, second);
    EXPECT_TRUE(
        std::regex_search(header, std::regex("^SESSION +NODE +TURNS +TOKENS +POLICY +KEEP")))
        << header;
    EXPECT_EQ(first.rfind("ada ", 0), 0u) << table.out;  // the longer one first
    EXPECT_EQ(second.rfind("bob ", 0), 0u) << table.out;
    EXPECT_NE(first.find("--"), std::string::npos) << "unknown values show as --";

    const CliResult none = deltactl({"sessions", "--data-dir", dir_, "--tenant", "nobody"});
    EXPECT_EQ(none.exit_code, 0) << none.describe();
    EXPECT_EQ(none.out, "");
}

void StoreCommandsTest::described() {
    const json d = json_of(deltactl({"session", "describe", "ada", "--data-dir", dir_, "--json"}));
    const int64_t tokens = ada_info_["tokens"].get<int64_t>() - 1;  // with KV (above)
    ASSERT_EQ(d["turn_list"].size(), 2u) << d.dump();
    EXPECT_EQ(d["turn_list"][0]["begin"], 0);
    EXPECT_EQ(d["turn_list"][1]["begin"], d["turn_list"][0]["end"]);
    EXPECT_EQ(d["turn_list"][1]["end"], tokens);
    ASSERT_EQ(d["layers"].size(), 30u);
    int full = 0, compressed = 0;
    for (const json& l : d["layers"]) {
        const int64_t held = l["sinks"].get<int64_t>() + l["references"].get<int64_t>() +
                             l["buffer"].get<int64_t>() + l["latents"].get<int64_t>();
        EXPECT_EQ(held, tokens) << l.dump();  // every token, once, in every layer
        if (l["role"] == "observation") {     // a full layer before sparse ones
            ++full;
            EXPECT_TRUE(l["error"].is_null());
            EXPECT_EQ(l["latents"], 0);
        } else if (l["latents"].get<int64_t>() > 0) {
            EXPECT_EQ(l["role"], "sparse");
            ++compressed;
            EXPECT_GT(l["error"].get<double>(), 0.005) << l.dump();
            EXPECT_LT(l["error"].get<double>(), 0.7) << l.dump();
            EXPECT_EQ(l["sinks"], 16);
        }
    }
    EXPECT_GE(full, 1);
    EXPECT_GE(compressed, 20);
    int64_t bytes = 0;
    int32_t end = 0;
    for (const json& b : d["block_list"]) {
        EXPECT_EQ(b["check"], "ok") << b.dump();
        EXPECT_EQ(b["begin"], end);
        end = b["end"].get<int32_t>();
        bytes += b["bytes"].get<int64_t>();
    }
    EXPECT_EQ(end, tokens);
    EXPECT_EQ(bytes, d["disk_bytes"].get<int64_t>());

    const CliResult table = deltactl({"session", "describe", "ada", "--data-dir", dir_});
    ASSERT_EQ(table.exit_code, 0) << table.describe();
    for (const char* part : {"Session:      ada", "Turns:\nTURN  TOKENS", "Layers:\nLAYER  ROLE",
                             "Blocks:\nBLOCK  KEY"})
        EXPECT_NE(table.out.find(part), std::string::npos) << part << "\n" << table.out;

    // explain, whole: every block taken.
    const json why = json_of(deltactl({"explain", "ada", "--data-dir", dir_, "--json"}));
    EXPECT_EQ(why["taken_blocks"], d["block_list"].size()) << why.dump();
    EXPECT_EQ(why["recomputed_tokens"], 0);
    const CliResult why_table = deltactl({"explain", "ada", "--data-dir", dir_});
    EXPECT_NE(why_table.out.find("its next turn takes " + std::to_string(d["block_list"].size()) +
                                 " of " + std::to_string(d["block_list"].size()) + " blocks"),
              std::string::npos)
        << why_table.out;

    // A range of tokens with their kinds and text: the 16 sinks, then a reference every
    // 40th token (the profile's stride), latents between.
    const json t = json_of(deltactl({"session", "describe", "ada", "--data-dir", dir_, "--tokens",
                                     "0:60", "--model", default_gguf_model(), "--json"}));
    ASSERT_EQ(t["token_list"].size(), 60u) << t.dump();
    for (const json& x : t["token_list"]) {
        const int pos = x["position"];
        const std::string want = pos < 16 ? "sink" : (pos - 16) % 40 == 0 ? "reference" : "latent";
        EXPECT_EQ(x["kind"], want) << x.dump();
        EXPECT_TRUE(x["text"].is_string()) << x.dump();
    }
    EXPECT_EQ(
        deltactl({"session", "describe", "ada", "--data-dir", dir_, "--tokens", "9:3"}).exit_code,
        2);

    const CliResult missing = deltactl({"session", "describe", "carol", "--data-dir", dir_});
    EXPECT_EQ(missing.exit_code, 1) << missing.describe();
    EXPECT_NE(missing.err.find("no session carol"), std::string::npos) << missing.err;
}

void StoreCommandsTest::blocks_and_tiers() {
    const json sessions = json_of(deltactl({"sessions", "--data-dir", dir_, "--json"}));
    int64_t blocks = 0, bytes = 0;
    for (const json& s : sessions) {
        blocks += s["blocks"].get<int64_t>();
        bytes += s["disk_bytes"].get<int64_t>();
    }
    const json b = json_of(deltactl({"blocks", "--data-dir", dir_, "--json"}));
    EXPECT_EQ(b["count"], blocks) << b.dump();
    EXPECT_EQ(b["bytes"], bytes);
    EXPECT_EQ(b["bytes_saved_by_sharing"], 0) << "DeltaKV's blocks are each session's own";
    for (const json& x : b["blocks"]) {
        EXPECT_EQ(x["codec"], "deltakv");
        EXPECT_EQ(x["sessions"], 1);
        EXPECT_EQ(x["header"], "ok");
    }
    const json one =
        json_of(deltactl({"blocks", "--data-dir", dir_, "--session", "bob", "--json"}));
    const json& bob = sessions[0]["id"] == "bob" ? sessions[0] : sessions[1];
    EXPECT_EQ(one["count"], bob["blocks"]);

    const json t = json_of(deltactl({"tiers", "--data-dir", dir_, "--json"}));
    ASSERT_EQ(t.size(), 1u) << t.dump();
    EXPECT_EQ(t[0]["bytes"], bytes);
    EXPECT_EQ(t[0]["blocks"], blocks);
    EXPECT_EQ(t[0]["kv_records"], 2);
    EXPECT_EQ(t[0]["session_records"], 2);
    EXPECT_TRUE(t[0]["capacity"].is_null());
    EXPECT_GT(t[0]["index"]["rocksdb.estimate-num-keys"].get<int64_t>(), 0);
}

TEST_F(StoreCommandsTest, TheViewsSayWhatTheServerHeld) {
    running_store_refused();
    sessions_listed();
    described();
    blocks_and_tiers();
    fidelity();
}

// What compression costs ada, recomputed with the model: the stored cache's next-token KL
// against full KV over its last tokens (full KV's own, in the test below, is 0).
void StoreCommandsTest::fidelity() {
    const json f =
        json_of(deltactl({"fidelity", "ada", "--data-dir", dir_, "--model", default_gguf_model(),
                          "--kv-profile", default_deltakv_profile(), "--json"}));
    EXPECT_EQ(f["compared"], 32) << f.dump();
    EXPECT_EQ(f["kl"].size(), 32u);
    EXPECT_GE(f["kl_mean"].get<double>(), 0.0);
    EXPECT_LT(f["kl_mean"].get<double>(), 2.0) << f.dump();
    EXPECT_GT(f["kl_max"].get<double>(), 0.0) << "a compressed cache differs somewhere";
    EXPECT_GE(f["top1_agree"].get<int>(), 16) << f.dump();
    ASSERT_EQ(f["layers"].size(), 30u);
    // The drift the stored cache makes in the hidden state: some after the first layer,
    // more deep in the stack; the last layer's output is the logits (the KL).
    EXPECT_GT(f["layers"][0]["drift"].get<double>(), 0.0) << f.dump();
    EXPECT_LT(f["layers"][0]["drift"].get<double>(), 0.5) << f.dump();
    EXPECT_GT(f["layers"][28]["drift"].get<double>(), f["layers"][0]["drift"].get<double>());
    EXPECT_TRUE(f["layers"][29]["drift"].is_null());
    // The stored rows against full KV's of the same history: layer 0's exact rows are the
    // same tokens' (nothing before it differs; fp16 rounding only), its latents as far off as
    // compression measured them; a full layer has no latents.
    const json& l0 = f["layers"][0];
    EXPECT_LT(l0["exact_rows_error"].get<double>(), 2e-3) << l0.dump();
    EXPECT_GT(l0["latent_error"].get<double>(), 0.5 * l0["recorded_error"].get<double>());
    EXPECT_LT(l0["latent_error"].get<double>(), 2.0 * l0["recorded_error"].get<double>());
    EXPECT_TRUE(f["layers"][3]["latent_error"].is_null()) << f["layers"][3].dump();
    EXPECT_GT(f["layers"][3]["exact_rows_error"].get<double>(), 0.0) << "the layers before";
    EXPECT_EQ(f["positions_compared"], f["tokens"]);
    // Other settings than the server's: said, not measured.
    const CliResult other =
        deltactl({"fidelity", "ada", "--data-dir", dir_, "--model", default_gguf_model(),
                  "--kv-profile", default_deltakv_profile(), "--kv-keep", "0.6"});
    EXPECT_EQ(other.exit_code, 1) << other.describe();
    EXPECT_NE(other.err.find("does not fit"), std::string::npos) << other.err;
    EXPECT_EQ(deltactl({"fidelity", "ada", "--data-dir", dir_}).exit_code, 2) << "no --model";
}

TEST_F(StoreCommandsTest, VerifyFindsAFlippedBitAndDropsItOnlyWhenAsked) {
    // On a copy: the other cases read the store as the server left it.
    const std::string copy = dir_ + "_verify";
    fs::remove_all(copy);
    fs::copy(dir_, copy, fs::copy_options::recursive);
    const CliResult clean = deltactl({"verify", "--data-dir", copy});
    EXPECT_EQ(clean.exit_code, 0) << clean.describe();
    EXPECT_NE(clean.out.find(": 0 bad."), std::string::npos) << clean.out;

    // A bit in the middle of ada's second block's payload.
    const json d = json_of(deltactl({"session", "describe", "ada", "--data-dir", copy, "--json"}));
    const std::string key = d["block_list"][1]["key"];
    std::string file;
    for (const auto& e : fs::directory_iterator(copy + "/kv/payload")) {
        if (e.path().filename().string().rfind(key, 0) == 0) file = e.path().string();
    }
    ASSERT_FALSE(file.empty()) << key;
    {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
        char c = 0;
        f.read(&c, 1);
        c ^= 0x10;
        f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
        f.write(&c, 1);
    }
    const json bad =
        json::parse(deltactl({"verify", "--data-dir", copy, "--json"}).out, nullptr, false);
    ASSERT_EQ(bad["bad"], 1) << bad.dump();
    EXPECT_EQ(bad["problems"][0]["name"], key);
    EXPECT_EQ(bad["problems"][0]["problem"], "checksum");
    EXPECT_EQ(bad["dropped"], 0);
    EXPECT_EQ(deltactl({"verify", "--data-dir", copy}).exit_code, 1);
    const json described =
        json_of(deltactl({"session", "describe", "ada", "--data-dir", copy, "--json"}));
    EXPECT_EQ(described["block_list"][1]["check"], "checksum");
    // explain: the next turn takes block 0 and computes the rest again, saying why.
    const json why = json_of(deltactl({"explain", "ada", "--data-dir", copy, "--json"}));
    EXPECT_EQ(why["taken_blocks"], 1) << why.dump();
    EXPECT_EQ(why["taken_tokens"], why["blocks"][0]["end"]);
    EXPECT_EQ(why["blocks"][1]["taken"], false);
    EXPECT_NE(why["blocks"][1]["reason"].get<std::string>().find("checksum failed"),
              std::string::npos)
        << why.dump();
    EXPECT_NE(why["blocks"][2]["reason"].get<std::string>().find("follows a block"),
              std::string::npos)
        << why.dump();

    const json dropped = json::parse(
        deltactl({"verify", "--data-dir", copy, "--drop", "--json"}).out, nullptr, false);
    EXPECT_EQ(dropped["dropped"], 1) << dropped.dump();
    const CliResult after = deltactl({"verify", "--data-dir", copy});
    EXPECT_EQ(after.exit_code, 0) << after.describe();
    const json gone =
        json_of(deltactl({"session", "describe", "ada", "--data-dir", copy, "--json"}));
    EXPECT_EQ(gone["block_list"][1]["check"], "missing");
    const json dropped_why = json_of(deltactl({"explain", "ada", "--data-dir", copy, "--json"}));
    // The tier logged the drop: explain says when and why.
    EXPECT_EQ(dropped_why["blocks"][1]["removed"]["reason"], "refused") << dropped_why.dump();
    EXPECT_NE(dropped_why["blocks"][1]["reason"].get<std::string>().find("as bad"),
              std::string::npos)
        << dropped_why.dump();
    fs::remove_all(copy);
}

TEST(StoreCommandsUsage, UsageErrorsExit2AndStoreErrors1) {
    const std::string dir_ =
        (fs::temp_directory_path() / ("ds_store_usage_" + std::to_string(::getpid()))).string();
    EXPECT_EQ(deltactl({"session"}).exit_code, 2);
    EXPECT_EQ(deltactl({"session", "describe"}).exit_code, 2);
    EXPECT_EQ(deltactl({"sessions", "--bogus"}).exit_code, 2);
    EXPECT_EQ(deltactl({"sessions", "--data-dir", dir_, "--sort-by", "size"}).exit_code, 2);
    EXPECT_EQ(deltactl({"verify", "--server", "127.0.0.1:1"}).exit_code, 2);  // stores only
    EXPECT_EQ(deltactl({"frobnicate"}).exit_code, 2);
    const CliResult nothing = deltactl({"tiers", "--data-dir", dir_ + "_nothing_here"});
    EXPECT_EQ(nothing.exit_code, 1) << nothing.describe();
    EXPECT_EQ(deltactl({"sessions", "--help"}).exit_code, 0);
}

// Full KV's blocks depend on their tokens alone: two sessions that begin alike share them.
TEST(StoreCommandsFullKv, SessionsThatBeginAlikeShareBlocks) {
    DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
    const std::string dir =
        (fs::temp_directory_path() / ("ds_store_shared_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    {
        ServingProcess server(serve_args({"--data-dir", dir}));
        ASSERT_NE(server.port(), 0) << server.log();
        for (const char* id : {"a1", "a2"}) {
            ASSERT_EQ(open_session(server.port(), id), 200);
            chat(server.port(), id, kLong);
        }
        EXPECT_EQ(server.stop(), 0);
    }
    const json b = json_of(deltactl({"blocks", "--data-dir", dir, "--shared", "--json"}));
    ASSERT_GE(b["count"].get<int64_t>(), 2) << b.dump();
    for (const json& x : b["blocks"]) {
        EXPECT_EQ(x["sessions"], 2);
        EXPECT_EQ(x["codec"], "full");
    }
    EXPECT_EQ(b["bytes_saved_by_sharing"], b["bytes"]);
    const json s = json_of(deltactl({"sessions", "--data-dir", dir, "--json"}));
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0]["policy"], "full");
    EXPECT_NEAR(s[0]["keep_ratio"].get<double>(), 1.0, 0.05);
    // Full KV's stored cache is the exact one: fed again, the same logits.
    const json f = json_of(
        deltactl({"fidelity", "a1", "--data-dir", dir, "--model", default_gguf_model(), "--json"}));
    EXPECT_LT(f["kl_max"].get<double>(), 1e-6) << f.dump();
    for (size_t l = 0; l + 1 < f["layers"].size(); ++l)
        EXPECT_LT(f["layers"][l]["drift"].get<double>(), 1e-4) << f["layers"][l].dump();
    EXPECT_TRUE(f["layers"][0]["latent_error"].is_null()) << "full KV keeps every row exact";
    EXPECT_EQ(f["top1_agree"], f["compared"]);
    fs::remove_all(dir);
}

// A full KV server whose disk tier holds one session's blocks only (--kv-disk): the second
// session's turn evicts the first's. explain says why, with the time the tier logged; for a
// prompt file, which of its blocks a new session would take from disk.
TEST(StoreCommandsFullKv, ExplainNamesEvictionsAndAPromptsBlocks) {
    DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
    const std::string dir =
        (fs::temp_directory_path() / ("ds_store_explain_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string other =
        "Bees are not the only insects that make honey. Some wasps do too, and in the forests "
        "of South America the Mexican honey wasp stores it in paper nests as large as a man's "
        "head. The honey is said to taste much like that of bees, though few have tried it, "
        "because the wasps defend their nests fiercely. Tell me more about wasps and the ways "
        "they differ from bees in the care of their young and the building of their nests.";
    const int64_t t0 = static_cast<int64_t>(std::time(nullptr));
    {
        ServingProcess server(serve_args({"--data-dir", dir + "/data", "--kv-disk", "6MiB"}));
        ASSERT_NE(server.port(), 0) << server.log();
        ASSERT_EQ(open_session(server.port(), "first"), 200);
        chat(server.port(), "first", kLong);
        ASSERT_EQ(open_session(server.port(), "second"), 200);
        chat(server.port(), "second", other);
        EXPECT_EQ(server.stop(), 0);
    }
    const json e = json_of(deltactl({"explain", "first", "--data-dir", dir + "/data", "--json"}));
    ASSERT_FALSE(e["blocks"].empty()) << e.dump();
    const json& b0 = e["blocks"][0];
    EXPECT_EQ(b0["taken"], false) << e.dump();
    EXPECT_EQ(b0["check"], "missing");
    EXPECT_EQ(b0["removed"]["reason"], "cap") << b0.dump();
    EXPECT_GE(b0["removed"]["unix_ms"].get<int64_t>() / 1000, t0);
    EXPECT_NE(b0["reason"].get<std::string>().find("evicted by the disk tier's cap at "),
              std::string::npos)
        << b0.dump();
    EXPECT_EQ(e["taken_tokens"], 0);
    // The prompts, as files: the first's blocks went, the second's are there but its tail.
    std::ofstream(dir + "/first.json") << chat_body(kLong, 16).dump();
    std::ofstream(dir + "/second.txt") << other;
    const auto prompt = [&](const std::string& file) {
        return json_of(deltactl({"explain", "--prompt", dir + "/" + file, "--model",
                                 default_gguf_model(), "--data-dir", dir + "/data", "--json"}));
    };
    const json p1 = prompt("first.json");
    ASSERT_EQ(p1["identities"].size(), 1u) << p1.dump();
    const json& id1 = p1["identities"][0];
    EXPECT_EQ(id1["policy"], "full");
    EXPECT_EQ(id1["taken_tokens"], 0);
    ASSERT_FALSE(id1["blocks"].empty());
    EXPECT_EQ(id1["blocks"][0]["key"], b0["key"]) << "a prompt's blocks are its session's";
    EXPECT_EQ(id1["blocks"][0]["removed"]["reason"], "cap");
    const json p2 = prompt("second.txt");
    const json& id2 = p2["identities"][0];
    const int64_t n = p2["prompt_tokens"];
    const int64_t whole = (n - 1) / 64 * 64;
    EXPECT_EQ(id2["taken_tokens"], whole) << p2.dump();
    EXPECT_EQ(id2["prefilled_tokens"], n - whole);
    for (const json& b : id2["blocks"]) EXPECT_EQ(b["tier"], "disk") << b.dump();
    EXPECT_EQ(id2["tail"]["begin"], whole);
    // Under another tenant nothing is shared.
    const json p3 = json_of(
        deltactl({"explain", "--prompt", dir + "/second.txt", "--model", default_gguf_model(),
                  "--tenant", "acme", "--data-dir", dir + "/data", "--json"}));
    EXPECT_EQ(p3["identities"][0]["taken_tokens"], 0);
    EXPECT_EQ(p3["identities"][0]["blocks"][0]["reason"], "never stored");
    const CliResult table = deltactl({"explain", "--prompt", dir + "/second.txt", "--model",
                                      default_gguf_model(), "--data-dir", dir + "/data"});
    EXPECT_EQ(table.exit_code, 0) << table.describe();
    EXPECT_NE(table.out.find("shorter than a block: prefilled"), std::string::npos) << table.out;
    EXPECT_EQ(deltactl({"explain", "--prompt", dir + "/second.txt", "--data-dir", dir + "/data"})
                  .exit_code,
              2)
        << "--prompt needs --model";
    EXPECT_EQ(deltactl({"explain", "--prompt", dir + "/nothing.txt", "--model",
                        default_gguf_model(), "--data-dir", dir + "/data"})
                  .exit_code,
              1);
    fs::remove_all(dir);
}

}  // namespace
}  // namespace deltaserve::testing
