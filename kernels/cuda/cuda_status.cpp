#include "cuda_status.h"

#include <string>

namespace deltaserve::kernels::cuda {
namespace {

StatusCode code_for(cudaError_t err) {
    switch (err) {
        case cudaErrorMemoryAllocation:
            return StatusCode::kResourceExhausted;
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
        case cudaErrorDevicesUnavailable:
        case cudaErrorSystemDriverMismatch:
        case cudaErrorCompatNotSupportedOnDevice:
        case cudaErrorNoKernelImageForDevice:
            return StatusCode::kUnavailable;
        case cudaErrorInvalidValue:
            return StatusCode::kInvalidArgument;
        default:
            return StatusCode::kInternal;
    }
}

}  // namespace

Status from_cuda(cudaError_t err, std::string_view what) {
    if (err == cudaSuccess) return Status();
    // The runtime also keeps it as the thread's last error: clear that, or the next launch
    // check (cudaGetLastError) would report it again.
    (void)cudaGetLastError();
    std::string msg(what);
    msg += ": ";
    msg += cudaGetErrorName(err);
    msg += " (" + std::to_string(static_cast<int>(err)) + "): ";
    msg += cudaGetErrorString(err);
    return {code_for(err), std::move(msg)};
}

}  // namespace deltaserve::kernels::cuda
