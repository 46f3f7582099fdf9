// A transport peer in its own process, for the tests that kill one mid-transfer.
//   transport_peer send ADDRESS COUNT BYTES   connect, send COUNT messages of BYTES (from the
//                                             pool and the heap in turn), then wait
//   transport_peer idle ADDRESS               connect, never receive, wait to be killed
// Prints "connected" once connected; exits 2 on a transport error.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "deltaserve/transport/transport_factory.h"

using namespace deltaserve::transport;

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: transport_peer send|idle ADDRESS [COUNT BYTES]\n");
        return 1;
    }
    const std::string mode = argv[1];
    auto transport = make_transport("ucx");
    if (!transport.ok()) {
        std::fprintf(stderr, "%s\n", transport.error().to_string().c_str());
        return 2;
    }
    auto conn = (*transport)->connect(argv[2], deadline_in(std::chrono::seconds(10)));
    if (!conn.ok()) {
        std::fprintf(stderr, "%s\n", conn.error().to_string().c_str());
        return 2;
    }
    std::printf("connected\n");
    std::fflush(stdout);
    if (mode == "send" && argc == 5) {
        const long count = std::atol(argv[3]);
        const size_t bytes = static_cast<size_t>(std::atol(argv[4]));
        for (long i = 0; i < count; ++i) {
            Message m;
            m.header.assign(8, std::byte{0});
            std::memcpy(m.header.data(), &i, sizeof(i));
            // Pool and heap payloads alternate: both paths are cut when it is killed.
            if (i % 2 == 0) {
                auto pooled = (*transport)->allocate(bytes, deadline_in(std::chrono::seconds(30)));
                if (!pooled.ok()) {
                    std::fprintf(stderr, "%s\n", pooled.error().to_string().c_str());
                    return 2;
                }
                m.payload = std::move(*pooled);
            } else {
                m.payload = Buffer::heap(bytes);
            }
            std::memset(m.payload.data(), static_cast<int>(i & 0xff), bytes);
            deltaserve::Status s =
                (*conn)->send(std::move(m), deadline_in(std::chrono::seconds(30)));
            if (!s.ok()) {
                std::fprintf(stderr, "%s\n", s.to_string().c_str());
                return 2;
            }
        }
    }
    for (;;) pause();
}
