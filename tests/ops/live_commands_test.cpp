// deltactl's live views through a running server's admin service (deltaserve serve
// --rpc-port, Cap'n Proto, the admin key): sessions and tiers say what the server holds and
// where (decode memory, host, disk), page by page; they agree with the offline view of the
// same data dir once the server stopped; a session evicted to the tiers comes back from the
// host tier, one dropped is gone; a checkpoint is read while the server runs; a wrong or
// missing key, a server that is gone and bad usage get their exit codes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

const std::string kKey = "admin-secret-1";

CliResult deltactl(const std::vector<std::string>& args) {
    return run_binary(deltactl_binary(), args, "", std::chrono::seconds(60));
}

json json_of(const CliResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return json::parse(r.out, nullptr, false);
}

uint16_t rpc_port(const ServingProcess& s) {
    const size_t at = s.log().find("chat RPC on port ");
    return at == std::string::npos ? 0
                                   : static_cast<uint16_t>(std::atoi(s.log().c_str() + at + 17));
}

std::map<std::string, json> by_id(const json& rows) {
    std::map<std::string, json> out;
    for (const json& r : rows) out[r["id"].get<std::string>()] = r;
    return out;
}

TEST(LiveCommandsTest, SessionsAndTiersFromARunningServer) {
    DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
    const std::string dir =
        (fs::temp_directory_path() / ("ds_live_cmds_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    json live, live_paged, tiers;
    std::map<std::string, int64_t> tokens;
    {
        ServingProcess server(serve_args({"--kv-policy", "deltakv", "--kv-keep", "0.3",
                                          "--kv-profile", default_deltakv_profile(), "--data-dir",
                                          dir, "--rpc-port", "0", "--admin-key", kKey}));
        ASSERT_NE(server.port(), 0) << server.log();
        const uint16_t port = rpc_port(server);
        ASSERT_NE(port, 0) << server.log();
        const std::string at = "127.0.0.1:" + std::to_string(port);
        for (const char* id : {"s1", "s2", "s3"}) {
            ASSERT_EQ(open_session(server.port(), id), 200);
            const HttpResponse r =
                post_chat(server.port(), chat_body(std::string("Hello, I am ") + id + ".", 12),
                          std::string("X-Session-ID: ") + id + "\r\n");
            ASSERT_EQ(r.status, 200) << r.body;
            const json info = json::parse(
                http_request(server.port(), "GET", std::string("/v1/sessions/") + id).body, nullptr,
                false);
            tokens[id] = info["tokens"].get<int64_t>();
        }
        // The keys: a missing or wrong one is refused.
        const CliResult nokey = deltactl({"sessions", "--server", at});
        EXPECT_EQ(nokey.exit_code, 1) << nokey.describe();
        EXPECT_NE(nokey.err.find("admin key"), std::string::npos) << nokey.err;
        EXPECT_EQ(deltactl({"sessions", "--server", at, "--admin-key", "wrong"}).exit_code, 1);

        live = json_of(deltactl({"sessions", "--server", at, "--admin-key", kKey, "--json"}));
        const auto live_by_id = by_id(live);
        live_paged = json_of(deltactl(
            {"sessions", "--server", at, "--admin-key", kKey, "--json", "--page-size", "1"}));
        tiers = json_of(deltactl({"tiers", "--server", at, "--admin-key", kKey, "--json"}));
        const CliResult table = deltactl({"tiers", "--server", at, "--admin-key", kKey});
        EXPECT_EQ(table.exit_code, 0) << table.describe();
        EXPECT_NE(table.out.find("decode-0  disk"), std::string::npos) << table.out;
        const json shape =
            json_of(deltactl({"cluster", "--server", at, "--admin-key", kKey, "--json"}));
        EXPECT_EQ(shape["decode"][0]["rpc_address"], "in-process") << shape.dump();
        EXPECT_EQ(shape["decode"][0]["sessions"], 3);
        EXPECT_EQ(shape["gateway"]["model"], "SmolLM2-135M-Instruct.Q4_1.gguf") << shape.dump();
        // Acts: s3 evicted to the tiers (its next turn takes it from the host tier), then
        // dropped; unknown sessions are errors.
        const CliResult evicted = deltactl({"evict", "s3", "--server", at, "--admin-key", kKey});
        EXPECT_EQ(evicted.exit_code, 0) << evicted.describe();
        const auto after =
            by_id(json_of(deltactl({"sessions", "--server", at, "--admin-key", kKey, "--json"})));
        EXPECT_TRUE(after.at("s3")["decode_bytes"].is_null()) << after.at("s3").dump();
        EXPECT_GT(after.at("s3")["host_bytes"].get<int64_t>(), 0) << after.at("s3").dump();
        EXPECT_EQ(deltactl({"evict", "s3", "--server", at, "--admin-key", kKey}).exit_code, 1)
            << "not in decode memory any more";
        const HttpResponse again =
            post_chat(server.port(), chat_body("And again.", 4), "X-Session-ID: s3\r\n");
        ASSERT_EQ(again.status, 200) << again.body;
        EXPECT_EQ(json::parse(again.body)["usage"]["prompt_tokens_details"]["kv_source"], "host")
            << again.body;
        EXPECT_EQ(deltactl({"drop", "s3", "--server", at, "--admin-key", kKey}).exit_code, 0);
        EXPECT_EQ(http_request(server.port(), "GET", "/v1/sessions/s3").status, 404);
        EXPECT_EQ(deltactl({"drop", "nobody", "--server", at, "--admin-key", kKey}).exit_code, 1);
        EXPECT_EQ(deltactl({"evict", "--server", at}).exit_code, 2);
        // A checkpoint: the offline views read it while the server runs.
        const json cp = json_of(deltactl(
            {"checkpoint", "--server", at, "--admin-key", kKey, "--name", "cp1", "--json"}));
        ASSERT_EQ(cp["paths"].size(), 1u) << cp.dump();
        EXPECT_EQ(cp["paths"][0], dir + "/checkpoints/cp1/kv");
        const json described = json_of(deltactl(
            {"session", "describe", "s1", "--data-dir", dir + "/checkpoints/cp1", "--json"}));
        EXPECT_EQ(described["turns"], 1);
        for (const json& b : described["block_list"]) EXPECT_EQ(b["check"], "ok") << b.dump();
        // Live, describe and blocks read the node's tiers: the same blocks and layers as the
        // checkpoint's, each in the host tier and on disk, with no lease between turns.
        const json live_described = json_of(
            deltactl({"session", "describe", "s1", "--server", at, "--admin-key", kKey, "--json"}));
        EXPECT_EQ(live_described["layers"], described["layers"]);
        EXPECT_EQ(live_described["turn_list"], described["turn_list"]);
        EXPECT_EQ(live_described["keep_ratio"], described["keep_ratio"]);
        EXPECT_EQ(live_described["disk_bytes"], described["disk_bytes"]);
        EXPECT_EQ(live_described["decode_bytes"], live_by_id.at("s1")["decode_bytes"]);
        ASSERT_EQ(live_described["block_list"].size(), described["block_list"].size());
        for (size_t i = 0; i < described["block_list"].size(); ++i) {
            const json& b = live_described["block_list"][i];
            EXPECT_EQ(b["key"], described["block_list"][i]["key"]);
            EXPECT_EQ(b["bytes"], described["block_list"][i]["bytes"]);
            EXPECT_EQ(b["check"], "ok") << b.dump();
            EXPECT_EQ(b["tiers"], json::array({"host", "disk"})) << b.dump();
            EXPECT_EQ(b["leases"], json::array()) << b.dump();
        }
        const CliResult live_table =
            deltactl({"session", "describe", "s1", "--server", at, "--admin-key", kKey});
        EXPECT_EQ(live_table.exit_code, 0) << live_table.describe();
        EXPECT_NE(live_table.out.find("host,disk  ok"), std::string::npos) << live_table.out;
        EXPECT_NE(live_table.out.find("Pinned:       no"), std::string::npos) << live_table.out;
        const json live_blocks = json_of(
            deltactl({"blocks", "--server", at, "--admin-key", kKey, "--json", "--session", "s1"}));
        EXPECT_EQ(live_blocks["count"], described["block_list"].size()) << live_blocks.dump();
        EXPECT_EQ(live_blocks["bytes"], described["disk_bytes"]);
        for (const json& b : live_blocks["blocks"]) {
            EXPECT_EQ(b["header"], "ok") << b.dump();
            EXPECT_EQ(b["codec"], "deltakv") << b.dump();
        }
        EXPECT_EQ(deltactl({"session", "describe", "nobody", "--server", at, "--admin-key", kKey})
                      .exit_code,
                  1);
        EXPECT_EQ(deltactl({"verify", "--data-dir", dir + "/checkpoints/cp1"}).exit_code, 0);
        EXPECT_EQ(deltactl({"checkpoint", "--server", at, "--admin-key", kKey, "--name", "cp1"})
                      .exit_code,
                  1)
            << "a name in use";
        EXPECT_EQ(deltactl({"checkpoint", "--server", at, "--admin-key", kKey, "--name", "../x"})
                      .exit_code,
                  2);
        // The offline views never open a running server's store.
        EXPECT_EQ(deltactl({"sessions", "--data-dir", dir}).exit_code, 1);
        EXPECT_EQ(server.stop(), 0);
        // Gone: an error, not a hang.
        const CliResult gone = deltactl({"sessions", "--server", at, "--admin-key", kKey});
        EXPECT_EQ(gone.exit_code, 1) << gone.describe();
    }
    ASSERT_EQ(live.size(), 3u) << live.dump();
    EXPECT_EQ(live_paged, live) << "one session a page gives the same list";
    for (const auto& [id, s] : by_id(live)) {
        EXPECT_EQ(s["turns"], 1);
        EXPECT_EQ(s["tokens"], tokens[id]);
        EXPECT_EQ(s["node"], "decode-0");
        EXPECT_EQ(s["policy"], "deltakv");
        EXPECT_EQ(s["in_memory"], true);
        // In decode memory, and stored (write-through) in the host tier and on disk.
        EXPECT_EQ(s["decode_tokens"], tokens[id] - 1) << s.dump();
        EXPECT_GT(s["decode_bytes"].get<int64_t>(), 0) << s.dump();
        EXPECT_EQ(s["stored_tokens"], s["decode_tokens"]) << s.dump();
        EXPECT_GT(s["disk_bytes"].get<int64_t>(), 0) << s.dump();
        EXPECT_EQ(s["host_bytes"], s["disk_bytes"]) << s.dump();
        EXPECT_GT(s["keep_ratio"].get<double>(), 0.25);
        EXPECT_GT(s["ttl_left_seconds"].get<int64_t>(), 0);
    }
    ASSERT_EQ(tiers.size(), 1u) << tiers.dump();
    EXPECT_EQ(tiers[0]["node"], "decode-0");
    EXPECT_EQ(tiers[0]["decode"]["sessions"], 3);
    EXPECT_EQ(tiers[0]["disk"]["admitting"], true);
    EXPECT_GT(tiers[0]["disk"]["capacity"].get<int64_t>(), 0);
    EXPECT_EQ(tiers[0]["sessions_persisted"], 3);
    int64_t disk = 0;
    for (const json& s : live) disk += s["disk_bytes"].get<int64_t>();
    EXPECT_EQ(tiers[0]["disk"]["bytes"], disk);

    // The offline view of the same store, now that it stopped, says the same.
    const auto offline = by_id(json_of(deltactl({"sessions", "--data-dir", dir, "--json"})));
    for (const auto& [id, s] : by_id(live)) {
        if (id == "s3") {  // dropped since
            EXPECT_EQ(offline.count(id), 0u);
            continue;
        }
        ASSERT_TRUE(offline.count(id)) << id;
        EXPECT_EQ(offline.at(id)["disk_bytes"], s["disk_bytes"]) << id;
        EXPECT_EQ(offline.at(id)["stored_tokens"], s["stored_tokens"]) << id;
        EXPECT_EQ(offline.at(id)["blocks"], s["blocks"]) << id;
        EXPECT_EQ(offline.at(id)["turns"], s["turns"]) << id;
    }
    fs::remove_all(dir);
}

// A server keeping one idle session's KV in decode memory (--kv-sessions 1): the one pinned
// stays there while others' turns come and go, and goes when unpinned; pinned again it comes
// back from the tiers, and a restart keeps the pin and brings its KV back from disk.
TEST(LiveCommandsTest, APinnedSessionStaysInDecodeMemory) {
    DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
    const std::string dir =
        (fs::temp_directory_path() / ("ds_live_pin_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    const std::vector<std::string> args = {"--data-dir",  dir,  "--rpc-port",    "0",
                                           "--admin-key", kKey, "--kv-sessions", "1"};
    auto server = std::make_unique<ServingProcess>(serve_args(args));
    ASSERT_NE(server->port(), 0) << server->log();
    std::string at = "127.0.0.1:" + std::to_string(rpc_port(*server));
    const auto ask = [&](const std::string& id) {
        const HttpResponse r = post_chat(server->port(), chat_body("Hello there, " + id + ".", 4),
                                         "X-Session-ID: " + id + "\r\n");
        ASSERT_EQ(r.status, 200) << r.body;
    };
    const auto rows = [&] {
        return by_id(
            json_of(deltactl({"sessions", "--server", at, "--admin-key", kKey, "--json"})));
    };
    for (const char* id : {"a", "b"}) ASSERT_EQ(open_session(server->port(), id), 200);
    ask("a");
    const CliResult pinned = deltactl({"pin", "a", "--server", at, "--admin-key", kKey});
    ASSERT_EQ(pinned.exit_code, 0) << pinned.describe();
    ask("b");
    ask("b");
    auto now = rows();
    EXPECT_EQ(now.at("a")["pinned"], true) << now.at("a").dump();
    EXPECT_GT(now.at("a")["decode_bytes"].get<int64_t>(), 0) << "pinned: still in decode memory";
    EXPECT_EQ(now.at("b")["pinned"], false);
    EXPECT_EQ(deltactl({"unpin", "a", "--server", at, "--admin-key", kKey}).exit_code, 0);
    ask("b");
    now = rows();
    EXPECT_EQ(now.at("a")["pinned"], false);
    EXPECT_TRUE(now.at("a")["decode_bytes"].is_null()) << "unpinned: the LRU took it";
    // Pinned again: its KV comes back from the tiers.
    const CliResult again = deltactl({"pin", "a", "--server", at, "--admin-key", kKey});
    ASSERT_EQ(again.exit_code, 0) << again.describe();
    now = rows();
    EXPECT_GT(now.at("a")["decode_bytes"].get<int64_t>(), 0) << now.at("a").dump();
    EXPECT_EQ(now.at("a")["decode_tokens"], now.at("a")["stored_tokens"]) << now.at("a").dump();
    EXPECT_EQ(deltactl({"pin", "nobody", "--server", at, "--admin-key", kKey}).exit_code, 1);
    // A restart keeps the pin, and the server takes a's KV back from disk as it starts.
    EXPECT_EQ(server->stop(), 0);
    server = std::make_unique<ServingProcess>(serve_args(args));
    ASSERT_NE(server->port(), 0) << server->log();
    at = "127.0.0.1:" + std::to_string(rpc_port(*server));
    for (int i = 0; i < 100; ++i) {  // the pins are taken off the start's path
        now = rows();
        if (!now.at("a")["decode_bytes"].is_null()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(now.at("a")["pinned"], true) << now.at("a").dump();
    EXPECT_GT(now.at("a")["decode_bytes"].get<int64_t>(), 0) << now.at("a").dump();
    EXPECT_TRUE(now.at("b")["decode_bytes"].is_null()) << now.at("b").dump();
    ask("b");
    ask("b");
    now = rows();
    EXPECT_GT(now.at("a")["decode_bytes"].get<int64_t>(), 0) << "pinned across the restart";
    EXPECT_EQ(now.at("b")["pinned"], false);
    // --watch: the view again each interval, one JSON document a line.
    const CliResult watched = deltactl({"sessions", "--server", at, "--admin-key", kKey, "--json",
                                        "--watch", "--interval", "0.2", "--count", "3"});
    EXPECT_EQ(watched.exit_code, 0) << watched.describe();
    std::istringstream lines(watched.out);
    int views = 0;
    for (std::string line; std::getline(lines, line); ++views) {
        const auto view = by_id(json::parse(line, nullptr, false));
        EXPECT_EQ(view.size(), 2u) << line;
    }
    EXPECT_EQ(views, 3) << watched.out;
    const CliResult table = deltactl({"tiers", "--server", at, "--admin-key", kKey, "--watch",
                                      "--interval", "0.1", "--count", "2"});
    EXPECT_EQ(table.exit_code, 0) << table.describe();
    size_t headers = 0;
    for (size_t i = table.out.find("Every 0.1s: deltactl tiers"); i != std::string::npos;
         i = table.out.find("Every 0.1s: deltactl tiers", i + 1))
        ++headers;
    EXPECT_NE(table.out.find("decode-0  disk"), std::string::npos) << table.out;
    EXPECT_EQ(headers, 2u) << table.out;
    EXPECT_EQ(deltactl({"sessions", "--watch", "--data-dir", dir}).exit_code, 2)
        << "a data dir does not change: --watch is for a running server";
    EXPECT_EQ(server->stop(), 0);
    fs::remove_all(dir);
}

TEST(LiveCommandsTest, BadServerAddressesAreUsageErrors) {
    EXPECT_EQ(deltactl({"sessions", "--server", "nonsense"}).exit_code, 2);
    EXPECT_EQ(deltactl({"sessions", "--server", "127.0.0.1:99999"}).exit_code, 2);
    EXPECT_EQ(deltactl({"sessions", "--server", "127.0.0.1:1", "--page-size", "0"}).exit_code, 2);
    // Nothing listens on port 1: an error naming the server, exit code 1.
    const CliResult r = deltactl({"tiers", "--server", "127.0.0.1:1"});
    EXPECT_EQ(r.exit_code, 1) << r.describe();
    EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deltaserve::testing
