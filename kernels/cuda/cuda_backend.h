// Private to kernels/cuda: the hook cuda_registrar.cpp calls.
#pragma once

namespace deltaserve::kernels::cuda {

// Adds the "cuda" backend to the kernels registry (kernels/backend.h). Touches no CUDA API:
// the device is probed on first use. False when a "cuda" backend was already registered.
bool register_cuda_backend();

}  // namespace deltaserve::kernels::cuda
