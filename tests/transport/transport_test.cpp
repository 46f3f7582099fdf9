// The transport contract (transport.h) on every backend: in-process, UCX over tcp, UCX over
// shared memory. Real UCX on the loopback interface; nothing mocked.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "deltaserve/transport/transport_factory.h"

namespace deltaserve::transport {
namespace {

using namespace std::chrono_literals;

struct Backend {
    const char* label;
    const char* name;
    const char* tls;
    const char* rndv_scheme = "";  // ucx: TransportOptions::ucx_rndv_scheme
};

void PrintTo(const Backend& b, std::ostream* os) { *os << b.label; }

// A payload whose bytes depend on the message's number, so reordering or corruption shows.
Buffer make_payload(size_t bytes, uint32_t seq) {
    Buffer b = Buffer::heap(bytes);
    for (size_t i = 0; i < bytes; ++i) b.data()[i] = static_cast<std::byte>((i * 131 + seq) & 0xff);
    return b;
}

bool payload_ok(const Buffer& b, size_t bytes, uint32_t seq) {
    if (b.size() != bytes) return false;
    for (size_t i = 0; i < bytes; ++i) {
        if (b.data()[i] != static_cast<std::byte>((i * 131 + seq) & 0xff)) return false;
    }
    return true;
}

Message make_message(uint32_t seq, size_t bytes) {
    Message m;
    m.header.resize(sizeof(seq));
    std::memcpy(m.header.data(), &seq, sizeof(seq));
    m.payload = make_payload(bytes, seq);
    return m;
}

uint32_t seq_of(const Message& m) {
    uint32_t seq = ~0u;
    if (m.header.size() == sizeof(seq)) std::memcpy(&seq, m.header.data(), sizeof(seq));
    return seq;
}

// Sends n messages made by make(i) from another thread while this one receives them: each
// must arrive in order, its payload of expected_bytes(i) bytes intact.
template <typename Make, typename Bytes>
void stream_in_order(Connection& from, Connection& to, uint32_t n, Make make,
                     Bytes expected_bytes) {
    std::thread sender([&] {
        for (uint32_t i = 0; i < n; ++i) ASSERT_TRUE(from.send(make(i), deadline_in(20s)).ok());
        EXPECT_TRUE(from.flush(deadline_in(20s)).ok());
    });
    for (uint32_t i = 0; i < n; ++i) {
        auto m = to.receive(deadline_in(20s));
        if (!m.ok()) {
            ADD_FAILURE() << m.error().to_string();
            break;
        }
        if (seq_of(*m) != i || !payload_ok(m->payload, expected_bytes(i), i)) {
            ADD_FAILURE() << "message " << i << " arrived out of order or damaged";
            break;
        }
    }
    sender.join();
}

class TransportTest : public ::testing::TestWithParam<Backend> {
  protected:
    std::unique_ptr<Transport> make(TransportOptions options = {}) {
        options.ucx_tls = GetParam().tls;
        options.ucx_rndv_scheme = GetParam().rndv_scheme;
        auto t = make_transport(GetParam().name, options);
        EXPECT_TRUE(t.ok()) << t.error().to_string();
        return t.ok() ? std::move(*t) : nullptr;
    }
    std::string any_address() const {
        return std::string(GetParam().name) == "ucx" ? "127.0.0.1:0" : "test-node";
    }

    // Listens on `server`, connects from `client`; the accepted end goes to *accepted.
    std::unique_ptr<Connection> connect_pair(Transport& server, Transport& client,
                                             std::unique_ptr<Listener>& listener,
                                             std::unique_ptr<Connection>& accepted) {
        auto l = server.listen(any_address());
        EXPECT_TRUE(l.ok()) << l.error().to_string();
        if (!l.ok()) return nullptr;
        listener = std::move(*l);
        auto c = client.connect(listener->address(), deadline_in(10s));
        EXPECT_TRUE(c.ok()) << c.error().to_string();
        auto a = listener->accept(deadline_in(10s));
        EXPECT_TRUE(a.ok()) << a.error().to_string();
        if (!c.ok() || !a.ok()) return nullptr;
        accepted = std::move(*a);
        return std::move(*c);
    }
};

TEST_P(TransportTest, MessagesOfEverySizeArriveInOrderAndIntact) {
    auto t = make();
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);

    // Small (eager) and large (rendezvous) messages interleaved: order must still hold.
    const size_t sizes[] = {0, 1, 100, 8 << 10, 300 << 10, 3 << 20};
    const uint32_t n = 60;
    auto bytes = [&](uint32_t i) { return sizes[i % 6]; };
    stream_in_order(
        *client, *server, n, [&](uint32_t i) { return make_message(i, bytes(i)); }, bytes);
    EXPECT_EQ(client->stats().messages_sent, n);
    EXPECT_EQ(server->stats().messages_received, n);
    EXPECT_EQ(server->stats().bytes_received, client->stats().bytes_sent);

    // And the other way.
    ASSERT_TRUE(server->send(make_message(7, 1 << 20), deadline_in(10s)).ok());
    auto back = client->receive(deadline_in(10s));
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_TRUE(payload_ok(back->payload, 1 << 20, 7));
}

TEST_P(TransportTest, EmptyMessagesTravelAndFlush) {
    auto t = make();
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->send(Message{}, deadline_in(5s)).ok());
    Status flushed = client->flush(deadline_in(5s));
    EXPECT_TRUE(flushed.ok()) << flushed.to_string();
    for (int i = 0; i < 3; ++i) {
        auto m = server->receive(deadline_in(5s));
        ASSERT_TRUE(m.ok()) << m.error().to_string();
        EXPECT_TRUE(m->header.empty());
        EXPECT_TRUE(m->payload.empty());
    }
}

TEST_P(TransportTest, PoolBuffersTravelAndComeBack) {
    TransportOptions options;
    options.pool_bytes = 8 << 20;
    auto t = make(options);
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);

    auto buffer = t->allocate(2 << 20, deadline_in(1s));
    ASSERT_TRUE(buffer.ok()) << buffer.error().to_string();
    ASSERT_NE(buffer->pool(), nullptr);
    Buffer reference = make_payload(2 << 20, 3);
    std::memcpy(buffer->data(), reference.data(), reference.size());
    Message m;
    m.header = {std::byte{1}};
    m.payload = std::move(*buffer);
    ASSERT_TRUE(client->send(std::move(m), deadline_in(10s)).ok());
    auto got = server->receive(deadline_in(10s));
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    EXPECT_TRUE(payload_ok(got->payload, 2 << 20, 3));
    ASSERT_TRUE(client->flush(deadline_in(10s)).ok());

    // A buffer larger than the whole pool comes from the heap instead of waiting forever.
    auto huge = t->allocate(16 << 20, deadline_in(1s));
    ASSERT_TRUE(huge.ok());
    EXPECT_EQ(huge->pool(), nullptr);
}

// Between processes of one host (here: one process, the same kernel path) UCX with shared
// memory moves pool payloads through the sender's pool mapped by the receiver; without
// shared memory (tcp) and in-process they go the usual way. Either way the bytes and the
// order hold, both directions, with heap payloads in between, and every buffer comes back.
TEST_P(TransportTest, SameHostPoolPayloadsGoThroughTheSharedPool) {
    TransportOptions options;
    options.pool_bytes = 32 << 20;
    auto t = make(options);
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);

    const size_t sizes[] = {64 << 10, 1 << 20, 100, 3 << 20};
    const uint32_t n = 40;
    auto bytes = [&](uint32_t i) { return sizes[i % 4]; };
    auto pool_message = [&](uint32_t i) {
        Message m = make_message(i, 0);
        if (i % 5 == 4) {  // a heap payload now and then
            m.payload = make_payload(bytes(i), i);
            return m;
        }
        auto b = t->allocate(bytes(i), deadline_in(5s));
        EXPECT_TRUE(b.ok());
        Buffer reference = make_payload(bytes(i), i);
        std::memcpy(b->data(), reference.data(), bytes(i));
        m.payload = std::move(*b);
        return m;
    };
    stream_in_order(*client, *server, n, pool_message, bytes);
    stream_in_order(*server, *client, n, pool_message, bytes);
    // Pool payloads of 8 KiB and more, 4 of every 5 messages but the 100-byte ones.
    const uint64_t shared_each_way = 24;
    const bool shared = std::string(GetParam().name) == "ucx" &&
                        ucx_tls_has_shared_memory(GetParam().tls);
    EXPECT_EQ(client->stats().shared_sent, shared ? shared_each_way : 0);
    EXPECT_EQ(server->stats().shared_received, shared ? shared_each_way : 0);
    EXPECT_EQ(server->stats().shared_sent, shared ? shared_each_way : 0);
    EXPECT_EQ(client->stats().shared_received, shared ? shared_each_way : 0);
    EXPECT_EQ(t->stats().pool_bytes_in_use, 0u);
}

TEST_P(TransportTest, MessageLargerThanTheWindowsStillPasses) {
    TransportOptions options;
    options.send_window_bytes = 1 << 20;
    options.recv_window_bytes = 1 << 20;
    auto t = make(options);
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);
    ASSERT_TRUE(client->send(make_message(1, 9 << 20), deadline_in(10s)).ok());
    auto m = server->receive(deadline_in(20s));
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_TRUE(payload_ok(m->payload, 9 << 20, 1));
}

// Nobody receives: sends must start timing out once both windows are full; then the
// receiver catches up, everything accepted arrives in order and sending resumes. Pool
// payloads go through the shared pool on one host, where the receiver copies only while its
// window has room, so the sender's buffers stay held and it stalls just the same.
void slow_receiver_stalls_the_sender(Transport& t, Connection& client, Connection& server,
                                     size_t window, bool pool_payloads) {
    const size_t bytes = 1 << 20;
    auto message = [&](uint32_t seq) {
        if (!pool_payloads) return make_message(seq, bytes);
        Message m = make_message(seq, 0);
        m.payload = client.allocate_payload(bytes);
        Buffer reference = make_payload(bytes, seq);
        std::memcpy(m.payload.data(), reference.data(), bytes);
        return m;
    };
    uint32_t accepted = 0;
    Status last;
    for (; accepted < 64; ++accepted) {
        last = client.send(message(accepted), deadline_in(300ms));
        if (!last.ok()) break;
    }
    ASSERT_EQ(last.code(), StatusCode::kDeadlineExceeded) << last.to_string();
    EXPECT_LE(accepted * bytes, 2 * window + 2 * bytes)
        << accepted << " messages went out to a receiver that took none";
    EXPECT_GE(accepted, 3u) << "the window holds at least three messages";

    for (uint32_t i = 0; i < accepted; ++i) {
        auto m = server.receive(deadline_in(10s));
        ASSERT_TRUE(m.ok()) << m.error().to_string();
        ASSERT_EQ(seq_of(*m), i);
        ASSERT_TRUE(payload_ok(m->payload, bytes, i));
    }
    ASSERT_TRUE(client.send(message(accepted), deadline_in(10s)).ok());
    {
        auto m = server.receive(deadline_in(10s));
        ASSERT_TRUE(m.ok());
        EXPECT_EQ(seq_of(*m), accepted);
    }
    ASSERT_TRUE(client.flush(deadline_in(10s)).ok());
    EXPECT_EQ(t.stats().pool_bytes_in_use, 0u);
}

TEST_P(TransportTest, SlowReceiverStallsTheSenderWithinTheWindows) {
    for (bool pool_payloads : {false, true}) {
        SCOPED_TRACE(pool_payloads ? "pool payloads" : "heap payloads");
        TransportOptions options;
        options.pool_bytes = 32 << 20;
        options.send_window_bytes = 4 << 20;
        options.shared_send_window_bytes = 4 << 20;
        options.recv_window_bytes = 4 << 20;
        auto t = make(options);
        std::unique_ptr<Listener> listener;
        std::unique_ptr<Connection> server;
        auto client = connect_pair(*t, *t, listener, server);
        ASSERT_TRUE(client && server);
        slow_receiver_stalls_the_sender(*t, *client, *server, 4 << 20, pool_payloads);
    }
}

TEST_P(TransportTest, ReceiveAndAcceptTimeOut) {
    auto t = make();
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);
    const auto start = Clock::now();
    auto m = server->receive(deadline_in(100ms));
    EXPECT_EQ(m.error().code(), StatusCode::kDeadlineExceeded);
    EXPECT_LT(Clock::now() - start, 5s);
    auto a = listener->accept(deadline_in(100ms));
    EXPECT_EQ(a.error().code(), StatusCode::kDeadlineExceeded);
}

TEST_P(TransportTest, PeerCloseIsSeenAfterTheLastMessage) {
    auto t = make();
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);
    for (uint32_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(client->send(make_message(i, 512 << 10), deadline_in(10s)).ok());
    }
    client->close();
    EXPECT_EQ(client->send(make_message(9, 1), deadline_in(1s)).code(), StatusCode::kUnavailable);
    for (uint32_t i = 0; i < 3; ++i) {
        auto m = server->receive(deadline_in(10s));
        ASSERT_TRUE(m.ok()) << m.error().to_string();
        EXPECT_EQ(seq_of(*m), i);
    }
    auto end = server->receive(deadline_in(10s));
    EXPECT_EQ(end.error().code(), StatusCode::kUnavailable) << end.error().to_string();
    // Sending to the closed peer fails, at send or at the latest at flush.
    Status s = server->send(make_message(1, 1), deadline_in(5s));
    if (s.ok()) s = server->flush(deadline_in(5s));
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
}

TEST_P(TransportTest, ConnectingToNothingFailsClearly) {
    auto t = make();
    std::string address = "nobody-listens";
    if (std::string(GetParam().name) == "ucx") {
        // A port that was free a moment ago.
        auto l = t->listen("127.0.0.1:0");
        ASSERT_TRUE(l.ok());
        address = (*l)->address();
    }
    const auto start = Clock::now();
    auto c = t->connect(address, deadline_in(10s));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code(), StatusCode::kUnavailable) << c.error().to_string();
    EXPECT_LT(Clock::now() - start, 9s) << "a refused connection must not wait for the deadline";
}

TEST_P(TransportTest, BadAddressesAndHeadersAreRefused) {
    auto t = make();
    if (std::string(GetParam().name) == "ucx") {
        for (const char* bad : {"no-port", "127.0.0.1:99999", "127.0.0.1:x", ":5"}) {
            auto c = t->connect(bad, deadline_in(1s));
            ASSERT_FALSE(c.ok()) << bad;
            EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument) << bad;
        }
        EXPECT_FALSE(t->listen("127.0.0.1:http").ok());
    } else {
        EXPECT_FALSE(t->listen("").ok());
    }
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> server;
    auto client = connect_pair(*t, *t, listener, server);
    ASSERT_TRUE(client && server);
    Message m;
    m.header.resize(kMaxHeaderBytes + 1);
    EXPECT_EQ(client->send(std::move(m), deadline_in(1s)).code(), StatusCode::kInvalidArgument);
    // The connection still works.
    ASSERT_TRUE(client->send(make_message(5, 10), deadline_in(5s)).ok());
    auto got = server->receive(deadline_in(5s));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(seq_of(*got), 5u);
}

TEST_P(TransportTest, AnAddressInUseIsRefused) {
    auto t = make();
    auto first = t->listen(any_address());
    ASSERT_TRUE(first.ok());
    auto second = t->listen((*first)->address());
    ASSERT_FALSE(second.ok());
}

TEST_P(TransportTest, ManyConnectionsToOneListener) {
    // UCX: two transports, as two nodes would have. In-process addresses are seen only
    // through the transport that listens on them.
    auto server_side = make();
    auto second = std::string(GetParam().name) == "ucx" ? make() : nullptr;
    Transport* client_side = second ? second.get() : server_side.get();
    auto l = server_side->listen(any_address());
    ASSERT_TRUE(l.ok());
    std::vector<std::unique_ptr<Connection>> clients, servers;
    for (int i = 0; i < 4; ++i) {
        auto c = client_side->connect((*l)->address(), deadline_in(10s));
        ASSERT_TRUE(c.ok()) << c.error().to_string();
        clients.push_back(std::move(*c));
        auto a = (*l)->accept(deadline_in(10s));
        ASSERT_TRUE(a.ok()) << a.error().to_string();
        servers.push_back(std::move(*a));
    }
    for (uint32_t i = 0; i < 4; ++i) {
        ASSERT_TRUE(clients[i]->send(make_message(100 + i, 64 << 10), deadline_in(5s)).ok());
    }
    // Each accepted connection carries its own client's message.
    for (uint32_t i = 0; i < 4; ++i) {
        auto m = servers[i]->receive(deadline_in(10s));
        ASSERT_TRUE(m.ok()) << m.error().to_string();
        EXPECT_EQ(seq_of(*m), 100 + i);
    }
}

const Backend kBackends[] = {
    {"inproc", "inproc", ""},
    {"ucx_tcp", "ucx", "tcp"},
    {"ucx_shm", "ucx", "sm,self"},
    // What a cluster on one host uses: large payloads pulled through shared memory as a
    // pipeline of active messages (backpressure must still hold).
    {"ucx_shm_get_zcopy", "ucx", "sm,self", "get_zcopy"},
};

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest, ::testing::ValuesIn(kBackends),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(TransportFactory, UnknownRendezvousSchemeIsRefused) {
    if (getenv("UCX_RNDV_SCHEME") != nullptr) GTEST_SKIP() << "UCX_RNDV_SCHEME is set";
    TransportOptions o;
    o.ucx_rndv_scheme = "carrier-pigeon";
    auto t = make_transport("ucx", o);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message().find("carrier-pigeon"), std::string::npos) << t.error().message();
}

TEST(TransportFactory, KnowsWhichTransportListsShareMemory) {
    EXPECT_FALSE(ucx_tls_has_shared_memory("tcp"));
    EXPECT_FALSE(ucx_tls_has_shared_memory("rc,tcp"));
    EXPECT_TRUE(ucx_tls_has_shared_memory("sm,tcp"));
    EXPECT_TRUE(ucx_tls_has_shared_memory("tcp,posix"));
    EXPECT_TRUE(ucx_tls_has_shared_memory("all"));
    EXPECT_TRUE(ucx_tls_has_shared_memory("^tcp"));
    EXPECT_FALSE(ucx_tls_has_shared_memory("^sm,cma"));
}

TEST(TransportFactory, UnknownNameIsRefused) {
    auto t = make_transport("carrier-pigeon");
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltaserve::transport
