#pragma once
// Every CUDA runtime call and kernel launch in the CUDA backend is checked,
// and a failure names the op it belongs to, so an error from a fused kernel
// deep in a forward step says which op broke, not just "invalid argument".
//
// NOTES: .cu files cannot include core/error.h (nvcc 13 cannot evaluate
// fmt's consteval format checks), so this header builds messages with
// std::string and throws mlaserve::Error through an out-of-line function.
#include <cuda_runtime_api.h>

#include <string>

namespace mlaserve::cuda {

// Throws mlaserve::Error(message); defined in cuda_check.cpp.
[[noreturn]] void raise_error(const std::string& message);

inline void check_cuda(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess)
    raise_error(std::string("CUDA error in ") + op + " (" + what + "): " + cudaGetErrorString(err));
}

// After a launch: configuration errors surface here (execution errors surface
// at the next synchronizing call, which is checked too).
inline void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

}  // namespace mlaserve::cuda

#define MLA_CUDA_CHECK(call, op) ::mlaserve::cuda::check_cuda((call), (op), #call)
// Argument check in launchers; the message (a std::string expression) is
// only built when the check fails.
#define MLA_CUDA_REQUIRE(cond, message)                       \
  do {                                                        \
    if (!(cond)) ::mlaserve::cuda::raise_error(message);      \
  } while (0)
