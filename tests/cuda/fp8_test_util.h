#pragma once
// Host side of the FP8 GPU tests: random block-FP8 weights (quantized by the
// io layer's quantizer, the one make-model uses), the 1x128 activation
// scheme re-implemented on the host, and dequantized copies for f64
// reference products.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "io/fp8_block_quant.h"

namespace mlaserve::cuda::testing {

// A {n, k} block-FP8 weight: e4m3 bytes, scales {ceil(n/128), ceil(k/128)},
// and its dequantized values (what the reference multiplies with).
struct HostFp8Weight {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> q;
  std::vector<float> scale, dequant;
};

inline HostFp8Weight random_fp8_weight(int64_t n, int64_t k, std::mt19937& rng, float range = 0.05f) {
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> w(n * k);
  // Blocks of different magnitude, so a wrong block scale shows.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = dist(rng) * float(1 + ((r / 128) * 3 + (c / 128)) % 5);
  HostFp8Weight h;
  h.n = n;
  h.k = k;
  h.q.resize(n * k);
  h.scale.resize(((n + 127) / 128) * ((k + 127) / 128));
  h.dequant.resize(n * k);
  quantize_fp8_blocks(w.data(), n, k, 128, 128, h.q.data(), h.scale.data());
  dequantize_fp8_blocks(h.q.data(), h.scale.data(), n, k, 128, 128, h.dequant.data());
  return h;
}

// Random bf16 activations whose 128-wide groups span several magnitudes.
inline std::vector<uint16_t> random_activations(int64_t rows, int64_t width, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(rows * width);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c)
      v[r * width + c] = f32_to_bf16(dist(rng) * std::ldexp(1.0f, int((r * 7 + c / 128 * 3) % 9) - 4));
  return v;
}

// The 1x128 scheme on the host (fp8_quant.h): scale = max(amax, 1e-10) / 448,
// q = e4m3(x * (1 / scale)), round to nearest even, saturating.
struct HostQuantizedRow {
  std::vector<uint8_t> q;
  std::vector<float> scale;  // one per 128-wide group
};

inline HostQuantizedRow quantize_row_host(const float* x, int64_t width) {
  HostQuantizedRow r;
  r.q.resize(width);
  for (int64_t g = 0; g < width / 128; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[g * 128 + i]));
    const float s = std::max(amax, 1e-10f) / 448.0f, inv = 1.0f / s;
    r.scale.push_back(s);
    for (int i = 0; i < 128; ++i) r.q[g * 128 + i] = f32_to_fp8e4m3(x[g * 128 + i] * inv);
  }
  return r;
}

// x rounded through the scheme: dequant(quant(x)).
inline std::vector<float> fake_quantize_rows(const std::vector<float>& x, int64_t rows, int64_t width) {
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const HostQuantizedRow q = quantize_row_host(&x[r * width], width);
    for (int64_t i = 0; i < width; ++i) out[r * width + i] = fp8e4m3_to_f32(q.q[i]) * q.scale[i / 128];
  }
  return out;
}

inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// ref{m, n} = x{m, k} · w{n, k}ᵀ in f64.
inline std::vector<double> matmul_nt(const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t n,
                                     int64_t k) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += double(x[i * k + c]) * w[j * k + c];
      out[i * n + j] = s;
    }
  return out;
}

inline void report_fp8(const char* what, const char* detail, double err, double bound) {
  std::printf("[rel_l2] %-22s %-34s %.2e (bound %.1e)\n", what, detail, err, bound);
}

}  // namespace mlaserve::cuda::testing
