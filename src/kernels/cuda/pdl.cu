#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("MLASERVE_PDL");
    if (env && std::strcmp(env, "0") == 0) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return enabled;
}

}  // namespace mlaserve::cuda
