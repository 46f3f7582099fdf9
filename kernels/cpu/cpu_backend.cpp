// The CPU backend: today's kernels behind kernels::Backend, called as the forward pass calls
// them (the same row splits over the pool, the same dot order), so that its results are the
// same bits. Its memory is host memory, 64-byte aligned.
#include "cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <numeric>
#include <string>

#include "deltaserve/kernels/kv_row.h"
#include "deltaserve/kernels/repack.h"

namespace deltaserve::kernels {

namespace {

constexpr std::align_val_t kAlign{64};

Status need_pool(const Exec& exec, const char* op) {
    if (exec.pool == nullptr)
        return invalid_argument(std::string("cpu: ") + op + " needs Exec::pool");
    return Status();
}

class CpuBackend final : public Backend {
  public:
    std::string_view name() const override { return "cpu"; }
    bool available() const override { return true; }
    bool host_memory() const override { return true; }

    Status rms_norm_rope(const RmsNormRopeParams& p, const float* x, const float* weight,
                         const int64_t* positions, float* out) override {
        DS_RETURN_IF_ERROR(validate(p));
        for (int64_t r = 0; r < p.n_rows; ++r) {
            float* row = out + r * p.d_model;
            rms_norm(row, x + r * p.d_model, weight, p.d_model, p.eps);
            if (p.n_heads > 0) rope(row, p.n_heads, p.head_dim, positions[r], p.rope_base, p.style);
        }
        return Status();
    }

    Status copy_in(void* dst, const void* src, size_t bytes, const Exec&) override {
        if (bytes > 0) std::memcpy(dst, src, bytes);
        return Status();
    }
    Status copy_out(void* dst, const void* src, size_t bytes, const Exec&) override {
        if (bytes > 0) std::memcpy(dst, src, bytes);
        return Status();
    }
    Status copy(void* dst, const void* src, size_t bytes, const Exec&) override {
        if (bytes > 0) std::memcpy(dst, src, bytes);
        return Status();
    }
    Result<WeightMatrix> upload_weight(const WeightMatrix& host) override { return host; }

    Status rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d, int64_t n,
                         float eps, float* out, int64_t ldo, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "rms_norm_rows"));
        exec.pool->parallel_for(n, 16, [&](int64_t b, int64_t e) {
            for (int64_t t = b; t < e; ++t) rms_norm(out + t * ldo, x + t * ldx, weight, d, eps);
        });
        return Status();
    }
    Status matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                  int64_t ldy, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "matmul"));
        kernels::matmul(w, x, ldx, n, y, ldy, *exec.pool, exec.order);
        return Status();
    }
    Status matmul_shared_input(std::span<const MatmulOutput> outputs, const float* x, int64_t ldx,
                               int64_t n, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "matmul_shared_input"));
        kernels::matmul_shared_input(outputs, x, ldx, n, *exec.pool, exec.order);
        return Status();
    }
    using Backend::rope_rows;  // and its plain-RoPE form
    Status rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                     const int32_t* positions, const RopeParams& rope, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "rope_rows"));
        DS_RETURN_IF_ERROR(validate_rope(rope, head_dim, "cpu: rope_rows"));
        exec.pool->parallel_for(n, 16, [&](int64_t b, int64_t e) {
            for (int64_t t = b; t < e; ++t)
                kernels::rope(x + t * ldx, n_heads, head_dim, positions[t], rope);
        });
        return Status();
    }
    Status silu_mul(float* out, const float* gate, const float* up, int64_t n,
                    const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "silu_mul"));
        // Elementwise: any split gives the same bits.
        exec.pool->parallel_for(n, 16384, [&](int64_t b, int64_t e) {
            kernels::silu_mul(out + b, gate + b, up + b, e - b);
        });
        return Status();
    }
    Status gelu_mul(float* out, const float* gate, const float* up, int64_t n,
                    const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "gelu_mul"));
        exec.pool->parallel_for(n, 16384, [&](int64_t b, int64_t e) {
            kernels::gelu_mul(out + b, gate + b, up + b, e - b);
        });
        return Status();
    }
    Status scale(float* x, float s, int64_t n, const Exec&) override {
        scale_inplace(x, s, n);
        return Status();
    }
    Status add(float* y, const float* x, int64_t n, const Exec&) override {
        add_inplace(y, x, n);
        return Status();
    }
    Status embed_rows(const WeightMatrix& table, const int32_t* tokens, int64_t n, float* out,
                      const Exec&) override {
        for (int64_t i = 0; i < n; ++i)
            dequantize_weight_row(table, tokens[i], out + i * table.cols);
        return Status();
    }
    Status store_rows(DType dtype, int64_t width, const float* src, int64_t ld, int64_t n,
                      uint8_t* dst, size_t row_stride, const int32_t* slots, const Exec&) override {
        if (dtype != DType::kF16 && dtype != DType::kF32)
            return invalid_argument("cpu: store_rows: KV rows must be F16 or F32");
        for (int64_t i = 0; i < n; ++i) {
            write_kv_row(dtype, dst + static_cast<size_t>(slots[i]) * row_stride, src + i * ld,
                         static_cast<int32_t>(width));
        }
        return Status();
    }
    Status copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows, const uint8_t* src,
                     size_t src_stride, const int32_t* src_rows, size_t row_bytes, int64_t n,
                     const Exec&) override {
        for (int64_t i = 0; i < n; ++i) {
            const auto d = static_cast<size_t>(dst_rows != nullptr ? dst_rows[i] : i);
            const auto s = static_cast<size_t>(src_rows != nullptr ? src_rows[i] : i);
            std::memcpy(dst + d * dst_stride, src + s * src_stride, row_bytes);
        }
        return Status();
    }
    Status attention(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                     int32_t n_q, float* out, int64_t ldo, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "attention"));
        kernels::attention(shape, kv, q, ldq, n_q, out, ldo, *exec.pool);
        return Status();
    }
    Status attention_lse(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                         int32_t n_q, float* out, int64_t ldo, float* lse, bool causal,
                         const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "attention_lse"));
        kernels::attention(shape, kv, q, ldq, n_q, out, ldo, *exec.pool, lse, causal);
        return Status();
    }
    Status merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                           int n_rows, int head_dim, const Exec&) override {
        kernels::merge_attention(out, lse, out_b, lse_b, n_rows, head_dim);
        return Status();
    }
    Result<Int4DecoderRef> upload_int4_decoder(const Int4Decoder& host) override {
        return host.ref();
    }
    Status max_head_scores(const AttentionShape& shape, const float* q, const PoolKeys& keys,
                           float* scores, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "max_head_scores"));
        DS_RETURN_IF_ERROR(validate(shape, keys));
        DS_RETURN_IF_ERROR(need_arrays("max_head_scores", keys.n, {q, scores}));
        return cpu_max_head_scores(shape, q, keys, scores, *exec.pool);
    }
    Status deltakv_encode(const LatentEncodeInputs& in, const float* x, int64_t n,
                          const LatentEncodeOutputs& out, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "deltakv_encode"));
        DS_RETURN_IF_ERROR(validate(in, x, n, out));
        return cpu_deltakv_encode(in, x, n, out, *exec.pool);
    }
    Status deltakv_pool_rows(const PoolRows& rows, float* out, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "deltakv_pool_rows"));
        DS_RETURN_IF_ERROR(validate(rows));
        DS_RETURN_IF_ERROR(need_arrays("deltakv_pool_rows", rows.n, {out}));
        return cpu_deltakv_pool_rows(rows, out, *exec.pool);
    }
    Status deltakv_key_scores(const AttentionShape& shape, const LatentRows& lat,
                              const LatentDecodeInputs& in, const float* q, float* scores,
                              int64_t lds, uint8_t* codes, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "deltakv_key_scores"));
        DS_RETURN_IF_ERROR(validate(shape, lat, in, false));
        DS_RETURN_IF_ERROR(need_arrays("deltakv_key_scores", lat.n, {q, scores, codes}));
        if (lds < lat.n) return invalid_argument("cpu: deltakv_key_scores: lds < n");
        return cpu_deltakv_key_scores(shape, lat, in, q, scores, lds, codes, *exec.pool);
    }
    Status deltakv_reconstruct(const AttentionShape& shape, const LatentRows& lat,
                               const LatentDecodeInputs& in, uint8_t* k_out, uint8_t* v_out,
                               size_t out_stride, const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "deltakv_reconstruct"));
        DS_RETURN_IF_ERROR(validate(shape, lat, in, true));
        DS_RETURN_IF_ERROR(need_arrays("deltakv_reconstruct", lat.n, {k_out, v_out}));
        if (out_stride < static_cast<size_t>(in.dec.d))
            return invalid_argument("cpu: deltakv_reconstruct: output rows closer than their size");
        return cpu_deltakv_reconstruct(lat, in, k_out, v_out, out_stride, *exec.pool);
    }
    Status latent_attention(const AttentionShape& shape, const LatentRows& lat, const float* scores,
                            const LatentValueInputs& in, float* out, float* lse,
                            const Exec& exec) override {
        DS_RETURN_IF_ERROR(need_pool(exec, "latent_attention"));
        DS_RETURN_IF_ERROR(validate(shape, lat, in));
        DS_RETURN_IF_ERROR(need_arrays("latent_attention", 1, {out, lse}));
        DS_RETURN_IF_ERROR(need_arrays("latent_attention", lat.n, {scores}));
        return cpu_latent_attention(shape, lat, scores, in, out, lse, *exec.pool);
    }
    Status top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k, int32_t* ids,
                 float* values, const Exec&) override {
        if (k < 1 || k > n_vocab)
            return invalid_argument("cpu: top_k: k must be in [1, n_vocab], got " +
                                    std::to_string(k));
        std::vector<int32_t> order(static_cast<size_t>(n_vocab));
        for (int64_t r = 0; r < n_rows; ++r) {
            const float* row = logits + r * n_vocab;
            // NaN sorts last: a strict weak order whatever the logits hold.
            const auto key = [row](int32_t i) { return std::isnan(row[i]) ? -INFINITY : row[i]; };
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + k, order.end(),
                              [&](int32_t a, int32_t b) {
                                  const float ka = key(a), kb = key(b);
                                  return ka != kb ? ka > kb : a < b;
                              });
            for (int32_t j = 0; j < k; ++j) {
                ids[r * k + j] = order[static_cast<size_t>(j)];
                values[r * k + j] = row[order[static_cast<size_t>(j)]];
            }
        }
        return Status();
    }

  protected:
    void* allocate(size_t bytes) override {
        return bytes == 0 ? nullptr : ::operator new(bytes, kAlign, std::nothrow);
    }
    void deallocate(void* data, size_t) override { ::operator delete(data, kAlign); }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace deltaserve::kernels
