#include "kernels/cuda/cuda_check.h"

#include "core/error.h"

namespace mlaserve::cuda {

void raise_error(const std::string& message) { throw Error(message); }

}  // namespace mlaserve::cuda
