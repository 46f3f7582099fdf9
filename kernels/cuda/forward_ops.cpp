#include "forward_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "cuda_status.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/repack.h"
#include "elementwise.h"
#include "kv_rows.h"
#include "matmul.h"
#include "op_status.h"
#include "stream_buffer.h"
#include "top_k.h"

namespace deltaserve::kernels::cuda {
namespace {

std::string type_name(DType t) {
    const DTypeTraits* traits = dtype_traits(static_cast<uint32_t>(t));
    return traits != nullptr ? std::string(traits->name)
                             : "type id " + std::to_string(static_cast<uint32_t>(t));
}

Status check_shape(const WeightMatrix& w, const char* op) {
    if (!weight_type_supported(w.type)) {
        return invalid(op,
                       type_name(w.type) +
                           " weights are not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                           "Q8_0, IQ4_NL, Q2_K-Q6_K, IQ4_XS)");
    }
    if (w.cols <= 0) return invalid(op, "cols must be > 0");
    if (uses_int8_activations(w.type) && w.cols % 32 != 0) {
        return invalid(op, type_name(w.type) + " rows need a multiple of 32 columns, got " +
                               std::to_string(w.cols));
    }
    if (w.rows < 0 || w.rows > kMaxRows) return invalid(op, "rows must be in [0, 2^31 - 1]");
    return Status();
}

// A weight as upload_weight returns it.
Status check_uploaded(const WeightMatrix& w, const char* op) {
    DS_RETURN_IF_ERROR(check_shape(w, op));
    if (w.interleave != 1) {
        return invalid(op, "an interleaved weight: pass the matrix upload_weight returned");
    }
    if (w.rows > 0 && w.data == nullptr) return invalid(op, "the weight has no data");
    return Status();
}

Status check_io(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n, const float* y,
                int64_t ldy, const char* op) {
    if (n < 0) return invalid(op, "n < 0");
    if (ldx < w.cols) return invalid(op, "ldx < cols");
    if (ldy < w.rows) return invalid(op, "ldy < rows");
    if (n > 0 && (x == nullptr || y == nullptr)) return invalid(op, "x or y is null");
    return Status();
}

// x as the int8 blocks the quantized weight types multiply.
Result<StreamBuffer> quantized(const float* x, int64_t ldx, int64_t n, int64_t cols,
                               cudaStream_t stream) {
    DS_ASSIGN_OR_RETURN(StreamBuffer xq, StreamBuffer::create(activation_bytes(n, cols), stream));
    DS_RETURN_IF_ERROR(launched(launch_quantize_activations(x, ldx, n, cols, xq.data(), stream),
                                "matmul (quantizing x)"));
    return xq;
}

Status enqueue_matmul(const WeightMatrix& w, const float* x, int64_t ldx, const void* xq, int64_t n,
                      float* y, int64_t ldy, cudaStream_t stream) {
    MatmulLaunch a;
    a.type = w.type;
    a.w = w.data;
    a.row_stride = w.row_stride();
    a.rows = w.rows;
    a.cols = w.cols;
    a.x = x;
    a.ldx = ldx;
    a.xq = xq;
    a.n = n;
    a.y = y;
    a.ldy = ldy;
    return launched(launch_matmul(a, stream), "matmul");
}

// A copy in pageable memory, so that staging it has read it when the copy call returns,
// whatever memory the caller's is.
std::vector<int32_t> pageable_copy(const int32_t* host, int64_t n) {
    return std::vector<int32_t>(host, host + n);
}

// k past kMaxDeviceTopK: the rows to the host, ordered there as the CPU backend orders them.
Status top_k_on_host(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k, int32_t* ids,
                     float* values, cudaStream_t stream) {
    std::vector<float> rows(static_cast<size_t>(n_rows * n_vocab));
    DS_RETURN_IF_ERROR(from_cuda(cudaMemcpyAsync(rows.data(), logits, rows.size() * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream),
                                 "cuda top_k: cudaMemcpyAsync to the host"));
    DS_RETURN_IF_ERROR(from_cuda(cudaStreamSynchronize(stream), "cuda top_k"));
    return find_backend("cpu")->top_k(rows.data(), n_vocab, n_rows, k, ids, values, Exec{});
}

}  // namespace

Status check_upload(const WeightMatrix& w) {
    DS_RETURN_IF_ERROR(check_shape(w, "upload_weight"));
    const bool interleaved =
        w.interleave == kRowInterleave && interleaved_type(w.type) && w.rows % kRowInterleave == 0;
    if (w.interleave != 1 && !interleaved) {
        return invalid("upload_weight", "interleave " + std::to_string(w.interleave) +
                                            " is not a layout repack_rows makes");
    }
    if (w.rows > 0 && w.data == nullptr) return invalid("upload_weight", "the weight has no data");
    return Status();
}

Status run_matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                  int64_t ldy, cudaStream_t stream) {
    DS_RETURN_IF_ERROR(check_uploaded(w, "matmul"));
    DS_RETURN_IF_ERROR(check_io(w, x, ldx, n, y, ldy, "matmul"));
    if (n == 0 || w.rows == 0) return Status();
    StreamBuffer xq;
    if (uses_int8_activations(w.type)) {
        DS_ASSIGN_OR_RETURN(xq, quantized(x, ldx, n, w.cols, stream));
    }
    return enqueue_matmul(w, x, ldx, xq.data(), n, y, ldy, stream);
}

Status run_matmul_shared_input(std::span<const MatmulOutput> outputs, const float* x, int64_t ldx,
                               int64_t n, cudaStream_t stream) {
    const char* op = "matmul_shared_input";
    bool int8 = false;
    for (const MatmulOutput& o : outputs) {
        if (o.w == nullptr) return invalid(op, "an output without a weight");
        DS_RETURN_IF_ERROR(check_uploaded(*o.w, op));
        if (o.w->cols != outputs[0].w->cols) return invalid(op, "the weights' cols differ");
        DS_RETURN_IF_ERROR(check_io(*o.w, x, ldx, n, o.y, o.ldy, op));
        int8 = int8 || uses_int8_activations(o.w->type);
    }
    if (outputs.empty() || n == 0) return Status();
    // One quantization of x serves every int8 weight: they have the same cols.
    StreamBuffer xq;
    if (int8) {
        DS_ASSIGN_OR_RETURN(xq, quantized(x, ldx, n, outputs[0].w->cols, stream));
    }
    for (const MatmulOutput& o : outputs) {
        DS_RETURN_IF_ERROR(enqueue_matmul(*o.w, x, ldx, xq.data(), n, o.y, o.ldy, stream));
    }
    return Status();
}

Status run_rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d, int64_t n,
                         float eps, float* out, int64_t ldo, cudaStream_t stream) {
    const char* op = "rms_norm_rows";
    if (d <= 0) return invalid(op, "d must be > 0");
    if (n < 0 || n > kMaxRows) return invalid(op, "n must be in [0, 2^31 - 1]");
    if (ldx < d || ldo < d) return invalid(op, "ldx and ldo must be >= d");
    if (n == 0) return Status();
    if (x == nullptr || weight == nullptr || out == nullptr) return invalid(op, "a null pointer");
    return launched(launch_rms_norm_rows(x, ldx, weight, d, n, eps, out, ldo, stream), op);
}

Status run_rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                     const int32_t* positions, const RopeParams& rope, cudaStream_t stream) {
    const char* op = "rope_rows";
    if (n < 0 || n > kMaxRows) return invalid(op, "n must be in [0, 2^31 - 1]");
    if (n_heads < 0) return invalid(op, "n_heads < 0");
    if (n == 0 || n_heads == 0) return Status();
    if (head_dim < 2 || head_dim > 1024 || head_dim % 2 != 0) {
        return invalid(op,
                       "head_dim must be even and in [2, 1024], got " + std::to_string(head_dim));
    }
    if (ldx < static_cast<int64_t>(n_heads) * head_dim)
        return invalid(op, "ldx < n_heads * head_dim");
    if (x == nullptr || positions == nullptr) return invalid(op, "a null pointer");
    DS_RETURN_IF_ERROR(validate_rope(rope, head_dim, "cuda rope_rows"));
    const std::vector<int32_t> pos = pageable_copy(positions, n);
    DS_ASSIGN_OR_RETURN(StreamBuffer d_pos,
                        StreamBuffer::copy_of(pos.data(), pos.size() * sizeof(int32_t), stream));
    StreamBuffer d_factors;
    if (!rope.freq_factors.empty()) {
        const std::vector<float> ff(rope.freq_factors.begin(), rope.freq_factors.end());
        DS_ASSIGN_OR_RETURN(d_factors,
                            StreamBuffer::copy_of(ff.data(), ff.size() * sizeof(float), stream));
    }
    RopeRowsLaunch a;
    a.x = x;
    a.ldx = ldx;
    a.n = n;
    a.n_heads = n_heads;
    a.head_dim = head_dim;
    a.positions = d_pos.as<int32_t>();
    // kernels::rope's expression, so that the angles round the same.
    a.theta_scale = std::pow(rope.base, -2.0f / static_cast<float>(head_dim));
    a.freq_factors = rope.freq_factors.empty() ? nullptr : d_factors.as<float>();
    a.freq_scale = rope.freq_scale;
    a.interleaved = rope.style == RopeStyle::kInterleaved;
    return launched(launch_rope_rows(a, stream), op);
}

Status run_silu_mul(float* out, const float* gate, const float* up, int64_t n,
                    cudaStream_t stream) {
    if (n < 0) return invalid("silu_mul", "n < 0");
    if (n > 0 && (out == nullptr || gate == nullptr || up == nullptr)) {
        return invalid("silu_mul", "a null pointer");
    }
    return launched(launch_silu_mul(out, gate, up, n, stream), "silu_mul");
}

Status run_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
    if (n < 0) return invalid("add", "n < 0");
    if (n > 0 && (y == nullptr || x == nullptr)) return invalid("add", "a null pointer");
    return launched(launch_add(y, x, n, stream), "add");
}

Status run_gelu_mul(float* out, const float* gate, const float* up, int64_t n,
                    cudaStream_t stream) {
    if (n < 0) return invalid("gelu_mul", "n < 0");
    if (n > 0 && (out == nullptr || gate == nullptr || up == nullptr)) {
        return invalid("gelu_mul", "a null pointer");
    }
    return launched(launch_gelu_mul(out, gate, up, n, stream), "gelu_mul");
}

Status run_scale(float* x, float s, int64_t n, cudaStream_t stream) {
    if (n < 0) return invalid("scale", "n < 0");
    if (n > 0 && x == nullptr) return invalid("scale", "a null pointer");
    return launched(launch_scale(x, s, n, stream), "scale");
}

Status run_embed_rows(const WeightMatrix& table, const int32_t* tokens, int64_t n, float* out,
                      cudaStream_t stream) {
    const char* op = "embed_rows";
    DS_RETURN_IF_ERROR(check_uploaded(table, op));
    if (n < 0 || n > kMaxRows) return invalid(op, "n must be in [0, 2^31 - 1]");
    if (n == 0) return Status();
    if (tokens == nullptr || out == nullptr) return invalid(op, "a null pointer");
    const std::vector<int32_t> ids = pageable_copy(tokens, n);
    for (size_t i = 0; i < ids.size(); ++i) {
        // A device read out of bounds would be a fault, not a Status: checked here.
        if (ids[i] < 0 || ids[i] >= table.rows) {
            return invalid(op, "token " + std::to_string(ids[i]) + " (at " + std::to_string(i) +
                                   ") is outside the table's " + std::to_string(table.rows) +
                                   " rows");
        }
    }
    DS_ASSIGN_OR_RETURN(StreamBuffer d_ids,
                        StreamBuffer::copy_of(ids.data(), ids.size() * sizeof(int32_t), stream));
    return launched(launch_embed_rows(table.type, table.data, table.row_stride(), table.cols,
                                      d_ids.as<int32_t>(), n, out, stream),
                    op);
}

Status run_store_rows(DType dtype, int64_t width, const float* src, int64_t ld, int64_t n,
                      uint8_t* dst, size_t row_stride, const int32_t* slots, cudaStream_t stream) {
    const char* op = "store_rows";
    if (dtype != DType::kF16 && dtype != DType::kF32) {
        return invalid(op, "KV rows must be F16 or F32");
    }
    if (n < 0 || n > kMaxRows) return invalid(op, "n must be in [0, 2^31 - 1]");
    if (width < 0 || ld < width) return invalid(op, "width must be in [0, ld]");
    if (row_stride < static_cast<size_t>(width) * (dtype == DType::kF16 ? 2 : 4)) {
        return invalid(op, "row_stride is shorter than a row");
    }
    if (n == 0 || width == 0) return Status();
    if (src == nullptr || dst == nullptr || slots == nullptr) return invalid(op, "a null pointer");
    const std::vector<int32_t> at = pageable_copy(slots, n);
    for (int32_t slot : at) {
        if (slot < 0) return invalid(op, "a negative slot");
    }
    DS_ASSIGN_OR_RETURN(StreamBuffer d_slots,
                        StreamBuffer::copy_of(at.data(), at.size() * sizeof(int32_t), stream));
    return launched(launch_store_rows(dtype == DType::kF16, width, src, ld, n, dst, row_stride,
                                      d_slots.as<int32_t>(), stream),
                    op);
}

Status run_copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows, const uint8_t* src,
                     size_t src_stride, const int32_t* src_rows, size_t row_bytes, int64_t n,
                     cudaStream_t stream) {
    const char* op = "copy_rows";
    if (n < 0 || n > kMaxRows) return invalid(op, "n must be in [0, 2^31 - 1]");
    if (n == 0 || row_bytes == 0) return Status();
    if (dst == nullptr || src == nullptr) return invalid(op, "a null pointer");
    // Both lists in one staged copy.
    std::vector<int32_t> rows;
    for (const int32_t* list : {dst_rows, src_rows}) {
        if (list == nullptr) continue;
        for (int64_t i = 0; i < n; ++i) {
            if (list[i] < 0) return invalid(op, "a negative row");
            rows.push_back(list[i]);
        }
    }
    DS_ASSIGN_OR_RETURN(StreamBuffer d_rows,
                        StreamBuffer::copy_of(rows.data(), rows.size() * sizeof(int32_t), stream));
    const int32_t* d_dst = dst_rows != nullptr ? d_rows.as<int32_t>() : nullptr;
    const int32_t* d_src =
        src_rows != nullptr ? d_rows.as<int32_t>() + (dst_rows != nullptr ? n : 0) : nullptr;
    return launched(
        launch_copy_rows(dst, dst_stride, d_dst, src, src_stride, d_src, row_bytes, n, stream), op);
}

Status run_top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k, int32_t* ids,
                 float* values, cudaStream_t stream) {
    const char* op = "top_k";
    if (n_vocab <= 0 || n_vocab > kMaxRows) return invalid(op, "n_vocab must be in [1, 2^31 - 1]");
    if (k < 1 || k > n_vocab) {
        return invalid(op, "k must be in [1, n_vocab], got " + std::to_string(k));
    }
    if (n_rows < 0 || n_rows > kMaxRows) return invalid(op, "n_rows must be in [0, 2^31 - 1]");
    if (n_rows == 0) return Status();
    if (logits == nullptr || ids == nullptr || values == nullptr) {
        return invalid(op, "a null pointer");
    }
    if (k > kMaxDeviceTopK) return top_k_on_host(logits, n_vocab, n_rows, k, ids, values, stream);
    const size_t count = static_cast<size_t>(n_rows) * static_cast<size_t>(k);
    DS_ASSIGN_OR_RETURN(StreamBuffer d_ids, StreamBuffer::create(count * sizeof(int32_t), stream));
    DS_ASSIGN_OR_RETURN(StreamBuffer d_values, StreamBuffer::create(count * sizeof(float), stream));
    DS_RETURN_IF_ERROR(launched(
        launch_top_k(logits, n_vocab, n_rows, k, d_ids.as<int32_t>(), d_values.as<float>(), stream),
        op));
    DS_RETURN_IF_ERROR(from_cuda(
        cudaMemcpyAsync(ids, d_ids.data(), count * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
        "cuda top_k: cudaMemcpyAsync to the host"));
    DS_RETURN_IF_ERROR(from_cuda(cudaMemcpyAsync(values, d_values.data(), count * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream),
                                 "cuda top_k: cudaMemcpyAsync to the host"));
    return from_cuda(cudaStreamSynchronize(stream), "cuda top_k");
}

}  // namespace deltaserve::kernels::cuda
