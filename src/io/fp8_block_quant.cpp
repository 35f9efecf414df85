#include "io/fp8_block_quant.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

namespace mlaserve {

Shape fp8_scale_shape(int64_t n, int64_t k, int block_n, int block_k) {
  MLA_CHECK(block_n > 0 && block_k > 0, "FP8 block size must be positive, got {}x{}", block_n, block_k);
  return {(n + block_n - 1) / block_n, (k + block_k - 1) / block_k};
}

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int block_n, int block_k, uint8_t* q,
                         float* scale_inv) {
  Shape s = fp8_scale_shape(rows, cols, block_n, block_k);
  for (int64_t bn = 0; bn < s[0]; ++bn) {
    int64_t r0 = bn * block_n, r1 = std::min(rows, r0 + block_n);
    for (int64_t bk = 0; bk < s[1]; ++bk) {
      int64_t c0 = bk * block_k, c1 = std::min(cols, c0 + block_k);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      // An all-zero block quantizes to zeros with any scale; 1 keeps it finite.
      float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      scale_inv[bn * s[1] + bk] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = f32_to_fp8e4m3(w[r * cols + c] / scale);
    }
  }
}

void dequantize_fp8_blocks(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t cols, int block_n,
                           int block_k, float* w) {
  Shape s = fp8_scale_shape(rows, cols, block_n, block_k);
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scale_inv + (r / block_n) * s[1];
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = fp8e4m3_to_f32(q[r * cols + c]) * srow[c / block_k];
  }
}

}  // namespace mlaserve
