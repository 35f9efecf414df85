#pragma once
// Helpers shared by the CUDA Google Benchmark binaries.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

namespace mlaserve::cuda::bench {

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  MLA_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice), "bench upload");
  return b;
}

// Times `fn` with events on the default stream, one event pair per
// iteration, after one warm-up call (plans, attributes, caches); returns the
// median seconds per iteration.
template <typename Fn>
double run_timed(benchmark::State& state, Fn&& fn) {
  std::vector<float> times;
  cudaEvent_t start, stop;
  MLA_CUDA_CHECK(cudaEventCreate(&start), "bench");
  MLA_CUDA_CHECK(cudaEventCreate(&stop), "bench");
  fn();
  MLA_CUDA_CHECK(cudaDeviceSynchronize(), "bench warm-up");
  for (auto _ : state) {
    cudaEventRecord(start);
    fn();
    cudaEventRecord(stop);
    MLA_CUDA_CHECK(cudaEventSynchronize(stop), "bench");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
    times.push_back(ms / 1e3f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

}  // namespace mlaserve::cuda::bench
