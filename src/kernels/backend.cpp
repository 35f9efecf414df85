#include "kernels/backend.h"
#include "kernels/cuda/cuda_graph_runner.h"

namespace mlaserve {

#ifndef MLASERVE_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(size_t) { return nullptr; }
std::unique_ptr<DecodeGraphRunner> make_decode_graph_runner(Backend&, const DecodeGraphOptions&, DecodeStepFn) {
  return nullptr;
}
#endif

}  // namespace mlaserve
