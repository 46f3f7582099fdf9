// Proving a cluster secret to a peer (DESIGN.md: cluster-internal traffic is authenticated):
// the side that is connected to sends a fresh nonce, the side that connects answers
// HMAC-SHA256(secret, purpose || nonce). The secret never crosses the wire and a proof is
// good for one nonce only. Used on the node RPC bootstrap and the KV data plane.
#pragma once

#include <string>
#include <string_view>

namespace deltaserve::transport {

// 32 random bytes from the kernel's CSPRNG, hex-encoded (64 characters).
std::string make_nonce();

// hex(HMAC-SHA256(secret, purpose + ":" + nonce)). purpose names the channel ("rpc", "kv")
// so a proof for one is no proof for the other.
std::string prove(std::string_view secret, std::string_view purpose, std::string_view nonce);

// Whether proof is prove(secret, purpose, nonce), compared in constant time.
bool verify(std::string_view secret, std::string_view purpose, std::string_view nonce,
            std::string_view proof);

}  // namespace deltaserve::transport
