#include "deltaserve/kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "blocks.h"
#include "cpu_features.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/quant.h"
#include "deltaserve/kernels/repack.h"
#include "matmul_table.h"

namespace deltaserve::kernels {

namespace {

const MatmulTable& table() {
    static const MatmulTable& t =
        cpu_features().avx512_vnni ? avx512_matmul_table() : avx2_matmul_table();
    return t;
}

// The activations a weight type's kernel takes.
enum class ActivationKind { kFloat, kQ8A, kQ8K };

ActivationKind activation_kind(DType t) {
    switch (t) {
        case DType::kQ4_0:
        case DType::kQ4_1:
        case DType::kQ5_0:
        case DType::kQ5_1:
        case DType::kQ8_0:
        case DType::kIQ4_NL:
            return ActivationKind::kQ8A;
        case DType::kQ2_K:
        case DType::kQ3_K:
        case DType::kQ4_K:
        case DType::kQ5_K:
        case DType::kQ6_K:
        case DType::kIQ4_XS:
            return ActivationKind::kQ8K;
        default:
            return ActivationKind::kFloat;
    }
}

RowsFn rows_fn(const WeightMatrix& w, DotOrder order) {
    const MatmulTable& t = table();
    const QuantKernels& k = t.quant[static_cast<int>(order)];
    if (w.interleave == kRowInterleave) {
        switch (w.type) {
            case DType::kQ4_0:
                return k.q4_0x8;
            case DType::kQ4_1:
                return k.q4_1x8;
            case DType::kQ8_0:
                return k.q8_0x8;
            case DType::kQ4_K:
                return k.q4_kx8;
            case DType::kQ6_K:
                return k.q6_kx8;
            default:
                return nullptr;
        }
    }
    switch (w.type) {
        case DType::kQ4_0:
            return k.q4_0;
        case DType::kQ4_1:
            return k.q4_1;
        case DType::kQ8_0:
            return k.q8_0;
        case DType::kQ5_0:
            return k.q5_0;
        case DType::kQ5_1:
            return k.q5_1;
        case DType::kIQ4_NL:
            return k.iq4_nl;
        case DType::kQ2_K:
            return k.q2_k;
        case DType::kQ3_K:
            return k.q3_k;
        case DType::kQ4_K:
            return k.q4_k;
        case DType::kQ5_K:
            return k.q5_k;
        case DType::kQ6_K:
            return k.q6_k;
        case DType::kIQ4_XS:
            return k.iq4_xs;
        case DType::kF32:
            return t.f32;
        case DType::kF16:
            return t.f16;
        case DType::kBF16:
            return t.bf16;
        default:
            return nullptr;
    }
}

// Types without a direct kernel (none of the supported row-major ones today): dequantize one
// row at a time and dot in fp32.
void rows_dequantized(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                      int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    WeightMatrix f{DType::kF32, 1, w.cols, row.data()};
    for (int64_t r = r0; r < r1; ++r) {
        dequantize_weight_row(w, r, row.data());
        table().f32(f, a, y + r, ldy, 0, 1);
    }
}

// Per-thread scratch for quantized activations, grown as needed and reused.
template <class Block>
Block* activation_scratch(size_t n) {
    thread_local std::vector<Block> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}

// n_tokens rows of x into blocks of `Block`, nb per row, through quantize(row, out).
template <class Block, class Quantize>
Block* quantize_rows(const float* x, int64_t ldx, int64_t n_tokens, int64_t nb, ThreadPool* pool,
                     Quantize quantize) {
    Block* q = activation_scratch<Block>(static_cast<size_t>(nb * n_tokens));
    auto run = [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) quantize(x + t * ldx, q + t * nb);
    };
    if (pool != nullptr && n_tokens >= 16) {
        pool->parallel_for(n_tokens, 8, run);
    } else {
        run(0, n_tokens);
    }
    return q;
}

Activations prepare(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tokens,
                    ThreadPool* pool) {
    Activations a{x, ldx, nullptr, n_tokens};
    const int64_t n = w.cols;
    switch (activation_kind(w.type)) {
        case ActivationKind::kQ8A:
            a.q = quantize_rows<BlockQ8A>(
                x, ldx, n_tokens, n / kQK, pool,
                [n](const float* row, BlockQ8A* out) { quantize_activations(row, out, n); });
            break;
        case ActivationKind::kQ8K:
            a.qk = quantize_rows<BlockQ8K>(
                x, ldx, n_tokens, n / kQKK, pool,
                [n](const float* row, BlockQ8K* out) { quantize_activations_q8k(row, out, n); });
            break;
        case ActivationKind::kFloat:
            break;
    }
    return a;
}

void compute_rows(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy, int64_t r0,
                  int64_t r1, DotOrder order) {
    RowsFn fn = rows_fn(w, order);
    if (fn != nullptr) {
        fn(w, a, y, ldy, r0, r1);
    } else {
        rows_dequantized(w, a, y, ldy, r0, r1);
    }
}

// Rows per work chunk: two long contiguous runs per thread, whatever the token count, so the
// prefetchers stream each thread's weights once per call. Decoding is bound by memory
// (measured 95 -> ~115 tok/s over 32-row chunks); a batch reads each weight once per call
// too, as a row group stays in L1 while every token passes over it. With 16-row chunks for
// more than one token, a batch of 2 decoded 0.8-1.3x the tokens/s of one, with the long runs
// 1.8-2.0x; prefill measured the same either way within this host's noise (bench/README.md,
// "Batched decode: long row runs").
// Interleaved rows come in whole groups.
int64_t rows_per_chunk(int64_t rows, const ThreadPool& pool) {
    const int64_t n = std::max<int64_t>(32, rows / (2 * pool.size()));
    return (n + kRowInterleave - 1) / kRowInterleave * kRowInterleave;
}

}  // namespace

std::string_view cpu_kernel_isa() { return table().isa; }

void matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool, DotOrder order) {
    const Activations a = prepare(w, x, ldx, n_tokens, &pool);
    const int64_t grain = rows_per_chunk(w.rows, pool);
    pool.parallel_for(w.rows, grain,
                      [&](int64_t r0, int64_t r1) { compute_rows(w, a, y, ldy, r0, r1, order); });
}

void matmul_shared_input(std::span<const MatmulOutput> outputs, const float* x, int64_t ldx,
                         int64_t n_tokens, ThreadPool& pool, DotOrder order) {
    if (outputs.empty()) return;
    const WeightMatrix& first = *outputs[0].w;
    for (const auto& o : outputs) {
        // Different activation formats cannot share one quantization: do them one by one.
        if (o.w->cols != first.cols || activation_kind(o.w->type) != activation_kind(first.type)) {
            for (const auto& each : outputs)
                matmul(*each.w, x, ldx, n_tokens, each.y, each.ldy, pool, order);
            return;
        }
    }
    const Activations a = prepare(first, x, ldx, n_tokens, &pool);
    // Rows of all outputs, concatenated, handed out in chunks that never straddle two.
    const int64_t grain = rows_per_chunk(first.rows, pool);
    int64_t total_chunks = 0;
    int64_t chunk_start[8];
    DS_CHECK(outputs.size() <= 8, "too many shared-input outputs");
    for (size_t i = 0; i < outputs.size(); ++i) {
        chunk_start[i] = total_chunks;
        total_chunks += (outputs[i].w->rows + grain - 1) / grain;
    }
    pool.parallel_for(total_chunks, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
            size_t i = outputs.size() - 1;
            while (chunk_start[i] > c) --i;
            const MatmulOutput& o = outputs[i];
            const int64_t r0 = (c - chunk_start[i]) * grain;
            compute_rows(*o.w, a, o.y, o.ldy, r0, std::min(o.w->rows, r0 + grain), order);
        }
    });
}

}  // namespace deltaserve::kernels
