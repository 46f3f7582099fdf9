// etcd's answers as the gateway's JSON (api/src/etcd_json.h): whatever bytes an endpoint sends,
// every parser returns a value or an error, never crashes; a parsed range re-encodes to keys
// and values that decode back (base64 both ways), and base64 round-trips what it decoded.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "deltaserve/common/base64.h"
#include "etcd_http.h"
#include "etcd_json.h"

using namespace deltaserve;
using namespace deltaserve::api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    (void)etcd::error_of(400, text);
    (void)etcd::parse_revision(text);
    (void)etcd::parse_deleted(text);
    (void)etcd::parse_swap(text);
    (void)etcd::parse_lease_id(text);
    (void)etcd::parse_keep_alive(text);
    (void)etcd::parse_time_left(text);
    (void)etcd::parse_token(text);
    (void)etcd::parse_watch_message(text);
    (void)etcd::parse_endpoint(text);
    Result<EtcdRange> r = etcd::parse_range(text);
    if (r.ok()) {
        for (const EtcdKeyValue& kv : r->kvs) {
            if (base64_decode(base64_encode(kv.key)).value() != kv.key) std::abort();
            if (base64_decode(base64_encode(kv.value)).value() != kv.value) std::abort();
        }
    }
    Result<std::string> b = base64_decode(text);
    if (b.ok() && base64_encode(*b) != text) std::abort();
    return 0;
}
