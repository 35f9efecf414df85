#pragma once
// Helpers for GPU tests: skip without a GPU, move host vectors to and from
// the device, random bf16 data, relative L2 error against a host reference.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/device_buffer.h"

namespace mlaserve::cuda::testing {

inline bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define MLA_SKIP_WITHOUT_GPU() \
  if (!::mlaserve::cuda::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU present"

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer d(host.size() * sizeof(T));
  if (!host.empty()) MLA_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), d.bytes(), cudaMemcpyHostToDevice), "test upload");
  return d;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& d, size_t count) {
  MLA_CUDA_CHECK(cudaDeviceSynchronize(), "test synchronize");
  std::vector<T> host(count);
  if (count) MLA_CUDA_CHECK(cudaMemcpy(host.data(), d.get(), count * sizeof(T), cudaMemcpyDeviceToHost), "test download");
  return host;
}

// A device buffer filled with 0xff bytes (bf16 NaN), so unwritten outputs fail.
inline DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer d(bytes);
  MLA_CUDA_CHECK(cudaMemset(d.get(), 0xff, bytes), "test poison");
  return d;
}

// bf16 values (as raw bits) drawn uniformly from [-range, range].
inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float range = 1.0f) {
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(dist(rng));
  return v;
}

inline std::vector<float> to_float(const std::vector<uint16_t>& bf16) {
  std::vector<float> f(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) f[i] = bf16_to_f32(bf16[i]);
  return f;
}

// ||out - ref|| / ||ref||; NaN anywhere in out gives infinity.
inline double rel_l2(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

}  // namespace mlaserve::cuda::testing
