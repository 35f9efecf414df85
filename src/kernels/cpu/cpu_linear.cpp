// Linear layers on the CPU: weights stay in their checkpoint dtype (an mmapped
// view, never a second full copy); each thread converts a tile of 64 output
// rows to f32 (dequantizing block-FP8 with its 128x128 scales) into a
// thread-local buffer and multiplies it with OpenBLAS sgemm. Decode is memory
// bound, so reading bf16/fp8 once and expanding in cache costs about what
// reading a pre-converted f32 copy would, at half (or a quarter) the memory.
#include <cblas.h>

#include <array>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace mlaserve::cpu {
namespace {

constexpr int64_t kTileRows = 64;
constexpr int64_t kFp8Block = 128;

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table;
}

}  // namespace

void to_f32(const Tensor& t, int64_t offset, int64_t n, float* out) {
  MLA_CHECK(offset >= 0 && offset + n <= t.numel(), "to_f32: range [{}, {}) outside tensor of {} elements",
            offset, offset + n, t.numel());
  switch (t.dtype()) {
    case DType::F32: {
      const float* p = t.data<float>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::BF16: {
      const uint16_t* p = t.data<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* p = t.data<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      fail("to_f32: unsupported dtype {} (expected F32, BF16 or F16)", dtype_name(t.dtype()));
  }
}

void weight_rows_f32(const Weight& w, int64_t n0, int64_t n1, float* out) {
  const int64_t K = w.in_features();
  if (!w.is_fp8()) {
    to_f32(w.w, n0 * K, (n1 - n0) * K, out);
    return;
  }
  const auto& table = fp8_table();
  const uint8_t* q = w.w.data<uint8_t>();
  const float* scale = w.scale_inv.data<float>();
  const int64_t scale_cols = w.scale_inv.dim(1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * K;
    const float* row_scale = scale + (n / kFp8Block) * scale_cols;
    float* dst = out + (n - n0) * K;
    for (int64_t k = 0; k < K; ++k) dst[k] = table[row[k]] * row_scale[k / kFp8Block];
  }
}

void linear(const float* x, int64_t ldx, int64_t T, const Weight& w, float* out, int64_t ldo) {
  const int64_t N = w.out_features(), K = w.in_features();
  if (T == 0 || N == 0) return;
  if (w.w.dtype() == DType::F32) {
    // Already f32: one sgemm per row tile, no conversion.
    const float* wp = w.w.data<float>();
    parallel_for((N + kTileRows - 1) / kTileRows, 1, [&](int64_t b, int64_t e) {
      for (int64_t tile = b; tile < e; ++tile) {
        int64_t n0 = tile * kTileRows, rows = std::min(kTileRows, N - n0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(rows), int(K), 1.0f, x, int(ldx),
                    wp + n0 * K, int(K), 0.0f, out + n0, int(ldo));
      }
    });
    return;
  }
  parallel_for((N + kTileRows - 1) / kTileRows, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> tile_f32;
    tile_f32.resize(size_t(kTileRows * K));
    for (int64_t tile = b; tile < e; ++tile) {
      int64_t n0 = tile * kTileRows, rows = std::min(kTileRows, N - n0);
      weight_rows_f32(w, n0, n0 + rows, tile_f32.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(rows), int(K), 1.0f, x, int(ldx),
                  tile_f32.data(), int(K), 0.0f, out + n0, int(ldo));
    }
  });
}

}  // namespace mlaserve::cpu
