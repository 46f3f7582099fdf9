// The transport interface: ordered, reliable messages between two nodes.
//
// A message is a small header (a few hundred bytes at most: the wire-format header of a KV
// shipment, an RPC tag) and a payload Buffer of any size. Two backends implement it:
//   - "ucx": UCP active messages over tcp, shared memory or RDMA (ucx_transport.h);
//   - "inproc": queues inside one process, for the embedded mode (inproc_transport.h).
// Both give the same guarantees, so the prefill and decode workers do not know which runs:
//   - order: messages on one connection arrive in the order they were sent;
//   - backpressure: send() waits while the connection's unfinished sends exceed the send
//     window, and a receiver that does not call receive() stops taking large payloads once
//     its receive window is full, so a fast sender cannot exhaust a slow receiver's memory;
//   - timeouts: every wait takes a deadline and ends with kDeadlineExceeded;
//   - peer failure: a peer that closes, crashes or becomes unreachable turns the connection
//     into an error (kUnavailable) that send, flush and receive report; receive first hands
//     out what had already arrived. Nothing waits forever on a dead peer.
// Connections and listeners are thread-safe; one thread may send while another receives.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/transport/buffer.h"

namespace deltaserve::transport {

// Headers larger than this are refused by send() (kInvalidArgument).
inline constexpr size_t kMaxHeaderBytes = 4096;

struct Message {
    std::vector<std::byte> header;
    Buffer payload;
};

struct ConnectionStats {
    uint64_t messages_sent = 0;
    uint64_t bytes_sent = 0;  // header + payload
    uint64_t messages_received = 0;
    uint64_t bytes_received = 0;
    // Payloads sent and received through the sender's pool mapped by a peer on the same
    // host (ucx; transport/README.md) instead of through the network layer.
    uint64_t shared_sent = 0;
    uint64_t shared_received = 0;
};

class Connection {
  public:
    virtual ~Connection() = default;  // closes (see close())

    // Queues a message and returns; the transport owns it until it is delivered. Waits while
    // the send window is full. Errors: kUnavailable (the connection failed or was closed:
    // the message is not sent), kDeadlineExceeded (the window stayed full),
    // kInvalidArgument (header over kMaxHeaderBytes).
    virtual Status send(Message message, Deadline deadline) = 0;
    // A buffer for a payload to send on this connection: from the transport's registered
    // pool where that makes the send cheaper and the pool has room now (ucx: no
    // registration per message, and a peer on this host copies it straight out of the
    // pool), else from the heap. Never waits: a pool held by stalled connections does not
    // hold up this one.
    virtual Buffer allocate_payload(size_t bytes) { return Buffer::heap(bytes); }
    // Waits until every message sent so far has been delivered to the peer's transport.
    virtual Status flush(Deadline deadline) = 0;
    // The next message. Errors: kDeadlineExceeded, kUnavailable once the connection failed
    // or closed and every message that had arrived was handed out.
    virtual Result<Message> receive(Deadline deadline) = 0;
    // Delivers what was sent (up to a short grace period) and closes; the peer sees
    // kUnavailable after its last message. Idempotent.
    virtual void close() = 0;

    // The peer's address as the network layer knows it ("10.0.0.2:41234", "inproc:name").
    virtual std::string peer() const = 0;
    // OK while the connection works, else why it does not.
    virtual Status status() const = 0;
    virtual ConnectionStats stats() const = 0;
};

class Listener {
  public:
    virtual ~Listener() = default;  // stops listening; connections not yet accepted close

    // The next incoming connection. Errors: kDeadlineExceeded, kUnavailable once closed.
    virtual Result<std::unique_ptr<Connection>> accept(Deadline deadline) = 0;
    // The address peers connect to (with the real port when listening on port 0).
    virtual std::string address() const = 0;
};

struct TransportStats {
    size_t pool_bytes = 0;         // the registered pool's size
    size_t pool_bytes_in_use = 0;  // held by buffers: queued, in flight or with the caller
};

class Transport {
  public:
    virtual ~Transport() = default;

    // "ucx" or "inproc".
    virtual std::string_view name() const = 0;
    // Listens on an address: "host:port" for ucx (port 0 picks a free one), any name for
    // inproc. Errors: kInvalidArgument (malformed address), kAlreadyExists / kUnavailable
    // (address in use or not local).
    virtual Result<std::unique_ptr<Listener>> listen(std::string_view address) = 0;
    // Connects and waits until the peer's transport answered. Errors: kUnavailable (nothing
    // listens there, the peer refused or failed), kDeadlineExceeded, kInvalidArgument.
    virtual Result<std::unique_ptr<Connection>> connect(std::string_view address,
                                                        Deadline deadline) = 0;
    // A payload buffer from the transport's registered pool (sends from it skip per-message
    // registration); waits while the pool is full. Sizes above the pool get heap buffers.
    virtual Result<Buffer> allocate(size_t bytes, Deadline deadline) = 0;
    virtual TransportStats stats() const = 0;
};

}  // namespace deltaserve::transport
