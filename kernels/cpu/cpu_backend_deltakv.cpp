// The CPU backend's DeltaKV ops (backend.h, deltakv_ops.h): deltakv.h's kernels over host
// memory, called as DeltaKvSequenceCache called them before the ops existed (the same blocks
// over the pool, the same order), so that the cache's bits do not change.
#include <immintrin.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "deltaserve/kernels/deltakv.h"
#include "deltaserve/kernels/kv_row.h"

namespace deltaserve::kernels {

namespace {

void prefetch(const uint8_t* row, int bytes) {
    for (int b = 0; b < bytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(row + b), _MM_HINT_T0);
}

// A latent token's references as LatentTokens names them: ordinals, -1 for none.
void refs_of(const LatentRows& lat, int64_t i, int32_t* out) {
    const uint16_t* r = lat.refs + static_cast<size_t>(lat.rows[i]) * lat.k;
    for (int q = 0; q < lat.k; ++q) out[q] = r[q] != kNoLatentRef ? r[q] : -1;
}

const uint8_t* latent_of(const LatentRows& lat, int64_t i) {
    return lat.latents + static_cast<size_t>(lat.rows[i]) * lat.stride;
}

}  // namespace

Status cpu_max_head_scores(const AttentionShape& shape, const float* q, const PoolKeys& keys,
                           float* scores, ThreadPool& pool) {
    thread_local std::vector<const uint16_t*> rows;
    rows.resize(static_cast<size_t>(keys.n));
    for (int64_t i = 0; i < keys.n; ++i) {
        rows[i] = reinterpret_cast<const uint16_t*>(keys.k + static_cast<size_t>(keys.slots[i]) *
                                                                 keys.row_stride);
    }
    max_head_scores(q, shape.n_heads, shape.n_kv_heads, shape.head_dim, rows.data(), keys.n, scores,
                    pool);
    return Status();
}

Status cpu_deltakv_encode(const LatentEncodeInputs& in, const float* x, int64_t n,
                          const LatentEncodeOutputs& out, ThreadPool& pool) {
    const int d = in.w->d(), m = in.w->m(), kk = in.k;
    pool.parallel_for(n, 8, [&](int64_t b, int64_t e) {
        std::vector<int32_t> near(static_cast<size_t>(kk));
        for (int64_t i = b; i < e; ++i) {
            const int got = l2_nearest(x + i * d, in.ref_x, in.n_cand[i], d, kk, near.data());
            float* ri = out.rm + i * d;
            std::fill(ri, ri + d, 0.0f);
            for (int j = 0; j < kk; ++j) {
                out.refs[i * kk + j] = j < got ? static_cast<uint16_t>(near[j]) : kNoLatentRef;
                if (j >= got) continue;
                const float* rx = in.ref_x + static_cast<size_t>(near[j]) * d;
                for (int t = 0; t < d; ++t) ri[t] += rx[t];
            }
            for (int t = 0; t < d; ++t) ri[t] /= static_cast<float>(std::max(got, 1));
        }
    });
    if (n == 0) return Status();
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(2 * n * in.w->w1.rows));
    deltakv_encode_residual(*in.w, x, out.rm, n, out.z, scratch.data(), pool);
    pool.parallel_for(n, 64, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            uint8_t* row = out.latents + static_cast<size_t>(i) * out.stride;
            if (out.int4) {
                int4_pack(out.z + i * m, m, row);
            } else {
                write_kv_row(DType::kF16, row, out.z + i * m, m);
            }
        }
    });
    return Status();
}

Status cpu_deltakv_pool_rows(const PoolRows& p, float* out, ThreadPool& pool) {
    const int dims = p.v != nullptr ? 2 * p.width : p.width;
    const int half = p.angles.head_dim / 2;
    const int row_bytes = p.width * 2;
    pool.parallel_for(p.n, 32, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            // The rows lie far apart in the pool: ask for a later one while this one is read.
            if (i + 4 < e) {
                const size_t ahead = static_cast<size_t>(p.slots[i + 4]) * p.row_stride;
                prefetch(p.k + ahead, row_bytes);
                if (p.v != nullptr) prefetch(p.v + ahead, row_bytes);
            }
            const size_t at = static_cast<size_t>(p.slots[i]) * p.row_stride;
            float* x = out + i * dims;
            read_kv_row(DType::kF16, p.k + at, x, p.width);
            if (p.v != nullptr) read_kv_row(DType::kF16, p.v + at, x + p.width, p.width);
            const float* a = p.angles.table + p.angles.at[i];
            rope_apply(x, p.angles.n_heads, p.angles.head_dim, a, a + half, p.angles.style, true);
        }
    });
    return Status();
}

namespace {

constexpr int64_t kBlock = 16;  // tokens decoded at a time, their rows used while in cache

// Tokens [b, e) (at most kBlock) made into out (rows of in.dec.d): Dec of their int4 latents,
// their references' mean and RoPE, the last two while a row is in registers
// (Int4KeyFinish). With codes, the tokens' codes go there first and are decoded from there.
void decode_block(const LatentRows& lat, const LatentDecodeInputs& in, int64_t b, int64_t e,
                  float* out, uint8_t* codes) {
    const int dims = in.dec.d, kk = lat.k;
    const uint8_t* latents[kBlock];
    const float* ref_rows[kBlock * 16];
    const float* angle[kBlock];
    int32_t refs[16];
    for (int64_t i = b; i < e; ++i) {
        latents[i - b] = latent_of(lat, i);
        refs_of(lat, i, refs);
        for (int r = 0; r < kk; ++r) {
            ref_rows[(i - b) * kk + r] =
                refs[r] >= 0 ? in.ref_x + static_cast<size_t>(refs[r]) * dims : nullptr;
        }
        angle[i - b] = in.angles.table + in.angles.at[i];
    }
    Int4KeyFinish finish;
    finish.refs = ref_rows;
    finish.k = kk;
    finish.angles = angle;
    finish.n_heads = in.angles.n_heads;
    finish.head_dim = in.angles.head_dim;
    finish.style = in.angles.style;
    if (codes != nullptr) int4_latent_codes(latents, e - b, lat.m, codes);
    deltakv_decode_int4(in.dec, latents, e - b, out, dims, codes, &finish);
}

}  // namespace

Status cpu_deltakv_key_scores(const AttentionShape& shape, const LatentRows& lat,
                              const LatentDecodeInputs& in, const float* q, float* scores,
                              int64_t lds, uint8_t* codes, ThreadPool& pool) {
    const int width = in.dec.d;
    const int32_t stride = int4_code_stride(lat.m);
    // A block at a time, while its rows are in cache: the keys, then every head's score.
    pool.parallel_for_affine(lat.n, kBlock, [&](int64_t b_all, int64_t e_all) {
        thread_local std::vector<float> block;
        block.resize(static_cast<size_t>(kBlock) * width);
        for (int64_t b = b_all; b < e_all; b += kBlock) {
            const int64_t e = std::min(e_all, b + kBlock);
            decode_block(lat, in, b, e, block.data(), codes + b * stride);
            head_scores(shape, q, block.data(), width, e - b, scores + b, lds);
        }
    });
    return Status();
}

Status cpu_deltakv_reconstruct(const LatentRows& lat, const LatentDecodeInputs& in, uint8_t* k_out,
                               uint8_t* v_out, size_t out_stride, ThreadPool& pool) {
    const int d = in.dec.d, width = d / 2;
    // A block at a time, so the rows stay in cache until written.
    pool.parallel_for(lat.n, kBlock, [&](int64_t b_all, int64_t e_all) {
        thread_local std::vector<float> block;
        block.resize(static_cast<size_t>(kBlock) * d);
        for (int64_t b = b_all; b < e_all; b += kBlock) {
            const int64_t e = std::min(e_all, b + kBlock);
            decode_block(lat, in, b, e, block.data(), nullptr);
            for (int64_t i = b; i < e; ++i) {
                const float* x = block.data() + (i - b) * d;
                write_kv_row(DType::kF16, k_out + static_cast<size_t>(i) * out_stride, x, width);
                write_kv_row(DType::kF16, v_out + static_cast<size_t>(i) * out_stride, x + width,
                             width);
            }
        }
    });
    return Status();
}

Status cpu_latent_attention(const AttentionShape& shape, const LatentRows& lat, const float* scores,
                            const LatentValueInputs& in, float* out, float* lse, ThreadPool& pool) {
    thread_local std::vector<const uint8_t*> latents;
    thread_local std::vector<int32_t> refs;
    thread_local std::vector<const uint16_t*> ref_v;
    latents.resize(static_cast<size_t>(lat.n));
    refs.resize(static_cast<size_t>(lat.n) * lat.k);
    for (int64_t i = 0; i < lat.n; ++i) {
        latents[i] = latent_of(lat, i);
        refs_of(lat, i, refs.data() + i * lat.k);
    }
    ref_v.resize(static_cast<size_t>(in.n_refs));
    for (int64_t r = 0; r < in.n_refs; ++r) {
        ref_v[r] = reinterpret_cast<const uint16_t*>(
            in.ref_v + static_cast<size_t>(in.ref_slots[r]) * in.ref_stride);
    }
    LatentTokens t;
    t.n = lat.n;
    t.scores = scores;
    t.latents = latents.data();
    t.int4 = lat.int4;
    t.codes = lat.int4 ? in.codes : nullptr;
    t.m = lat.m;
    t.wd_v = in.wd_v;
    t.refs = refs.data();
    t.ref_slots = lat.k;
    t.ref_v = ref_v.data();
    t.n_refs = in.n_refs;
    latent_attention(shape, t, out, lse, pool);
    return Status();
}

}  // namespace deltaserve::kernels
