#include "kernels/backend.h"

namespace mlaserve {

#ifndef MLASERVE_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(size_t) { return nullptr; }
#endif

}  // namespace mlaserve
