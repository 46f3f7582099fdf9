// Private to kernels/cpu: the CPU backend the registry is seeded with (cpu_backend.cpp).
#pragma once

#include <memory>

#include "deltaserve/kernels/backend.h"

namespace deltaserve::kernels {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace deltaserve::kernels
