// The Cap'n Proto chat and admin services of `deltaserve serve --rpc-port 0`, spoken to by a
// real Cap'n Proto client: a session's answers stream to a sink the client hosts and equal the
// HTTP API's, later turns reuse the session's KV, cancel and close work, the admin service
// sees the sessions, and bad input gets clear errors while the server stays up.
#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "chat.capnp.h"
#include "deltaserve/common/status.h"
#include "serving.h"

namespace deltaserve::testing {
namespace {

namespace rpc = api::rpc;

class Sink final : public rpc::TokenSink::Server {
  public:
    Sink(std::string& text, int& pieces,
         kj::Maybe<rpc::ChatSession::Client> cancel_after_first = nullptr)
        : text_(text), pieces_(pieces), cancel_(kj::mv(cancel_after_first)) {}
    kj::Promise<void> piece(PieceContext context) override {
        text_ += context.getParams().getText().cStr();
        if (++pieces_ == 1) {
            KJ_IF_MAYBE (s, cancel_) {
                return s->cancelRequest().send().ignoreResult();
            }
        }
        return kj::READY_NOW;
    }
    kj::Promise<void> end(EndContext) override { return kj::READY_NOW; }

  private:
    std::string& text_;
    int& pieces_;
    kj::Maybe<rpc::ChatSession::Client> cancel_;
};

struct Answer {
    std::string error, finish, text, streamed;
    int cached = 0, completion = 0, pieces = 0;
};

Answer send(capnp::EzRpcClient& client, rpc::ChatSession::Client session, const std::string& role,
            const std::string& content, int max_tokens, float temperature = 0, bool cancel = false,
            const std::string& json_schema = "") {
    Answer a;
    auto req = session.sendRequest();
    auto m = req.initMessages(1);
    m[0].setRole(role);
    m[0].setContent(content);
    auto o = req.initOptions();
    o.initSampling().setTemperature(temperature);
    o.getSampling().setTopP(1.0f);
    o.setSeedGiven(true);
    o.setMaxTokens(max_tokens);
    o.setJsonSchema(json_schema);
    req.setSink(kj::heap<Sink>(a.streamed, a.pieces,
                               cancel ? kj::Maybe<rpc::ChatSession::Client>(session)
                                      : kj::Maybe<rpc::ChatSession::Client>(nullptr)));
    auto r = req.send().wait(client.getWaitScope());
    if (r.hasError()) {
        a.error = r.getError().getMessage().cStr();
        return a;
    }
    a.finish = r.getFinishReason().cStr();
    a.text = r.getText().cStr();
    a.cached = r.getUsage().getCachedTokens();
    a.completion = r.getUsage().getCompletionTokens();
    return a;
}

uint16_t rpc_port(const ServingProcess& s) {
    const size_t at = s.log().find("chat RPC on port ");
    return at == std::string::npos ? 0
                                   : static_cast<uint16_t>(std::atoi(s.log().c_str() + at + 17));
}

class ChatRpcTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

// The admin service pages sessions with where their KV is while a turn streams on the same
// decode worker (the page's lookups take the worker's lock between its steps): every session
// once, in key order, and the stream ends whole. Under TSan this is the admin path's race
// check.
TEST_F(ChatRpcTest, AdminPagesSessionsWhileATurnStreams) {
    ServingProcess server(serve_args({"--rpc-port", "0", "--admin-key", "k"}));
    ASSERT_NE(server.port(), 0) << server.log();
    for (int i = 0; i < 5; ++i) {
        const std::string id = "s" + std::to_string(i);
        ASSERT_EQ(open_session(server.port(), id), 200);
        ASSERT_EQ(
            post_chat(server.port(), chat_body("Hi.", 2), "X-Session-ID: " + id + "\r\n").status,
            200);
    }
    std::thread streamer([&] {
        const HttpResponse r = post_chat(server.port(), chat_body("Count to fifty.", 96, true));
        EXPECT_EQ(r.status, 200);
        EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
    });
    capnp::EzRpcClient client("127.0.0.1", rpc_port(server));
    auto& ws = client.getWaitScope();
    auto req = client.getMain<rpc::Gateway>().adminRequest();
    req.setAdminKey("k");
    auto admin = req.send().wait(ws).getAdmin();
    for (int round = 0; round < 50; ++round) {
        std::vector<std::string> ids;
        std::string after;
        do {
            auto page = admin.sessionPageRequest();
            page.setAfter(after);
            page.setLimit(2);
            auto r = page.send().wait(ws);
            for (auto row : r.getSessions()) {
                ids.emplace_back(row.getId().cStr());
                EXPECT_EQ(row.getNode(), "decode-0");
                EXPECT_EQ(row.getKv().getId(), "/" + ids.back());
                EXPECT_EQ(row.getKv().getTokens() > 0, true);
            }
            after = r.getNext().cStr();
        } while (!after.empty());
        EXPECT_EQ(ids, (std::vector<std::string>{"s0", "s1", "s2", "s3", "s4"}));
    }
    streamer.join();
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ChatRpcTest, SessionsStreamLikeHttpAndAdminSeesThem) {
    ServingProcess server(serve_args({"--rpc-port", "0"}));
    ASSERT_NE(server.port(), 0) << server.log();
    ASSERT_NE(rpc_port(server), 0) << server.log();
    capnp::EzRpcClient client("127.0.0.1", rpc_port(server));
    auto& ws = client.getWaitScope();
    auto gateway = client.getMain<rpc::Gateway>();
    auto chat = gateway.chatRequest().send().getService();
    auto admin = gateway.adminRequest().send().getAdmin();
    auto open = chat.createRequest();
    open.setSessionId("ada");
    rpc::ChatSession::Client session = open.send().getSession();

    const std::string q = "What is the capital of France?";
    Answer a = send(client, session, "user", q, 16);
    ASSERT_EQ(a.error, "");
    EXPECT_FALSE(a.text.empty());
    EXPECT_EQ(a.streamed, a.text) << "every piece reached the sink before send returned";
    const HttpResponse h = post_chat(server.port(), chat_body(q, 16));
    ASSERT_EQ(h.status, 200) << h.body;
    EXPECT_EQ(json::parse(h.body)["choices"][0]["message"]["content"], a.text);

    Answer b = send(client, session, "user", "And of Germany?", 16);
    ASSERT_EQ(b.error, "");
    EXPECT_GT(b.cached, 20) << "the session's history was not prefilled again";
    auto info = session.infoRequest().send().wait(ws);
    EXPECT_EQ(std::string(info.getId().cStr()), "ada");
    EXPECT_EQ(info.getMessages(), 4);

    auto listed = admin.sessionsRequest().send().wait(ws);
    ASSERT_EQ(listed.getSessions().size(), 1u);
    EXPECT_EQ(std::string(listed.getSessions()[0].getId().cStr()), "ada");
    EXPECT_GT(admin.statsRequest().send().wait(ws).getKvBytes(), 0);
    session.closeRequest().send().wait(ws);
    EXPECT_EQ(admin.sessionsRequest().send().wait(ws).getSessions().size(), 0u);
    // A closed session is gone: reopening it is an error, never a new conversation.
    auto reopen = chat.openRequest();
    reopen.setSessionId("ada");
    auto gone = reopen.send().wait(ws);
    ASSERT_TRUE(gone.hasError());
    EXPECT_EQ(gone.getError().getCode(), static_cast<uint8_t>(StatusCode::kNotFound));
}

// With keys: a wrong key gets no service, sessions are the opening key's alone, the admin
// service needs the admin key, and sampling values that make no sense are refused.
TEST_F(ChatRpcTest, KeysSeparateTenantsAndGuardTheAdminService) {
    ServingProcess server(
        serve_args({"--rpc-port", "0", "--api-key", "key-a,key-b", "--admin-key", "adm"}));
    ASSERT_NE(rpc_port(server), 0) << server.log();
    capnp::EzRpcClient client("127.0.0.1", rpc_port(server));
    auto& ws = client.getWaitScope();
    auto gateway = client.getMain<rpc::Gateway>();
    auto chat_as = [&](const char* key) {
        auto r = gateway.chatRequest();
        r.setApiKey(key);
        return r.send().wait(ws);
    };
    auto wrong = chat_as("key-c");
    ASSERT_TRUE(wrong.hasError());
    EXPECT_EQ(wrong.getError().getCode(), static_cast<uint8_t>(StatusCode::kUnauthenticated));
    EXPECT_TRUE(chat_as("").hasError());

    auto a = chat_as("key-a").getService();
    auto create = a.createRequest();
    create.setSessionId("shared-name");
    rpc::ChatSession::Client mine = create.send().getSession();
    ASSERT_EQ(send(client, mine, "user", "My name is Ada.", 4).error, "");
    // key-b does not see it, and may use the same name for a session of its own.
    auto b = chat_as("key-b").getService();
    auto peek = b.openRequest();
    peek.setSessionId("shared-name");
    auto peeked = peek.send().wait(ws);
    ASSERT_TRUE(peeked.hasError());
    EXPECT_EQ(peeked.getError().getCode(), static_cast<uint8_t>(StatusCode::kNotFound));
    auto own = b.createRequest();
    own.setSessionId("shared-name");
    EXPECT_FALSE(own.send().wait(ws).hasError());

    auto admin_as = [&](const char* key) {
        auto r = gateway.adminRequest();
        r.setAdminKey(key);
        return r.send().wait(ws);
    };
    EXPECT_TRUE(admin_as("key-a").hasError()) << "a chat key does not open the admin service";
    auto listed = admin_as("adm").getAdmin().sessionsRequest().send().wait(ws);
    EXPECT_EQ(listed.getSessions().size(), 2u);

    // A NaN temperature and a repetition penalty below zero are refused, naming the field.
    std::string streamed;
    int pieces = 0;
    for (const float nan_or_negative : {std::nanf(""), -1.0f}) {
        auto req = mine.sendRequest();
        auto m = req.initMessages(1);
        m[0].setRole("user");
        m[0].setContent("hi");
        auto o = req.initOptions();
        o.initSampling().setTemperature(std::isnan(nan_or_negative) ? nan_or_negative : 0.5f);
        if (!std::isnan(nan_or_negative)) o.getSampling().setRepeatPenalty(nan_or_negative);
        req.setSink(kj::heap<Sink>(streamed, pieces));
        auto r = req.send().wait(ws);
        ASSERT_TRUE(r.hasError());
        EXPECT_NE(std::string(r.getError().getMessage().cStr())
                      .find(std::isnan(nan_or_negative) ? "temperature" : "repetition_penalty"),
                  std::string::npos)
            << r.getError().getMessage().cStr();
    }
}

// Structured output over the chat service: the same schema check as HTTP's response_format
// (a keyword it cannot enforce is refused by name), and an answer that is the schema's value.
TEST_F(ChatRpcTest, AResponseSchemaIsEnforcedOrRefusedByName) {
    ServingProcess server(serve_args({"--rpc-port", "0"}));
    ASSERT_NE(server.port(), 0) << server.log();
    ASSERT_NE(rpc_port(server), 0) << server.log();
    capnp::EzRpcClient client("127.0.0.1", rpc_port(server));
    auto chat = client.getMain<rpc::Gateway>().chatRequest().send().getService();
    auto open = chat.createRequest();
    open.setSessionId("json");
    rpc::ChatSession::Client session = open.send().getSession();
    const std::string schema =
        R"({"type":"object","properties":{"capital":{"enum":["Paris","Rome"]}},)"
        R"("required":["capital"],"additionalProperties":false})";
    Answer a =
        send(client, session, "user", "What is the capital of France?", 48, 0, false, schema);
    ASSERT_EQ(a.error, "");
    EXPECT_EQ(a.finish, "stop");
    const auto v = json::parse(a.text, nullptr, false);
    ASSERT_TRUE(v.is_object()) << a.text;
    EXPECT_TRUE(v["capital"] == "Paris" || v["capital"] == "Rome") << a.text;
    EXPECT_EQ(v.size(), 1u) << a.text;
    Answer bad =
        send(client, session, "user", "Again.", 8, 0, false, R"({"type":"string","pattern":"^P"})");
    EXPECT_NE(bad.error.find("'pattern'"), std::string::npos) << bad.error;
    EXPECT_EQ(server.stop(), 0) << server.log();
}

// Tools and logprobs as the HTTP API takes them (the same checks): a forced call comes back
// in toolCalls, the tool's answer goes in a tool message with its call's id, and each answer
// token's logprobs come with the answer.
TEST_F(ChatRpcTest, ToolsAndLogprobsAsHttpHasThem) {
    const std::string qwen = models_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja";
    DS_REQUIRE_FILE(qwen, "the chat template corpus (deploy/setup.sh)");
    ServingProcess server(
        serve_args({"--rpc-port", "0", "--chat-template", qwen, "--ctx-size", "2048"}));
    ASSERT_NE(server.port(), 0) << server.log();
    ASSERT_NE(rpc_port(server), 0) << server.log();
    capnp::EzRpcClient client("127.0.0.1", rpc_port(server));
    auto chat = client.getMain<rpc::Gateway>().chatRequest().send().getService();
    auto open = chat.createRequest();
    open.setSessionId("tools");
    rpc::ChatSession::Client session = open.send().getSession();
    const std::string tools =
        R"([{"type":"function","function":{"name":"get_weather","parameters":)"
        R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],)"
        R"("additionalProperties":false}}}])";
    std::string streamed;
    int pieces = 0;

    auto req = session.sendRequest();
    auto m = req.initMessages(1);
    m[0].setRole("user");
    m[0].setContent("What is the weather in Paris?");
    auto o = req.initOptions();
    o.initSampling().setTemperature(0);
    o.setMaxTokens(48);
    o.setTools(tools);
    o.setToolChoice(R"("required")");
    req.setSink(kj::heap<Sink>(streamed, pieces));
    auto r = req.send().wait(client.getWaitScope());
    ASSERT_FALSE(r.hasError()) << r.getError().getMessage().cStr();
    EXPECT_EQ(std::string(r.getFinishReason().cStr()), "tool_calls");
    ASSERT_EQ(r.getToolCalls().size(), 1u);
    const auto call = r.getToolCalls()[0];
    EXPECT_EQ(std::string(call.getName().cStr()), "get_weather");
    const json args = json::parse(call.getArguments().cStr(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call.getArguments().cStr();
    EXPECT_TRUE(args["city"].is_string()) << args.dump();
    const std::string call_id = call.getId().cStr();

    // The tool's answer, and the next answer's logprobs.
    auto next = session.sendRequest();
    m = next.initMessages(1);
    m[0].setRole("tool");
    m[0].setContent(R"({"temperature": 11})");
    m[0].setToolCallId(call_id);
    o = next.initOptions();
    o.initSampling().setTemperature(0);
    o.setMaxTokens(6);
    o.setTools(tools);
    o.setTopLogprobs(2);
    next.setSink(kj::heap<Sink>(streamed, pieces));
    auto r2 = next.send().wait(client.getWaitScope());
    ASSERT_FALSE(r2.hasError()) << r2.getError().getMessage().cStr();
    ASSERT_EQ(r2.getLogprobs().size(), static_cast<unsigned>(r2.getUsage().getCompletionTokens()));
    std::string joined;
    for (auto e : r2.getLogprobs()) {
        joined.append(reinterpret_cast<const char*>(e.getChosen().getBytes().begin()),
                      e.getChosen().getBytes().size());
        EXPECT_LE(e.getChosen().getLogprob(), 0.0f);
        EXPECT_EQ(e.getTop().size(), 2u);
    }
    EXPECT_EQ(joined, std::string(r2.getText().cStr()));

    // What HTTP refuses, refused by name.
    const auto refused = [&](const char* role, const char* call_id_given, const char* choice,
                             int top) {
        auto bad = session.sendRequest();
        auto bm = bad.initMessages(1);
        bm[0].setRole(role);
        bm[0].setContent("x");
        bm[0].setToolCallId(call_id_given);
        auto bo = bad.initOptions();
        bo.setMaxTokens(2);
        bo.setTools(tools);
        bo.setToolChoice(choice);
        bo.setTopLogprobs(top);
        bad.setSink(kj::heap<Sink>(streamed, pieces));
        auto br = bad.send().wait(client.getWaitScope());
        return br.hasError() ? std::string(br.getError().getMessage().cStr()) : std::string();
    };
    EXPECT_NE(refused("tool", "", "", -1).find("tool_call_id"), std::string::npos);
    EXPECT_NE(refused("user", "", R"({"type":"function","function":{"name":"nope"}})", -1)
                  .find("tool_choice"),
              std::string::npos);
    EXPECT_NE(refused("user", "", "[1,", -1).find("tool_choice"), std::string::npos);
    EXPECT_NE(refused("user", "", "", 21).find("top_logprobs"), std::string::npos);
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ChatRpcTest, CancelAndBadInputAreClear) {
    ServingProcess server(serve_args({"--rpc-port", "0"}));
    ASSERT_NE(rpc_port(server), 0) << server.log();
    {
        capnp::EzRpcClient client("127.0.0.1", rpc_port(server));
        auto chat = client.getMain<rpc::Gateway>().chatRequest().send().getService();
        rpc::ChatSession::Client session = chat.openRequest().send().getSession();
        Answer c = send(client, session, "user", "Tell me a very long story about a dragon.", 300,
                        1.5f, true);
        ASSERT_EQ(c.error, "");
        EXPECT_EQ(c.finish, "cancelled");
        EXPECT_LT(c.completion, 300);
        EXPECT_NE(send(client, session, "robot", "hi", 4).error.find("unknown role"),
                  std::string::npos);
    }
    // Bytes that are not Cap'n Proto.
    (void)http_raw(rpc_port(server), std::string(64, '\xff') + "junk", 2000);
    capnp::EzRpcClient client("127.0.0.1", rpc_port(server));
    auto chat = client.getMain<rpc::Gateway>().chatRequest().send().getService();
    Answer ok = send(client, chat.openRequest().send().getSession(), "user", "Hello", 4);
    EXPECT_EQ(ok.error, "");
    EXPECT_FALSE(ok.text.empty());
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
