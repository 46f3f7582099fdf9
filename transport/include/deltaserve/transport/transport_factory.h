// Making a transport by name, with its options.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "deltaserve/common/status.h"
#include "deltaserve/transport/transport.h"

namespace deltaserve::transport {

struct TransportOptions {
    // Registered memory for payloads (Transport::allocate, received payloads).
    // Default: 64 MiB.
    size_t pool_bytes = size_t{64} << 20;
    // Bytes of unfinished sends per connection above which send() waits. Default: 32 MiB.
    size_t send_window_bytes = size_t{32} << 20;
    // ucx, between processes of one host (payloads through the shared pool,
    // transport/README.md): the send window there. The receiver copies each payload out of
    // the sender's pool; a shallow window keeps the bytes it copies in the cache (with 32 MiB
    // in flight the copy reads memory: 5.2-7.8 GB/s against 10.5-16.7 with 8 MiB, 64 KiB to
    // 4 MiB messages, on the 2-core VM with a 32 MiB L3). Default: 8 MiB.
    size_t shared_send_window_bytes = size_t{8} << 20;
    // Bytes of received messages waiting for receive() above which a connection stops
    // fetching large payloads (they wait at the sender). Default: 32 MiB.
    size_t recv_window_bytes = size_t{32} << 20;
    // The largest payload a peer may announce; a larger one fails its connection
    // (kResourceExhausted) before anything is allocated for it. Default: 1 GiB.
    size_t max_message_bytes = size_t{1} << 30;
    // How long close() and the destructors let queued sends finish. Default: 2 s.
    std::chrono::milliseconds close_grace{2000};
    // ucx: UCX transports to use, as UCX_TLS spells them ("tcp", "sm,tcp", "rc,tcp").
    // Empty: UCX_TLS from the environment, else every transport UCX finds. tcp is added when
    // missing, since UCX sets up sockaddr connections through it. Default: empty.
    std::string ucx_tls;
    // ucx: interval of the keepalive probes that detect a peer gone silent (crashed host,
    // cut link). Default: 2 s.
    std::chrono::milliseconds keepalive{2000};
    // ucx: how payloads above UCX's rendezvous threshold move, as UCX_RNDV_SCHEME spells it
    // ("get_zcopy", "put_zcopy", "am", "auto"); UCX_RNDV_SCHEME in the environment wins.
    // Empty: UCX's own choice ("auto"). Between processes of one host pool payloads skip
    // UCX's rendezvous (the shared pool); for heap payloads there "get_zcopy" is 2-3.5x
    // faster (UCX then pipelines them through shared memory instead of tcp), but a peer
    // killed mid-transfer can leave the receiver unable to take new connections
    // (transport/README.md): an opt-in, not the default. Default: empty.
    std::string ucx_rndv_scheme;
};

// Whether UCX may move bytes between processes of one host through shared memory with these
// transports (as TransportOptions::ucx_tls takes them; empty: UCX_TLS from the environment,
// else every transport).
bool ucx_tls_has_shared_memory(std::string_view ucx_tls);

// "ucx" or "inproc". Errors: kInvalidArgument (unknown name), kUnavailable (UCX could not
// start: its message is passed on).
Result<std::unique_ptr<Transport>> make_transport(std::string_view name,
                                                  const TransportOptions& options = {});

}  // namespace deltaserve::transport
