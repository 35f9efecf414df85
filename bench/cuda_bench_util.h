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

// Times `calls` calls of fn(stream, i), i = 0..calls-1, captured in one
// CUDA graph and replayed, as a decode step runs its kernels: launches back
// to back, the host work (plans, tensor maps) done once at capture, PDL
// edges kept. Returns the median seconds per call. Callers rotate i over
// copies of their inputs larger than L2, so every call reads from memory.
template <typename Fn>
double run_timed_graph(benchmark::State& state, int calls, Fn&& fn) {
  cudaStream_t stream;
  MLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "bench");
  fn(stream, 0);  // lazy attributes and handles, outside the capture
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream), "bench warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "bench capture");
  for (int i = 0; i < calls; ++i) fn(stream, i);
  MLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), "bench capture");
  MLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0), "bench graph");
  MLA_CUDA_CHECK(cudaGraphLaunch(exec, stream), "bench graph");
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream), "bench graph warm-up");
  cudaEvent_t start, stop;
  MLA_CUDA_CHECK(cudaEventCreate(&start), "bench");
  MLA_CUDA_CHECK(cudaEventCreate(&stop), "bench");
  std::vector<float> times;
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    MLA_CUDA_CHECK(cudaEventSynchronize(stop), "bench");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / calls);
    times.push_back(ms / 1e3f / calls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

}  // namespace mlaserve::cuda::bench
