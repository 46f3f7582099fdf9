// Registers the "cuda" backend during static initialization.
//
// This file is compiled into an object library whose object is put on the link line of
// every program that links deltaserve::kernels (see CMakeLists.txt): an object file is
// always linked, unlike an archive member nothing references, so the registration cannot be
// dropped and no program has to name the CUDA library or call anything.
#include "cuda_backend.h"

namespace {

[[maybe_unused]] const bool kCudaBackendRegistered =
    deltaserve::kernels::cuda::register_cuda_backend();

}  // namespace
