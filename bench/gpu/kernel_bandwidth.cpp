// The forward pass's two bandwidth-bound kernels through kernels::Backend, on either backend:
// a matmul at one token and at a batch (Q4_0, Q4_1, Q8_0, F16 weights of Llama 8B's shapes)
// and a decode step's attention over fp16 KV at 1k, 8k and 32k tokens (32 query heads, 8 KV
// heads of 128). Each line gives the time per call, the bytes it must read (weights once;
// K and V once) over that time, and that as a share of --peak-gbs, the memory's peak.
//
//   deltaserve-bench-kernels --device cuda --peak-gbs 4800   # H200 HBM3e
//   deltaserve-bench-kernels --device cpu --peak-gbs 30 --threads 2
//
// Calls run back to back on the backend's stream and the clock stops after a copy_out
// that waits for them, so launch gaps count where they are not hidden.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/quant.h"

namespace {

namespace k = deltaserve::kernels;
using deltaserve::Result;
using deltaserve::Status;

struct Options {
    std::string device;
    double peak_gbs = 0.0;
    int threads = 2;
    double seconds = 0.5;  // per measurement
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Runs `call` until `seconds` have passed (at least 3 times), the last copy_out waiting for
// it; returns seconds per call.
template <class Call>
Result<double> time_calls(k::Backend& b, const k::Exec& exec, const k::Buffer& sync, double seconds,
                          Call call) {
    float probe = 0.0f;
    DS_RETURN_IF_ERROR(call());  // warm-up
    DS_RETURN_IF_ERROR(b.copy_out(&probe, sync.data(), sizeof(float), exec));
    int calls = 0;
    const double t0 = now_s();
    double t = t0;
    while (calls < 3 || t - t0 < seconds) {
        for (int i = 0; i < 8; ++i) DS_RETURN_IF_ERROR(call());
        calls += 8;
        DS_RETURN_IF_ERROR(b.copy_out(&probe, sync.data(), sizeof(float), exec));
        t = now_s();
    }
    return (t - t0) / calls;
}

void report(const Options& o, const std::string& what, double s, double bytes) {
    const double gbs = bytes / s / 1e9;
    std::printf("%-44s %10.1f us %9.1f GB/s", what.c_str(), s * 1e6, gbs);
    if (o.peak_gbs > 0) std::printf(" %6.1f%% of peak", 100.0 * gbs / o.peak_gbs);
    std::printf("\n");
}

Result<k::Buffer> filled(k::Backend& b, const std::vector<float>& host, const k::Exec& exec) {
    DS_ASSIGN_OR_RETURN(k::Buffer buf, b.alloc(host.size() * sizeof(float)));
    DS_RETURN_IF_ERROR(b.copy_in(buf.data(), host.data(), host.size() * sizeof(float), exec));
    return buf;
}

Status matmuls(const Options& o, k::Backend& b, const k::Exec& exec) {
    struct Shape {
        const char* name;
        int64_t rows, cols;
    };
    const Shape shapes[] = {{"q/o 4096x4096", 4096, 4096},
                            {"gate/up 14336x4096", 14336, 4096},
                            {"down 4096x14336", 4096, 14336}};
    const k::DType types[] = {k::DType::kQ4_0, k::DType::kQ4_1, k::DType::kQ8_0, k::DType::kF16};
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const Shape& s : shapes) {
        std::vector<float> row(static_cast<size_t>(s.cols));
        for (k::DType t : types) {
            const size_t row_bytes = k::row_bytes(t, s.cols);
            std::vector<uint8_t> w(static_cast<size_t>(s.rows) * row_bytes);
            for (int64_t r = 0; r < s.rows; ++r) {
                if (r < 64) {  // 64 distinct rows, repeated: the bytes are what counts
                    for (float& v : row) v = normal(rng);
                    k::quantize_row(t, row.data(), w.data() + r * row_bytes, s.cols);
                } else {
                    std::memcpy(w.data() + r * row_bytes, w.data() + (r % 64) * row_bytes,
                                row_bytes);
                }
            }
            const k::WeightMatrix host{t, s.rows, s.cols, w.data()};
            DS_ASSIGN_OR_RETURN(k::WeightMatrix dev, b.upload_weight(host));
            for (int64_t n : {int64_t{1}, int64_t{32}}) {
                std::vector<float> x(static_cast<size_t>(n * s.cols));
                for (float& v : x) v = normal(rng);
                DS_ASSIGN_OR_RETURN(k::Buffer xb, filled(b, x, exec));
                DS_ASSIGN_OR_RETURN(k::Buffer yb, b.alloc(static_cast<size_t>(n * s.rows) * 4));
                DS_ASSIGN_OR_RETURN(const double sec, time_calls(b, exec, yb, o.seconds, [&] {
                                        return b.matmul(dev, xb.f32(), s.cols, n, yb.f32(), s.rows,
                                                        exec);
                                    }));
                const std::string what = std::string("matmul ") + s.name + " " +
                                         std::string(k::dtype_traits(t).name) + " x" +
                                         std::to_string(n);
                report(o, what, sec, static_cast<double>(w.size()));
            }
        }
    }
    return Status();
}

Status attention(const Options& o, k::Backend& b, const k::Exec& exec) {
    const k::AttentionShape shape{32, 8, 128, 1.0f / std::sqrt(128.0f)};
    const int64_t kv_row = 8 * 128;  // K or V of one token, every KV head
    for (int32_t n : {1024, 8192, 32768}) {
        // fp16 K and V rows, token i in slot i.
        std::vector<uint16_t> kv(static_cast<size_t>(n * kv_row));
        std::mt19937 rng(n);
        std::uniform_int_distribution<int> bits(0x3000, 0x3bff);  // fp16 in about [0.125, 1)
        for (uint16_t& v : kv) v = static_cast<uint16_t>(bits(rng));
        const size_t bytes = kv.size() * sizeof(uint16_t);
        DS_ASSIGN_OR_RETURN(k::Buffer kb, b.alloc(bytes));
        DS_ASSIGN_OR_RETURN(k::Buffer vb, b.alloc(bytes));
        DS_RETURN_IF_ERROR(b.copy_in(kb.data(), kv.data(), bytes, exec));
        DS_RETURN_IF_ERROR(b.copy_in(vb.data(), kv.data(), bytes, exec));
        std::vector<int32_t> slots(static_cast<size_t>(n));
        std::iota(slots.begin(), slots.end(), 0);
        k::KvView view;
        view.dtype = k::DType::kF16;
        view.k = static_cast<const uint8_t*>(kb.data());
        view.v = static_cast<const uint8_t*>(vb.data());
        view.row_stride = static_cast<size_t>(kv_row) * 2;
        view.slots = slots.data();
        view.n = n;
        view.head_stride = 128 * 2;
        std::vector<float> q(32 * 128, 0.01f);
        DS_ASSIGN_OR_RETURN(k::Buffer qb, filled(b, q, exec));
        DS_ASSIGN_OR_RETURN(k::Buffer ob, b.alloc(q.size() * 4));
        DS_ASSIGN_OR_RETURN(const double sec, time_calls(b, exec, ob, o.seconds, [&] {
                                return b.attention(shape, view, qb.f32(), 32 * 128, 1, ob.f32(),
                                                   32 * 128, exec);
                            }));
        report(o, "attention decode, fp16 KV, " + std::to_string(n) + " tokens", sec,
               2.0 * static_cast<double>(bytes));
    }
    return Status();
}

int usage(const char* why) {
    if (why != nullptr) std::fprintf(stderr, "deltaserve-bench-kernels: %s\n", why);
    std::fputs(
        "usage: deltaserve-bench-kernels [--device cpu|cuda] [--peak-gbs GB/s] [--threads 2] "
        "[--seconds 0.5]\n",
        why != nullptr ? stderr : stdout);
    return why != nullptr ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--help" || flag == "-h") return usage(nullptr);
        if (i + 1 >= argc) return usage((flag + " needs a value").c_str());
        const std::string v = argv[++i];
        char* end = nullptr;
        if (flag == "--device") {
            o.device = v;
        } else if (flag == "--peak-gbs") {
            o.peak_gbs = std::strtod(v.c_str(), &end);
        } else if (flag == "--seconds") {
            o.seconds = std::strtod(v.c_str(), &end);
        } else if (flag == "--threads") {
            o.threads = static_cast<int>(std::strtol(v.c_str(), &end, 10));
        } else {
            return usage(("unknown flag " + flag).c_str());
        }
        if (end != nullptr && (*end != '\0' || v.empty())) {
            return usage((flag + ": bad value '" + v + "'").c_str());
        }
    }
    if (o.threads < 1 || o.seconds <= 0 || o.peak_gbs < 0) return usage("values out of range");
    Result<k::Backend*> b = k::choose_backend(o.device);
    if (!b) {
        std::fprintf(stderr, "deltaserve-bench-kernels: %s\n", b.error().message().c_str());
        return 1;
    }
    deltaserve::ThreadPool pool(o.threads);
    const k::Exec exec{&pool, k::DotOrder::kBlock, nullptr};
    std::printf("deltaserve kernel bandwidth on %s, %d threads\n", (*b)->description().c_str(),
                o.threads);
    Status st = matmuls(o, **b, exec);
    if (st.ok()) st = attention(o, **b, exec);
    if (!st.ok()) {
        std::fprintf(stderr, "deltaserve-bench-kernels: %s\n", st.to_string().c_str());
        return 1;
    }
    return 0;
}
