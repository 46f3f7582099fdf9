#include "deltaserve/transport/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>

#include "deltaserve/common/status.h"

namespace deltaserve::transport {

namespace {

std::string hex(const unsigned char* bytes, size_t n) {
    std::string out;
    char h[3];
    for (size_t i = 0; i < n; ++i) {
        std::snprintf(h, sizeof h, "%02x", bytes[i]);
        out += h;
    }
    return out;
}

}  // namespace

std::string make_nonce() {
    unsigned char raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        const ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        DS_CHECK(n > 0 || errno == EINTR);
        if (n > 0) got += static_cast<size_t>(n);
    }
    return hex(raw, sizeof raw);
}

std::string prove(std::string_view secret, std::string_view purpose, std::string_view nonce) {
    const std::string message = std::string(purpose) + ":" + std::string(nonce);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    // An empty key is a valid HMAC key: nodes without a secret still speak the protocol.
    static const unsigned char kNoKey = 0;
    const void* key = secret.empty() ? static_cast<const void*>(&kNoKey) : secret.data();
    DS_CHECK(HMAC(EVP_sha256(), key, static_cast<int>(secret.size()),
                  reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
                  &len) != nullptr);
    return hex(mac, len);
}

bool verify(std::string_view secret, std::string_view purpose, std::string_view nonce,
            std::string_view proof) {
    const std::string want = prove(secret, purpose, nonce);
    return proof.size() == want.size() &&
           CRYPTO_memcmp(proof.data(), want.data(), want.size()) == 0;
}

}  // namespace deltaserve::transport
