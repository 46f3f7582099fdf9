// The prefill and decode workers together, as DESIGN.md's chat turn runs them: a turn's KV
// computed by a prefill worker and shipped over a real transport (in-process, UCX over tcp)
// gives the decode worker the same greedy answer as prefilling on the decode node; later turns
// pull the session's history; turns run batched; failures end turns with clear errors.
#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "decode_turns.h"
#include "default_model.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/decode/kv_stream_io.h"
#include "deltaserve/prefill/prefill_worker.h"
#include "deltaserve/transport/kv_stream.h"
#include "deltaserve/transport/transport_factory.h"
#include "test_paths.h"

namespace deltaserve {
namespace {

using decode::TurnEnd;
using decode::TurnSpec;

using testing::CollectingSink;
using testing::greedy_turn;

class Disaggregated : public testing::DefaultModelTest {
  protected:
    static model::ContextOptions context(const std::string& policy) {
        model::ContextOptions co;
        co.n_ctx = 2048;
        co.n_threads = 2;
        co.n_batch = 256;
        co.kv.policy = policy;
        co.kv.keep = policy == "full" ? 1.0f : 0.3f;
        co.kv_profile = policy == "deltakv" ? testing::default_deltakv_profile() : "";
        return co;
    }
    static std::vector<int32_t> prompt(size_t n, size_t skip = 0) {
        return text_tokens(n, skip, true);
    }

    // A decode worker listening on `transport` and a prefill worker that connects to it.
    struct Cluster {
        std::unique_ptr<transport::Transport> transport;
        std::unique_ptr<decode::DecodeWorker> decode;
        std::unique_ptr<prefill::PrefillWorker> prefill;
        std::string address;
        ~Cluster() {
            prefill.reset();
            decode.reset();
        }
        // Starts the turn on the decode node, and on the prefill node when it says so.
        Result<TurnEnd> run(TurnSpec spec, decode::TurnPlan* plan_out = nullptr) {
            auto sink = std::make_shared<CollectingSink>();
            auto plan = decode->start_turn(spec, sink);
            if (!plan.ok()) return plan.status();
            if (plan_out) *plan_out = *plan;
            if (plan->remote_prefill) {
                prefill::PrefillRequest req{spec, address, plan->pull_tokens};
                auto r = prefill->prefill(req);
                if (!r.ok()) decode->cancel(spec.turn_id, r.status());
            }
            auto end = sink->wait();
            if (end.ok()) end->text = sink->text();
            return end;
        }
    };
    // kv_wait_ms: the decode worker's; prefill_batch: the prefill worker's chunk (0: as the
    // decode worker's).
    static std::unique_ptr<Cluster> cluster(const std::string& backend, const std::string& policy,
                                            int32_t local_prefill_max, int32_t prefill_chunk = 0,
                                            int64_t kv_wait_ms = 120'000,
                                            int32_t prefill_batch = 0) {
        auto c = std::make_unique<Cluster>();
        transport::TransportOptions to;
        to.ucx_tls = "tcp";
        auto t = transport::make_transport(backend, to);
        EXPECT_TRUE(t.ok()) << t.error().to_string();
        if (!t.ok()) return nullptr;
        c->transport = std::move(*t);
        decode::DecodeOptions d;
        d.context = context(policy);
        d.threads = 2;
        d.local_prefill_max = local_prefill_max;
        d.prefill_chunk = prefill_chunk;
        d.kv_wait_ms = kv_wait_ms;
        d.model_id = "smollm2";
        auto dw = decode::DecodeWorker::create(*model_, d);
        EXPECT_TRUE(dw.ok()) << dw.error().to_string();
        c->decode = std::move(*dw);
        prefill::PrefillOptions p;
        p.context = context(policy);
        if (prefill_batch > 0) p.context.n_batch = prefill_batch;
        p.model_id = "smollm2";
        auto pw = prefill::PrefillWorker::create(*model_, p, *c->transport);
        EXPECT_TRUE(pw.ok()) << pw.error().to_string();
        c->prefill = std::move(*pw);
        auto address =
            c->decode->listen(*c->transport, backend == "ucx" ? "127.0.0.1:0" : "decode-0");
        EXPECT_TRUE(address.ok()) << address.error().to_string();
        c->address = address.ok() ? *address : "";
        return c;
    }
};

struct Case {
    const char* backend;
    const char* policy;
};
class DisaggregatedTest : public Disaggregated, public ::testing::WithParamInterface<Case> {};

TEST_P(DisaggregatedTest, RemotePrefillGivesTheLocalAnswer) {
    const auto [backend, policy] = GetParam();
    auto local = cluster(backend, policy, 100000);
    auto remote = cluster(backend, policy, 0);
    ASSERT_TRUE(local && remote);
    const auto tokens = prompt(700);
    decode::TurnPlan lp, rp;
    auto a = local->run(greedy_turn(1, tokens), &lp);
    auto b = remote->run(greedy_turn(1, tokens), &rp);
    ASSERT_TRUE(a.ok()) << a.error().to_string();
    ASSERT_TRUE(b.ok()) << b.error().to_string();
    EXPECT_FALSE(lp.remote_prefill);
    EXPECT_TRUE(rp.remote_prefill);
    EXPECT_EQ(a->completion_tokens, 24);
    EXPECT_EQ(a->text, b->text);
    EXPECT_EQ(b->prompt_tokens, 700);
    EXPECT_GT(remote->decode->stats().kv_bytes_received, 0);
    EXPECT_EQ(remote->prefill->stats().requests, 1);
}

TEST_P(DisaggregatedTest, LaterTurnPullsTheHistory) {
    const auto [backend, policy] = GetParam();
    auto remote = cluster(backend, policy, 0);
    auto local = cluster(backend, policy, 100000);
    ASSERT_TRUE(remote && local);
    // The next turn's prompt: the first one again (the gateway re-renders the history), then
    // more; the session's cached tokens (prompt and answer) match it up to where they differ.
    const auto first = prompt(400);
    auto second = first;
    const auto more = prompt(300, 400);
    second.insert(second.end(), more.begin(), more.end());
    std::string texts[2];
    for (auto* c : {remote.get(), local.get()}) {
        decode::TurnPlan plan;
        auto a = c->run(greedy_turn(1, first, "s"), &plan);
        ASSERT_TRUE(a.ok()) << a.error().to_string();
        EXPECT_EQ(plan.pull_tokens, 0);
        auto b = c->run(greedy_turn(2, second, "s"), &plan);
        ASSERT_TRUE(b.ok()) << b.error().to_string();
        EXPECT_EQ(plan.remote_prefill, c == remote.get());
        EXPECT_GE(b->cached_tokens, 400 - 1);
        EXPECT_EQ(plan.pull_tokens, c == remote.get() ? b->cached_tokens : 0);
        texts[c == remote.get() ? 0 : 1] = b->text;
    }
    // Prefilling the new tokens on a prefill node over the pulled history is what the decode
    // node would have computed (for DeltaKV too: the same compressed history, extended).
    EXPECT_EQ(texts[0], texts[1]);
    EXPECT_FALSE(texts[0].empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, DisaggregatedTest,
                         ::testing::Values(Case{"inproc", "full"}, Case{"inproc", "deltakv"},
                                           Case{"ucx", "full"}, Case{"ucx", "deltakv"}),
                         [](const auto& info) {
                             return std::string(info.param.backend) + "_" + info.param.policy;
                         });

TEST_F(Disaggregated, TurnsRunBatchedGiveTheirAloneAnswers) {
    auto c = cluster("inproc", "full", 100000);
    ASSERT_TRUE(c);
    std::vector<std::string> alone;
    for (int i = 0; i < 4; ++i) {
        auto r = c->run(greedy_turn(10 + i, prompt(60 + 20 * i, 50 * i)));
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        alone.push_back(r->text);
    }
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int i = 0; i < 4; ++i) {
        sinks.push_back(std::make_shared<CollectingSink>());
        ASSERT_TRUE(
            c->decode->start_turn(greedy_turn(20 + i, prompt(60 + 20 * i, 50 * i)), sinks.back())
                .ok());
    }
    for (int i = 0; i < 4; ++i) {
        auto r = sinks[i]->wait();
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        EXPECT_EQ(sinks[i]->text(), alone[i]) << "turn " << i;
    }
}

// A long prompt prefilled on the decode node goes a chunk per pass, inside the passes that
// decode the others (chunked prefill): a turn that is generating keeps streaming meanwhile.
// (Answers are not compared: a row's float rounding depends on its place in the batch.)
TEST_F(Disaggregated, ALongLocalPrefillDoesNotStallGeneratingTurns) {
    auto c = cluster("inproc", "full", 100000, 32);
    struct Timed : CollectingSink {
        std::vector<std::chrono::steady_clock::time_point> at;  // read after wait()
        std::atomic<bool> started{false};
        bool on_piece(std::string_view p) override {
            at.push_back(std::chrono::steady_clock::now());
            started = true;
            return CollectingSink::on_piece(p);
        }
    };
    auto talker = std::make_shared<Timed>();
    auto reader = std::make_shared<Timed>();
    ASSERT_TRUE(c->decode->start_turn(greedy_turn(1, prompt(20), "", 48), talker).ok());
    while (!talker->started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(c->decode->start_turn(greedy_turn(2, prompt(800, 100), "", 8), reader).ok());
    ASSERT_TRUE(talker->wait().ok());
    auto r = reader->wait();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->prompt_tokens, 800);
    ASSERT_FALSE(reader->at.empty());
    const auto during = std::count_if(talker->at.begin(), talker->at.end(),
                                      [&](auto t) { return t < reader->at.front(); });
    EXPECT_GE(during, 10)
        << "pieces of the generating turn while the 800-token prompt prefilled (25 passes)";
}

// Notes where its turn's first piece came among the turns sharing `order`.
struct Ordered : CollectingSink {
    explicit Ordered(std::atomic<int>& o) : order(o) {}
    std::atomic<int>& order;
    int first = -1;
    bool on_piece(std::string_view p) override {
        if (first < 0) first = order++;
        return CollectingSink::on_piece(p);
    }
};

// Prompts prefilled on the decode node go first come, first served: the earliest takes each
// pass's budget until it is done, so the first answers begin one after another instead of
// every prompt finishing late together (the turn ids, which order the worker's table, run
// the other way here).
TEST_F(Disaggregated, LocalPromptsPrefillInTheOrderTheyCame) {
    auto c = cluster("inproc", "full", 100000, 64);
    ASSERT_TRUE(c);
    std::atomic<int> order{0};
    std::vector<std::shared_ptr<Ordered>> sinks;
    for (int i = 0; i < 3; ++i) {
        sinks.push_back(std::make_shared<Ordered>(order));
        ASSERT_TRUE(
            c->decode
                ->start_turn(greedy_turn(30 - 10 * i, prompt(600, 100 * i), "", 2), sinks.back())
                .ok());
    }
    for (int i = 0; i < 3; ++i) {
        auto r = sinks[i]->wait();
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        EXPECT_EQ(sinks[i]->first, i) << "prompt " << i << " in the order they came";
    }
}

// A prompt that fits in one pass's chunk (a question, a session's new message) goes before
// the longer ones that came first: it does not wait for a document's whole prefill.
TEST_F(Disaggregated, AShortPromptDoesNotWaitBehindALongOne) {
    auto c = cluster("inproc", "full", 100000, 64);
    ASSERT_TRUE(c);
    std::atomic<int> order{0};
    auto reader = std::make_shared<Ordered>(order), asker = std::make_shared<Ordered>(order);
    // 1200 tokens: 5 passes of 256 at least, 64 a pass once the question generates.
    ASSERT_TRUE(c->decode->start_turn(greedy_turn(1, prompt(1200), "", 2), reader).ok());
    ASSERT_TRUE(c->decode->start_turn(greedy_turn(2, prompt(40, 2000), "", 2), asker).ok());
    for (auto* s : {&asker, &reader}) {
        auto r = (*s)->wait();
        ASSERT_TRUE(r.ok()) << r.error().to_string();
    }
    EXPECT_EQ(asker->first, 0) << "the 40-token prompt answered first";
    EXPECT_EQ(reader->first, 1);
}

// The KV wait is a wait for a sign of the KV, not for all of it: a prompt whose prefill takes
// longer than the wait but streams its rows (a chunk at a time) is admitted; a turn whose KV
// never starts fails once the wait ran out, with a clear error.
TEST_F(Disaggregated, TheKvWaitRunsFromTheStreamsLastMessage) {
    constexpr int64_t kWaitMs = 1500;
    auto c = cluster("inproc", "full", 0, 0, kWaitMs, 64);
    ASSERT_TRUE(c);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c->run(greedy_turn(1, prompt(1000), "", 4));
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    ASSERT_TRUE(r.ok()) << r.status().to_string() << " after " << took << " ms";
    EXPECT_GT(took, kWaitMs) << "the prefill took less than the wait: this tested nothing";
    auto silent = std::make_shared<CollectingSink>();
    ASSERT_TRUE(c->decode->start_turn(greedy_turn(2, prompt(600)), silent).ok());
    auto end = silent->wait();
    EXPECT_EQ(end.status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(end.status().message().find("1500 ms"), std::string::npos) << end.status().message();
}

TEST_F(Disaggregated, CancelAndFailuresEndTurnsClearly) {
    auto c = cluster("inproc", "full", 0);
    ASSERT_TRUE(c);
    // The client goes away after two pieces.
    auto quitter = std::make_shared<CollectingSink>(2);
    auto spec = greedy_turn(1, prompt(50), "s", 100);
    auto plan = c->decode->start_turn(spec, quitter);
    ASSERT_TRUE(plan.ok());
    ASSERT_TRUE(c->prefill->prefill({spec, c->address, 0}).ok());
    auto end = quitter->wait();
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(end->finish_reason, "cancelled");
    // A second turn of a session whose turn still runs is refused.
    auto slow = std::make_shared<CollectingSink>();
    ASSERT_TRUE(c->decode->start_turn(greedy_turn(2, prompt(50), "t"), slow).ok());
    auto again =
        c->decode->start_turn(greedy_turn(3, prompt(50), "t"), std::make_shared<CollectingSink>());
    EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
    c->decode->cancel(2, Status());
    auto e2 = slow->wait();
    ASSERT_TRUE(e2.ok());
    EXPECT_EQ(e2->finish_reason, "cancelled");
    // A prefill node that cannot reach the decode node: the error reaches the turn.
    auto lost = std::make_shared<CollectingSink>();
    auto s4 = greedy_turn(4, prompt(50));
    ASSERT_TRUE(c->decode->start_turn(s4, lost).ok());
    auto r = c->prefill->prefill({s4, "nowhere", 0});
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    c->decode->cancel(4, r.status());
    EXPECT_EQ(lost->wait().status().code(), StatusCode::kUnavailable);
    // Oversized prompts and bad tokens are refused up front.
    EXPECT_EQ(c->decode->start_turn(greedy_turn(5, prompt(5000)), lost).status().code(),
              StatusCode::kOutOfRange);
    EXPECT_EQ(c->decode->start_turn(greedy_turn(6, {1, -3}), lost).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(c->decode->stats().running + c->decode->stats().waiting, 0);
}

TEST_F(Disaggregated, GarbageOnTheDataConnectionFailsOnlyItsStream) {
    auto c = cluster("inproc", "full", 0);
    ASSERT_TRUE(c);
    auto sink = std::make_shared<CollectingSink>();
    auto spec = greedy_turn(1, prompt(40));
    ASSERT_TRUE(c->decode->start_turn(spec, sink).ok());
    auto conn = c->transport->connect(c->address, transport::deadline_in(std::chrono::seconds(5)));
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(
        decode::prove_to_peer(**conn, "", transport::deadline_in(std::chrono::seconds(5))).ok());
    transport::StreamHeader h;
    h.kind = transport::StreamKind::kBegin;
    h.turn = 1;
    h.n_tokens = 40;
    auto head = transport::encode_stream_header(h);
    ASSERT_TRUE(head.ok());
    transport::Message m;
    m.header = *head;
    m.payload = transport::Buffer::copy_of(std::as_bytes(std::span<const char>("not a state", 11)));
    ASSERT_TRUE((*conn)->send(std::move(m), transport::deadline_in(std::chrono::seconds(5))).ok());
    auto end = sink->wait();
    EXPECT_EQ(end.status().code(), StatusCode::kDataLoss) << end.status().to_string();
    transport::Message junk;
    junk.header = {std::byte{1}, std::byte{2}};
    ASSERT_TRUE(
        (*conn)->send(std::move(junk), transport::deadline_in(std::chrono::seconds(5))).ok());
    // The worker still serves turns over other connections.
    auto ok = c->run(greedy_turn(2, prompt(40)));
    EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

// A decode worker with a cluster token: a peer that proves another secret, or sends KV
// before any proof, is dropped before its first message is read as KV; the worker goes on.
TEST_F(Disaggregated, APeerWithoutTheClusterTokenIsRefused) {
    auto t = transport::make_transport("inproc", {});
    ASSERT_TRUE(t.ok());
    decode::DecodeOptions d;
    d.context = context("full");
    d.threads = 1;
    d.cluster_token = "secret";
    auto dw = decode::DecodeWorker::create(*model_, d);
    ASSERT_TRUE(dw.ok());
    auto address = (*dw)->listen(**t, "decode-token");
    ASSERT_TRUE(address.ok());
    const auto soon = [] { return transport::deadline_in(std::chrono::seconds(5)); };
    for (const char* secret : {"guess", ""}) {
        auto conn = (*t)->connect(*address, soon());
        ASSERT_TRUE(conn.ok());
        ASSERT_TRUE(decode::prove_to_peer(**conn, secret, soon()).ok());
        auto m = (*conn)->receive(soon());  // closed on us: no answer ever comes
        EXPECT_FALSE(m.ok()) << secret;
    }
    auto conn = (*t)->connect(*address, soon());
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(decode::prove_to_peer(**conn, "secret", soon()).ok());
    transport::StreamHeader pull;  // with the secret, the worker answers (here: no such KV)
    pull.kind = transport::StreamKind::kPull;
    pull.turn = 9;
    pull.session = "nobody";
    pull.n_tokens = 4;
    ASSERT_TRUE(decode::send_stream_message(**conn, pull, {}, soon()).ok());
    auto answer = (*conn)->receive(soon());
    ASSERT_TRUE(answer.ok()) << answer.status().to_string();
    auto h = transport::decode_stream_header(answer->header);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->kind, transport::StreamKind::kAbort);
}

TEST_F(Disaggregated, SessionsBeyondCapacityAreRecomputed) {
    auto c = cluster("inproc", "full", 100000);
    ASSERT_TRUE(c);
    // Rebuilt with room for one session.
    decode::DecodeOptions d;
    d.context = context("full");
    d.threads = 2;
    d.max_sessions = 1;
    d.prefix_cache_bytes = 0;  // a session's own KV only (the same prompt would be found)
    auto dw = decode::DecodeWorker::create(*model_, d);
    ASSERT_TRUE(dw.ok());
    auto& w = **dw;
    const auto run = [&](uint64_t id, const std::string& s) {
        auto sink = std::make_shared<CollectingSink>();
        auto plan = w.start_turn(greedy_turn(id, prompt(80), s, 4), sink);
        EXPECT_TRUE(plan.ok());
        EXPECT_TRUE(sink->wait().ok());
        return plan.ok() ? plan->cached_tokens : -1;
    };
    EXPECT_EQ(run(1, "a"), 0);
    EXPECT_EQ(run(2, "a"), 79);
    EXPECT_EQ(run(3, "b"), 0);  // drops a
    EXPECT_EQ(run(4, "a"), 0);
    EXPECT_EQ(w.stats().sessions, 1);
}

}  // namespace
}  // namespace deltaserve
