// Compute backends behind one interface, found by name.
//
// The CPU backend ("cpu") is always registered and is the reference every other backend is
// tested against. Other backends ("cuda") register themselves from their own source file
// when their library is built and linked; find_backend() returns nullptr for a backend
// that was not built. A registered backend may still have no device: available() says so,
// and its ops then return kUnavailable.
//
// Ops a backend does not implement return kUnimplemented (the default), so callers fall
// back to the CPU.
//
// The forward pass's ops (alloc .. top_k) work on memory the backend owns (Buffer: host
// memory on the CPU backend, device memory on a GPU), fp32 activations in rows `ld` floats
// apart, and weights as the backend's matmuls read them (upload_weight). They run as an Exec
// says: the CPU backend's threads and dot order, a device backend's stream. The CPU
// backend's are today's kernels, bit for bit as the forward pass calls them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/deltakv_ops.h"
#include "deltaserve/kernels/dtype.h"
#include "deltaserve/kernels/matmul.h"
#include "deltaserve/kernels/ops.h"

namespace deltaserve::kernels {

class Backend;

// How an op runs: the CPU backend's threads (required there) and quantized dot order; a
// device backend's stream (nullptr: its default one).
struct Exec {
    ThreadPool* pool = nullptr;
    DotOrder order = DotOrder::kBlock;
    void* stream = nullptr;
};

// Memory a backend allocated (Backend::alloc): host memory on the CPU backend, device memory
// on a GPU. Given back when destroyed; move-only. An empty one holds nothing.
class Buffer {
  public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept;
    Buffer& operator=(Buffer&& other) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer();

    void* data() const { return data_; }
    float* f32() const { return static_cast<float*>(data_); }
    size_t bytes() const { return bytes_; }

  private:
    friend class Backend;
    Buffer(Backend* owner, void* data, size_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
    Backend* owner_ = nullptr;
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

// One sequence's part of Backend::attention_batch: its view, and its n_q queries at rows
// first_row .. first_row + n_q - 1 of q and out.
struct AttentionJob {
    KvView view;
    int64_t first_row = 0;
    int32_t n_q = 0;
};

// Shape and constants of the fused RMSNorm + RoPE over a batch of rows.
// For each row r: out[r] = rms_norm(x[r], weight, eps) over d_model elements, then
// rope(out[r], n_heads, head_dim, positions[r], rope_base, style) on its first
// n_heads * head_dim elements; the rest of the row is only normalized.
struct RmsNormRopeParams {
    int64_t n_rows = 0;          // >= 0; 0 is a no-op
    int64_t d_model = 0;         // row width, > 0
    int n_heads = 0;             // heads rotated, >= 0; n_heads * head_dim <= d_model
    int head_dim = 0;            // even, in [2, 1024] when n_heads > 0
    float eps = 1e-5f;           // Default: 1e-5
    float rope_base = 10000.0f;  // Default: 10000
    RopeStyle style = RopeStyle::kInterleaved;  // Default: kInterleaved
};

// kInvalidArgument when the params break the limits above; OK otherwise.
Status validate(const RmsNormRopeParams& params);

// kInvalidArgument naming `op` when `rope` cannot turn heads of head_dim: a base or
// freq_scale that is not finite and > 0, freq_factors that are not head_dim / 2 values each
// finite and > 0. OK otherwise.
Status validate_rope(const RopeParams& rope, int head_dim, std::string_view op);

// A compute backend. Implementations are thread-safe: ops may be called concurrently.
class Backend {
  public:
    virtual ~Backend() = default;

    // Registry key, lower case: "cpu", "cuda".
    virtual std::string_view name() const = 0;

    // True when the backend can run ops here (for "cuda": a device is present). Cheap
    // after the first call.
    virtual bool available() const = 0;
    // OK when available(), else why not (kUnavailable).
    virtual Status availability() const;

    // The backend and its device, for a log line: "cuda: NVIDIA H200 (sm_90, 139 GiB)".
    virtual std::string description() const { return std::string(name()); }

    // True when this backend's memory (Buffer, upload_weight) is host memory that host code
    // may read and write directly: the CPU backend. A device backend's is not.
    virtual bool host_memory() const { return false; }
    // Bytes of the device's memory free now, for a default KV budget; 0 when unknown (the
    // CPU backend: host memory is the node's to budget).
    virtual size_t free_memory() const { return 0; }

    // The fused RMSNorm + RoPE of RmsNormRopeParams. All pointers are host memory:
    // x and out hold n_rows * d_model floats (out may alias x), weight d_model floats,
    // positions n_rows values (unread when n_heads is 0). Errors: kInvalidArgument
    // (params), kUnavailable (no device), kInternal / kResourceExhausted (device failures),
    // kUnimplemented (the default for a backend without this op).
    virtual Status rms_norm_rope(const RmsNormRopeParams& params, const float* x,
                                 const float* weight, const int64_t* positions, float* out);

    // --- The forward pass's ops. Errors: kInvalidArgument (an Exec or shape the backend
    // cannot run), kUnavailable (no device), kResourceExhausted, kUnimplemented (the default).

    // `bytes` of this backend's memory (uninitialised).
    Result<Buffer> alloc(size_t bytes);
    // Copies between host memory and this backend's memory (the same on the CPU backend).
    virtual Status copy_in(void* dst, const void* host_src, size_t bytes, const Exec& exec);
    virtual Status copy_out(void* host_dst, const void* src, size_t bytes, const Exec& exec);
    // Waits for the work queued on exec's stream (a device backend's ops may return before
    // their kernels ran; copy_out also waits). The default, for backends whose ops finish
    // before they return: nothing to wait for.
    virtual Status synchronize(const Exec& exec) {
        (void)exec;
        return Status();
    }
    // A copy within this backend's memory (ranges do not overlap).
    virtual Status copy(void* dst, const void* src, size_t bytes, const Exec& exec);
    // A weight matrix as this backend's matmuls read it, uploaded once: the CPU backend reads
    // the model's own (returned as it is); a device backend's points into its memory (its
    // bytes live until the backend goes).
    virtual Result<WeightMatrix> upload_weight(const WeightMatrix& host);
    // out[r] = rms_norm(x[r], weight) for n rows of d (kernels::rms_norm).
    virtual Status rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d,
                                 int64_t n, float eps, float* out, int64_t ldo, const Exec& exec);
    // kernels::matmul and matmul_shared_input, with w from upload_weight.
    virtual Status matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                          int64_t ldy, const Exec& exec);
    virtual Status matmul_shared_input(std::span<const MatmulOutput> outputs, const float* x,
                                       int64_t ldx, int64_t n, const Exec& exec);
    // RoPE (kernels::rope with `rope`) on the first n_heads heads of each of n rows, row r at
    // positions[r]; positions and rope.freq_factors (head_dim / 2 values) in host memory.
    virtual Status rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                             const int32_t* positions, const RopeParams& rope, const Exec& exec);
    // Plain RoPE (RopeParams{base, style}).
    Status rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                     const int32_t* positions, float base, RopeStyle style, const Exec& exec) {
        return rope_rows(x, ldx, n, n_heads, head_dim, positions, RopeParams{base, style}, exec);
    }
    // out[i] = silu(gate[i]) * up[i]; y[i] += x[i]; over n values.
    virtual Status silu_mul(float* out, const float* gate, const float* up, int64_t n,
                            const Exec& exec);
    virtual Status add(float* y, const float* x, int64_t n, const Exec& exec);
    // out[i] = gelu(gate[i]) * up[i] (kernels::gelu_mul, Gemma's GeGLU); x[i] *= s; over n
    // values.
    virtual Status gelu_mul(float* out, const float* gate, const float* up, int64_t n,
                            const Exec& exec);
    virtual Status scale(float* x, float s, int64_t n, const Exec& exec);
    // out[i] = row tokens[i] of `table` (an embedding; tokens in host memory, checked by the
    // caller against table.rows).
    virtual Status embed_rows(const WeightMatrix& table, const int32_t* tokens, int64_t n,
                              float* out, const Exec& exec);
    // KV cache rows (a paged pool in this backend's memory; slot lists in host memory):
    // store_rows writes n fp32 rows of `width` values (src, ld floats apart) into the rows
    // slots[i] of the slot-indexed array at dst (row_stride bytes apart), as dtype (kF16,
    // rounded to nearest even, or kF32; kernels::write_kv_row).
    virtual Status store_rows(DType dtype, int64_t width, const float* src, int64_t ld, int64_t n,
                              uint8_t* dst, size_t row_stride, const int32_t* slots,
                              const Exec& exec);
    // copy_rows copies n rows of row_bytes bytes: row src_rows[i] of the array at src
    // (src_stride bytes apart) to row dst_rows[i] of the array at dst; a null list stands for
    // 0, 1, .. n - 1. Rows do not overlap.
    virtual Status copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows,
                             const uint8_t* src, size_t src_stride, const int32_t* src_rows,
                             size_t row_bytes, int64_t n, const Exec& exec);
    // kernels::attention over a KvView in this backend's memory (its slot lists in host
    // memory).
    virtual Status attention(const AttentionShape& shape, const KvView& kv, const float* q,
                             int64_t ldq, int32_t n_q, float* out, int64_t ldo, const Exec& exec);
    // attention() for a batch of sequences, each over its own view (the sequences of a decode
    // step), their rows anywhere in q and out (without overlap). A device backend runs the
    // views of one pool (the same K and V arrays, dtype and strides) as one launch; the
    // default runs attention() per job.
    virtual Status attention_batch(const AttentionShape& shape, std::span<const AttentionJob> jobs,
                                   const float* q, int64_t ldq, float* out, int64_t ldo,
                                   const Exec& exec);
    // The k largest of each of n_rows rows of n_vocab logits, largest first (ties: the lower
    // id first), into ids and values (host memory, n_rows * k each); k <= n_vocab.
    virtual Status top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k,
                         int32_t* ids, float* values, const Exec& exec);

    // attention() with each query row's log-sum-exp (lse[i * n_heads + h], as
    // kernels::attention gives it, -inf for a row that saw no entry); without `causal`, every
    // query sees every entry of the view.
    virtual Status attention_lse(const AttentionShape& shape, const KvView& kv, const float* q,
                                 int64_t ldq, int32_t n_q, float* out, int64_t ldo, float* lse,
                                 bool causal, const Exec& exec);
    // kernels::merge_attention: out and lse (n_rows rows of head_dim, n_rows values) become
    // attention over both sets of entries.
    virtual Status merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                                   int n_rows, int head_dim, const Exec& exec);

    // --- DeltaKV's compression, decode step and a chunk's reconstruction (deltakv_ops.h).
    // The CPU backend's are deltakv.h's kernels, bit for bit as the cache calls them.

    // Compression of n tokens of one sparse layer (x: n rows of D floats, K before RoPE then
    // V): each token's k nearest candidate references by L2 distance (nearest first; ties: the
    // lower ordinal), their mean rm, z = E(x) - E(rm) (deltakv_encode_residual) and z as
    // stored (int4_pack, or fp16).
    virtual Status deltakv_encode(const LatentEncodeInputs& in, const float* x, int64_t n,
                                  const LatentEncodeOutputs& out, const Exec& exec);

    // Selection scores (OmniKV-style; kernels::max_head_scores): for each of keys.n rows,
    // scores[i] = the max over query heads h of q[h] . K_i[h / (n_heads / n_kv_heads)]
    // (unscaled). q: one query, n_heads * head_dim floats.
    virtual Status max_head_scores(const AttentionShape& shape, const float* q,
                                   const PoolKeys& keys, float* scores, const Exec& exec);
    // An int4 decoder as this backend's ops read it, uploaded once (its bytes live until the
    // backend goes; the CPU backend reads the decoder's own).
    virtual Result<Int4DecoderRef> upload_int4_decoder(const Int4Decoder& host);
    // out = the PoolRows' rows: width floats each, or 2 * width with V.
    virtual Status deltakv_pool_rows(const PoolRows& rows, float* out, const Exec& exec);
    // One query's score of each of lat.n int4 latent tokens: scores[h * lds + i] =
    // shape.scale * q[h] . K_i[h / (n_heads / n_kv_heads)], K_i being token i's key made as
    // deltakv_decode_int4 with an Int4KeyFinish makes it (Dec_k of its latent, plus the mean
    // of its references' K rows, then RoPE at its angles). q: n_heads * head_dim floats.
    // codes: the tokens' codes (int4_latent_codes, int4_code_stride(m) bytes each), kept for
    // latent_attention.
    virtual Status deltakv_key_scores(const AttentionShape& shape, const LatentRows& lat,
                                      const LatentDecodeInputs& in, const float* q, float* scores,
                                      int64_t lds, uint8_t* codes, const Exec& exec);
    // Each of lat.n int4 latent tokens made whole, as a chunk attends it: Dec of its latent
    // (in.dec: all 2 * width rows), plus the mean of its references' rows (K before RoPE,
    // then V), then RoPE on K at its angles; K into row i of k_out and V into row i of v_out
    // (fp16, out_stride bytes apart), as deltakv_decode_int4, add_mean_rows, rope_apply and
    // write_kv_row make them. Of shape, the KV heads only are read.
    virtual Status deltakv_reconstruct(const AttentionShape& shape, const LatentRows& lat,
                                       const LatentDecodeInputs& in, uint8_t* k_out, uint8_t* v_out,
                                       size_t out_stride, const Exec& exec);
    // kernels::latent_attention of one query over lat.n latent tokens (int4, or fp16 when
    // int4 is false), scored as deltakv_key_scores scores them (lds = lat.n): out (n_heads *
    // head_dim floats) and lse (n_heads).
    virtual Status latent_attention(const AttentionShape& shape, const LatentRows& lat,
                                    const float* scores, const LatentValueInputs& in, float* out,
                                    float* lse, const Exec& exec);

  protected:
    // alloc's and Buffer's halves: memory of `bytes` (nullptr when it cannot), and its end.
    virtual void* allocate(size_t bytes);
    virtual void deallocate(void* data, size_t bytes);

  private:
    friend class Buffer;
};

// Adds a backend to the process-wide registry. Called from a backend's own source file,
// possibly during static initialization. A second backend with the same name replaces
// nothing and is dropped (kAlreadyExists). Thread-safe.
Status register_backend(std::unique_ptr<Backend> backend);

// The backend registered under name, or nullptr when none is (not built, unknown name).
// The pointer lives until the process exits. Thread-safe.
Backend* find_backend(std::string_view name);

// Names of the registered backends, sorted.
std::vector<std::string> backend_names();

// The backend a run asked for with --device: "cpu", "cuda", or "" for the default, cuda when
// that backend is built and finds a device (said once in the log), else cpu. Errors:
// kInvalidArgument for another name, kUnavailable for "cuda" when it is not built or finds
// no device (the message says which).
Result<Backend*> choose_backend(std::string_view device);

}  // namespace deltaserve::kernels
