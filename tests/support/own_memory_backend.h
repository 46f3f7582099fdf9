// A backend whose memory is not the host's, as a GPU's is not, for tests on a machine
// without one.
//
// Its memory is its own (allocated, uploaded) and every pointer an op gets must lie in it,
// except those the interface says are host memory (positions, tokens, slot lists). A pointer
// from elsewhere fails the op, as a host pointer would fault on a device. The arithmetic is
// the CPU backend's, so results must be the CPU backend's bits: any row copied wrong,
// skipped or read from stale memory shows. New memory is filled with NaN bytes.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/deltakv.h"

namespace deltaserve::testing {

class OwnMemoryBackend final : public kernels::Backend {
  public:
    std::string_view name() const override { return "own-memory"; }
    bool available() const override { return true; }

    int uploads() const { return uploads_.load(); }
    // Attention calls over a view in this backend's memory, and batches of them.
    int attentions() const { return attentions_.load(); }
    int attention_batches() const { return batches_.load(); }
    // DeltaKV's compressions and its decode steps' attention through the latents.
    int encodes() const { return encodes_.load(); }
    int latent_attentions() const { return latent_attentions_.load(); }
    // The pointer check after `n` more pass fails, and its op (negative: none does).
    void fail_after(int n) { fail_after_.store(n); }
    // Pointer checks so far: where a failure can be injected.
    int checks() const { return checks_.load(); }

    Status copy_in(void* dst, const void* src, size_t bytes, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(check("copy_in", dst, bytes));
        return cpu_.copy_in(dst, src, bytes, e);
    }
    Status copy_out(void* dst, const void* src, size_t bytes, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(check("copy_out", src, bytes));
        return cpu_.copy_out(dst, src, bytes, e);
    }
    Status copy(void* dst, const void* src, size_t bytes, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(check("copy", dst, bytes));
        DS_RETURN_IF_ERROR(check("copy", src, bytes));
        return cpu_.copy(dst, src, bytes, e);
    }
    Result<kernels::WeightMatrix> upload_weight(const kernels::WeightMatrix& host) override {
        ++uploads_;
        const size_t bytes = static_cast<size_t>(host.rows) * host.row_stride();
        void* mem = allocate(bytes);
        if (mem == nullptr) return resource_exhausted("own-memory: upload");
        std::memcpy(mem, host.data, bytes);
        kernels::WeightMatrix w = host;
        w.data = mem;
        return w;
    }
    Status rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d, int64_t n,
                         float eps, float* out, int64_t ldo, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(rows("rms_norm_rows", x, ldx, d, n));
        DS_RETURN_IF_ERROR(rows("rms_norm_rows", out, ldo, d, n));
        DS_RETURN_IF_ERROR(check("rms_norm_rows", weight, d * 4));
        return cpu_.rms_norm_rows(x, ldx, weight, d, n, eps, out, ldo, e);
    }
    Status matmul(const kernels::WeightMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                  int64_t ldy, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(weight("matmul", w));
        DS_RETURN_IF_ERROR(rows("matmul", x, ldx, w.cols, n));
        DS_RETURN_IF_ERROR(rows("matmul", y, ldy, w.rows, n));
        return cpu_.matmul(w, x, ldx, n, y, ldy, e);
    }
    Status matmul_shared_input(std::span<const kernels::MatmulOutput> outputs, const float* x,
                               int64_t ldx, int64_t n, const kernels::Exec& e) override {
        for (const kernels::MatmulOutput& o : outputs) {
            DS_RETURN_IF_ERROR(weight("matmul_shared_input", *o.w));
            DS_RETURN_IF_ERROR(rows("matmul_shared_input", x, ldx, o.w->cols, n));
            DS_RETURN_IF_ERROR(rows("matmul_shared_input", o.y, o.ldy, o.w->rows, n));
        }
        return cpu_.matmul_shared_input(outputs, x, ldx, n, e);
    }
    using kernels::Backend::rope_rows;  // and its plain-RoPE form
    Status rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                     const int32_t* positions, const kernels::RopeParams& rope,
                     const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(rows("rope_rows", x, ldx, int64_t{n_heads} * head_dim, n));
        return cpu_.rope_rows(x, ldx, n, n_heads, head_dim, positions, rope, e);
    }
    Status silu_mul(float* out, const float* gate, const float* up, int64_t n,
                    const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(check("silu_mul", out, n * 4));
        DS_RETURN_IF_ERROR(check("silu_mul", gate, n * 4));
        DS_RETURN_IF_ERROR(check("silu_mul", up, n * 4));
        return cpu_.silu_mul(out, gate, up, n, e);
    }
    Status add(float* y, const float* x, int64_t n, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(check("add", y, n * 4));
        DS_RETURN_IF_ERROR(check("add", x, n * 4));
        return cpu_.add(y, x, n, e);
    }
    Status gelu_mul(float* out, const float* gate, const float* up, int64_t n,
                    const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(check("gelu_mul", out, n * 4));
        DS_RETURN_IF_ERROR(check("gelu_mul", gate, n * 4));
        DS_RETURN_IF_ERROR(check("gelu_mul", up, n * 4));
        return cpu_.gelu_mul(out, gate, up, n, e);
    }
    Status scale(float* x, float s, int64_t n, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(check("scale", x, n * 4));
        return cpu_.scale(x, s, n, e);
    }
    Status embed_rows(const kernels::WeightMatrix& table, const int32_t* tokens, int64_t n,
                      float* out, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(weight("embed_rows", table));
        DS_RETURN_IF_ERROR(check("embed_rows", out, n * table.cols * 4));
        return cpu_.embed_rows(table, tokens, n, out, e);
    }
    Status store_rows(kernels::DType dtype, int64_t width, const float* src, int64_t ld, int64_t n,
                      uint8_t* dst, size_t row_stride, const int32_t* slots,
                      const kernels::Exec& e) override {
        if (n == 0) return Status();
        DS_RETURN_IF_ERROR(rows("store_rows", src, ld, width, n));
        const int64_t elem = dtype == kernels::DType::kF16 ? 2 : 4;
        DS_RETURN_IF_ERROR(slotted("store_rows", dst, row_stride, slots, n, width * elem));
        return cpu_.store_rows(dtype, width, src, ld, n, dst, row_stride, slots, e);
    }
    Status copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows, const uint8_t* src,
                     size_t src_stride, const int32_t* src_rows, size_t row_bytes, int64_t n,
                     const kernels::Exec& e) override {
        if (n == 0) return Status();
        const auto size = static_cast<int64_t>(row_bytes);
        DS_RETURN_IF_ERROR(slotted("copy_rows", dst, dst_stride, dst_rows, n, size));
        DS_RETURN_IF_ERROR(slotted("copy_rows", src, src_stride, src_rows, n, size));
        return cpu_.copy_rows(dst, dst_stride, dst_rows, src, src_stride, src_rows, row_bytes, n,
                              e);
    }
    Status attention(const kernels::AttentionShape& shape, const kernels::KvView& kv,
                     const float* q, int64_t ldq, int32_t n_q, float* out, int64_t ldo,
                     const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(attention_args("attention", shape, kv, q, ldq, n_q, out, ldo));
        ++attentions_;
        return cpu_.attention(shape, kv, q, ldq, n_q, out, ldo, e);
    }

    // DeltaKV's ops (deltakv_ops.h), each array checked as the forward ops' are.
    Status attention_lse(const kernels::AttentionShape& shape, const kernels::KvView& kv,
                         const float* q, int64_t ldq, int32_t n_q, float* out, int64_t ldo,
                         float* lse, bool causal, const kernels::Exec& e) override {
        DS_RETURN_IF_ERROR(attention_args("attention_lse", shape, kv, q, ldq, n_q, out, ldo));
        DS_RETURN_IF_ERROR(check("attention_lse", lse, int64_t{n_q} * shape.n_heads * 4));
        return cpu_.attention_lse(shape, kv, q, ldq, n_q, out, ldo, lse, causal, e);
    }
    Status merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                           int n_rows, int head_dim, const kernels::Exec& e) override {
        for (const float* p : {static_cast<const float*>(out), out_b})
            DS_RETURN_IF_ERROR(check("merge_attention", p, int64_t{n_rows} * head_dim * 4));
        for (const float* p : {static_cast<const float*>(lse), lse_b})
            DS_RETURN_IF_ERROR(check("merge_attention", p, int64_t{n_rows} * 4));
        return cpu_.merge_attention(out, lse, out_b, lse_b, n_rows, head_dim, e);
    }
    Result<kernels::Int4DecoderRef> upload_int4_decoder(const kernels::Int4Decoder& host) override {
        ++uploads_;
        const size_t w = host.w.size(), rows = static_cast<size_t>(host.d) * sizeof(float);
        auto* mem = static_cast<uint8_t*>(allocate(w + 2 * rows));
        if (mem == nullptr) return resource_exhausted("own-memory: upload");
        std::memcpy(mem, host.w.data(), w);
        std::memcpy(mem + w, host.scale.data(), rows);
        std::memcpy(mem + w + rows, host.row_sum.data(), rows);
        kernels::Int4DecoderRef r = host.ref();
        r.w = reinterpret_cast<const int8_t*>(mem);
        r.scale = reinterpret_cast<const float*>(mem + w);
        r.row_sum = reinterpret_cast<const float*>(mem + w + rows);
        return r;
    }
    Status max_head_scores(const kernels::AttentionShape& shape, const float* q,
                           const kernels::PoolKeys& keys, float* scores,
                           const kernels::Exec& e) override {
        if (keys.n > 0) {
            DS_RETURN_IF_ERROR(
                check("max_head_scores", q, int64_t{shape.n_heads} * shape.head_dim * 4));
            DS_RETURN_IF_ERROR(slotted("max_head_scores", keys.k, keys.row_stride, keys.slots,
                                       keys.n, int64_t{shape.n_kv_heads} * shape.head_dim * 2));
            DS_RETURN_IF_ERROR(check("max_head_scores", scores, keys.n * 4));
        }
        return cpu_.max_head_scores(shape, q, keys, scores, e);
    }
    Status deltakv_encode(const kernels::LatentEncodeInputs& in, const float* x, int64_t n,
                          const kernels::LatentEncodeOutputs& out,
                          const kernels::Exec& e) override {
        if (n > 0 && in.w != nullptr) {
            const int64_t d = in.w->d(), m = in.w->m();
            for (const kernels::WeightMatrix* w : {&in.w->w1, &in.w->w2, &in.w->w3})
                DS_RETURN_IF_ERROR(weight("deltakv_encode", *w));
            if (in.n_refs > 0)
                DS_RETURN_IF_ERROR(check("deltakv_encode", in.ref_x, in.n_refs * d * 4));
            DS_RETURN_IF_ERROR(check("deltakv_encode", x, n * d * 4));
            DS_RETURN_IF_ERROR(check("deltakv_encode", out.refs, n * in.k * 2));
            DS_RETURN_IF_ERROR(check("deltakv_encode", out.rm, n * d * 4));
            DS_RETURN_IF_ERROR(check("deltakv_encode", out.z, n * m * 4));
            DS_RETURN_IF_ERROR(
                check("deltakv_encode", out.latents, n * static_cast<int64_t>(out.stride)));
        }
        ++encodes_;
        return cpu_.deltakv_encode(in, x, n, out, e);
    }
    Status deltakv_pool_rows(const kernels::PoolRows& r, float* out,
                             const kernels::Exec& e) override {
        if (r.n > 0) {
            const int64_t bytes = int64_t{r.width} * 2;
            DS_RETURN_IF_ERROR(
                slotted("deltakv_pool_rows", r.k, r.row_stride, r.slots, r.n, bytes));
            if (r.v != nullptr)
                DS_RETURN_IF_ERROR(
                    slotted("deltakv_pool_rows", r.v, r.row_stride, r.slots, r.n, bytes));
            DS_RETURN_IF_ERROR(angles("deltakv_pool_rows", r.angles, r.n));
            DS_RETURN_IF_ERROR(
                check("deltakv_pool_rows", out, r.n * (r.v != nullptr ? 2 : 1) * r.width * 4));
        }
        return cpu_.deltakv_pool_rows(r, out, e);
    }
    Status deltakv_key_scores(const kernels::AttentionShape& shape, const kernels::LatentRows& lat,
                              const kernels::LatentDecodeInputs& in, const float* q, float* scores,
                              int64_t lds, uint8_t* codes, const kernels::Exec& e) override {
        if (lat.n > 0) {
            DS_RETURN_IF_ERROR(latents("deltakv_key_scores", lat));
            DS_RETURN_IF_ERROR(decoder("deltakv_key_scores", in));
            DS_RETURN_IF_ERROR(
                check("deltakv_key_scores", q, int64_t{shape.n_heads} * shape.head_dim * 4));
            DS_RETURN_IF_ERROR(
                check("deltakv_key_scores", scores, ((shape.n_heads - 1) * lds + lat.n) * 4));
            DS_RETURN_IF_ERROR(
                check("deltakv_key_scores", codes, lat.n * kernels::int4_code_stride(lat.m)));
        }
        return cpu_.deltakv_key_scores(shape, lat, in, q, scores, lds, codes, e);
    }
    Status deltakv_reconstruct(const kernels::AttentionShape& shape, const kernels::LatentRows& lat,
                               const kernels::LatentDecodeInputs& in, uint8_t* k_out,
                               uint8_t* v_out, size_t out_stride, const kernels::Exec& e) override {
        if (lat.n > 0) {
            DS_RETURN_IF_ERROR(latents("deltakv_reconstruct", lat));
            DS_RETURN_IF_ERROR(decoder("deltakv_reconstruct", in));
            const int64_t bytes = int64_t{shape.n_kv_heads} * shape.head_dim * 2;
            for (uint8_t* o : {k_out, v_out}) {
                DS_RETURN_IF_ERROR(
                    slotted("deltakv_reconstruct", o, out_stride, nullptr, lat.n, bytes));
            }
        }
        return cpu_.deltakv_reconstruct(shape, lat, in, k_out, v_out, out_stride, e);
    }
    Status latent_attention(const kernels::AttentionShape& shape, const kernels::LatentRows& lat,
                            const float* scores, const kernels::LatentValueInputs& in, float* out,
                            float* lse, const kernels::Exec& e) override {
        const int64_t width = int64_t{shape.n_kv_heads} * shape.head_dim;
        if (lat.n > 0) {
            DS_RETURN_IF_ERROR(latents("latent_attention", lat));
            DS_RETURN_IF_ERROR(check("latent_attention", scores, lat.n * shape.n_heads * 4));
            if (in.codes != nullptr) {
                DS_RETURN_IF_ERROR(
                    check("latent_attention", in.codes, lat.n * kernels::int4_code_stride(lat.m)));
            }
        }
        DS_RETURN_IF_ERROR(check("latent_attention", in.wd_v, width * lat.m * 4));
        if (in.n_refs > 0) {
            DS_RETURN_IF_ERROR(slotted("latent_attention", in.ref_v, in.ref_stride, in.ref_slots,
                                       in.n_refs, width * 2));
        }
        DS_RETURN_IF_ERROR(
            check("latent_attention", out, int64_t{shape.n_heads} * shape.head_dim * 4));
        DS_RETURN_IF_ERROR(check("latent_attention", lse, int64_t{shape.n_heads} * 4));
        ++latent_attentions_;
        return cpu_.latent_attention(shape, lat, scores, in, out, lse, e);
    }

    Status top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k, int32_t* ids,
                 float* values, const kernels::Exec& e) override {
        ++top_ks_;
        DS_RETURN_IF_ERROR(rows("top_k", logits, n_vocab, n_vocab, n_rows));
        return cpu_.top_k(logits, n_vocab, n_rows, k, ids, values, e);
    }
    int top_ks() const { return top_ks_.load(); }
    // The default: attention() per job, each checked.
    Status attention_batch(const kernels::AttentionShape& shape,
                           std::span<const kernels::AttentionJob> jobs, const float* q, int64_t ldq,
                           float* out, int64_t ldo, const kernels::Exec& e) override {
        ++batches_;
        return Backend::attention_batch(shape, jobs, q, ldq, out, ldo, e);
    }

  protected:
    void* allocate(size_t bytes) override {
        void* p = ::operator new(bytes, std::nothrow);
        if (p != nullptr) {
            std::memset(p, 0xff, bytes);  // NaN: a read before a write shows in the results
            std::lock_guard lock(mu_);
            ranges_[reinterpret_cast<uintptr_t>(p)] = bytes;
        }
        return p;
    }
    void deallocate(void* data, size_t) override {
        {
            std::lock_guard lock(mu_);
            ranges_.erase(reinterpret_cast<uintptr_t>(data));
        }
        ::operator delete(data);
    }

  private:
    // [p, p + bytes) lies in one allocation of this backend; and the injected failure.
    Status check(const char* op, const void* p, int64_t bytes) {
        ++checks_;
        if (fail_after_.load() >= 0 && fail_after_.fetch_sub(1) == 0)
            return internal_error(std::string("own-memory: ") + op + ": injected failure");
        const auto a = reinterpret_cast<uintptr_t>(p);
        std::lock_guard lock(mu_);
        auto it = ranges_.upper_bound(a);
        if (it != ranges_.begin()) {
            --it;
            if (a + static_cast<uintptr_t>(bytes) <= it->first + it->second) return Status();
        }
        return invalid_argument(std::string("own-memory: ") + op +
                                " got memory this backend does not own");
    }
    Status rows(const char* op, const float* p, int64_t ld, int64_t width, int64_t n) {
        return check(op, p, ((n - 1) * ld + width) * 4);
    }
    // Rows list[0, n) (0 .. n - 1 without a list) of `size` bytes, `stride` apart from base.
    Status slotted(const char* op, const void* base, size_t stride, const int32_t* list, int64_t n,
                   int64_t size) {
        int64_t last = n - 1;
        if (list != nullptr) last = n > 0 ? *std::max_element(list, list + n) : 0;
        return check(op, base, last * static_cast<int64_t>(stride) + size);
    }
    Status attention_args(const char* op, const kernels::AttentionShape& shape,
                          const kernels::KvView& kv, const float* q, int64_t ldq, int32_t n_q,
                          const float* out, int64_t ldo) {
        const int64_t width = int64_t{shape.n_heads} * shape.head_dim;
        DS_RETURN_IF_ERROR(rows(op, q, ldq, width, n_q));
        DS_RETURN_IF_ERROR(rows(op, out, ldo, width, n_q));
        const int64_t elem = kv.dtype == kernels::DType::kF16 ? 2 : 4;
        const int64_t row = static_cast<int64_t>(kv.head_offset(shape.n_kv_heads - 1)) +
                            int64_t{shape.head_dim} * elem;
        for (int g = 0; g < shape.n_kv_heads; ++g) {
            for (const uint8_t* base : {kv.k, kv.v}) {
                if (kv.n_of(g) == 0) continue;
                DS_RETURN_IF_ERROR(
                    slotted(op, base, kv.row_stride, kv.slots_of(g), kv.n_of(g), row));
            }
        }
        return Status();
    }
    // Angles at each of n offsets (host memory) into the table.
    Status angles(const char* op, const kernels::RopeAngles& a, int64_t n) {
        const int32_t last = n > 0 ? *std::max_element(a.at, a.at + n) : 0;
        return check(op, a.table, (int64_t{last} + a.head_dim) * 4);
    }
    // A LatentRows' latents and reference ordinals, at the rows its list names.
    Status latents(const char* op, const kernels::LatentRows& lat) {
        const int64_t bytes =
            lat.int4 ? static_cast<int64_t>(kernels::int4_bytes(lat.m)) : 2 * lat.m;
        DS_RETURN_IF_ERROR(slotted(op, lat.latents, lat.stride, lat.rows, lat.n, bytes));
        return slotted(op, lat.refs, size_t(lat.k) * 2, lat.rows, lat.n, int64_t{lat.k} * 2);
    }
    Status decoder(const char* op, const kernels::LatentDecodeInputs& in) {
        DS_RETURN_IF_ERROR(check(op, in.dec.w, int64_t{in.dec.m16} * in.dec.d));
        DS_RETURN_IF_ERROR(check(op, in.dec.scale, int64_t{in.dec.d} * 4));
        DS_RETURN_IF_ERROR(check(op, in.dec.row_sum, int64_t{in.dec.d} * 4));
        if (in.n_refs > 0) DS_RETURN_IF_ERROR(check(op, in.ref_x, in.n_refs * in.dec.d * 4));
        return Status();
    }
    Status weight(const char* op, const kernels::WeightMatrix& w) {
        return check(op, w.data,
                     static_cast<int64_t>(static_cast<size_t>(w.rows) * w.row_stride()));
    }

    kernels::Backend& cpu_ = *kernels::find_backend("cpu");
    std::mutex mu_;
    std::map<uintptr_t, size_t> ranges_;
    std::atomic<int> uploads_{0};
    std::atomic<int> attentions_{0};
    std::atomic<int> batches_{0};
    std::atomic<int> top_ks_{0};
    std::atomic<int> encodes_{0};
    std::atomic<int> latent_attentions_{0};
    std::atomic<int> fail_after_{-1};
    std::atomic<int> checks_{0};
};

}  // namespace deltaserve::testing
