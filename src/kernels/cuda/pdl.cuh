#pragma once
// Programmatic dependent launch (Hopper). A kernel started with
// launch_dependent() may become resident while the kernel before it on the
// stream is still finishing, so the launch gap between the ~15 small kernels
// of a decode layer overlaps the previous kernel's tail (inside CUDA graphs
// the launches become programmatic edges). Rules for such a kernel:
// - call pdl_enter() before its first global write and before reading
//   anything an earlier kernel wrote (weights may be prefetched before it):
//   it lets the next kernel launch early, then waits until every earlier
//   kernel has completed and its writes are visible. Since each such kernel
//   waits for the complete previous one, ordering stays transitive.
// - A kernel may read, before its wait, what the kernel two back wrote if
//   the kernel before it waits first and only then lets it launch
//   (pdl_wait, then pdl_launch_dependents; read such data at L2, ld.cg):
//   moe_small.cuh's down kernel reads the routing that way.
// - Kernels without pdl_enter() are launched the ordinary way.
#include <cuda_runtime.h>

#include <utility>

namespace mlaserve::cuda {

// Whether launches use the attribute: a Hopper device and MLASERVE_PDL not 0
// (decided once; the switch exists to measure what it buys).
bool pdl_enabled();

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The next kernel may launch once every block of this one has called it
// (a block's exit counts too), so it never takes this kernel's own slots.
__device__ __forceinline__ void pdl_enter() {
  pdl_launch_dependents();
  pdl_wait();
}

// cudaLaunchKernelEx's configuration for a programmatic dependent launch,
// in clusters of `cluster` CTAs along x when cluster > 1. Not copyable: the
// configuration points at its own attributes.
class DependentLaunchConfig {
 public:
  DependentLaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, unsigned cluster = 1) {
    config_.gridDim = grid;
    config_.blockDim = block;
    config_.dynamicSmemBytes = smem;
    config_.stream = stream;
    attrs_[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs_[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    attrs_[1].id = cudaLaunchAttributeClusterDimension;
    attrs_[1].val.clusterDim.x = cluster;
    attrs_[1].val.clusterDim.y = 1;
    attrs_[1].val.clusterDim.z = 1;
    config_.attrs = attrs_;
    config_.numAttrs = cluster > 1 ? 2 : 1;
  }
  DependentLaunchConfig(const DependentLaunchConfig&) = delete;
  DependentLaunchConfig& operator=(const DependentLaunchConfig&) = delete;
  cudaLaunchConfig_t* get() { return &config_; }

 private:
  cudaLaunchConfig_t config_ = {};
  cudaLaunchAttribute attrs_[2] = {};
};

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  DependentLaunchConfig config(grid, block, smem, stream);
  cudaLaunchKernelEx(config.get(), kernel, std::forward<Args>(args)...);
}

}  // namespace mlaserve::cuda
