// Host side of DeltaKV's compression on the "cuda" backend (latent_ops.h): the nearest
// references and their mean (encode.cu), the encoder's matmuls on [x; rm] as the forward
// pass runs its own (forward_ops.h), and the residual packed.
#include <cuda_runtime_api.h>

#include "deltaserve/kernels/deltakv_ops.h"
#include "encode.h"
#include "forward_ops.h"
#include "latent_ops.h"
#include "op_status.h"
#include "stream_buffer.h"

namespace deltaserve::kernels::cuda {

Status run_deltakv_encode(const LatentEncodeInputs& in, const float* x, int64_t n,
                          const LatentEncodeOutputs& out, cudaStream_t stream) {
    constexpr const char* op = "deltakv_encode";
    DS_RETURN_IF_ERROR(validate(in, x, n, out));
    if (n == 0) return Status();
    if (n > kMaxRows / 2) return invalid(op, "n > 2^30 - 1");
    const DeltaKvLayer& w = *in.w;
    const int64_t d = w.d(), hidden = w.w1.rows, m = w.m();
    if (d * static_cast<int64_t>(sizeof(float)) > 48 * 1024)
        return invalid(op, "rows over 12k values");
    DS_ASSIGN_OR_RETURN(StreamBuffer n_cand,
                        StreamBuffer::copy_of(in.n_cand, static_cast<size_t>(n) * 4, stream));
    NearestLaunch near;
    near.x = x;
    near.n = n;
    near.d = static_cast<int>(d);
    near.ref_x = in.ref_x;
    near.n_cand = n_cand.as<int32_t>();
    near.k = in.k;
    near.refs = out.refs;
    near.rm = out.rm;
    DS_RETURN_IF_ERROR(launched(launch_nearest_refs(near, stream), op));
    // The encoder on the 2n rows [x; rm]: E of both in one pass, then their difference.
    const int64_t rows = 2 * n;
    DS_ASSIGN_OR_RETURN(
        StreamBuffer scratch,
        StreamBuffer::create(static_cast<size_t>(rows * (d + 2 * hidden + m)) * sizeof(float),
                             stream));
    float* const xr = scratch.as<float>();
    float* const a = xr + rows * d;
    float* const b = a + rows * hidden;
    float* const e = b + rows * hidden;
    const size_t half = static_cast<size_t>(n * d) * sizeof(float);
    DS_RETURN_IF_ERROR(
        launched(cudaMemcpyAsync(xr, x, half, cudaMemcpyDeviceToDevice, stream), op));
    DS_RETURN_IF_ERROR(
        launched(cudaMemcpyAsync(xr + n * d, out.rm, half, cudaMemcpyDeviceToDevice, stream), op));
    const MatmulOutput ab[] = {{&w.w1, a, hidden}, {&w.w2, b, hidden}};
    DS_RETURN_IF_ERROR(run_matmul_shared_input(ab, xr, d, rows, stream));
    DS_RETURN_IF_ERROR(run_silu_mul(a, a, b, rows * hidden, stream));
    DS_RETURN_IF_ERROR(run_matmul(w.w3, a, hidden, rows, e, m, stream));
    DS_RETURN_IF_ERROR(
        launched(launch_latent_residual(e, n, static_cast<int>(m), out.z, stream), op));
    return launched(launch_pack_latents(out.z, n, static_cast<int>(m), out.int4, out.latents,
                                        out.stride, stream),
                    op);
}

}  // namespace deltaserve::kernels::cuda
