#pragma once
// DeepSeek's block-FP8 weight format: a {N, K} weight is stored as
// float8_e4m3fn values q plus one f32 `weight_scale_inv` per
// block_n x block_k block (partial blocks at the edges), and the real
// weight is w = q * scale_inv. Quantizing picks scale_inv = amax(block) / 448
// so each block's largest magnitude lands on e4m3's largest finite value.
#include <cstdint>

#include "core/tensor.h"

namespace mlaserve {

// {ceil(n / block_n), ceil(k / block_k)}
Shape fp8_scale_shape(int64_t n, int64_t k, int block_n, int block_k);

// Quantizes a row-major {rows, cols} f32 matrix into q (rows * cols bytes)
// and scale_inv (fp8_scale_shape(rows, cols, ...) floats). To quantize a
// big weight in slabs, pass slabs that start on a block_n row boundary.
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int block_n, int block_k, uint8_t* q,
                         float* scale_inv);

// The inverse: w = q * scale_inv of its block.
void dequantize_fp8_blocks(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t cols, int block_n,
                           int block_k, float* w);

}  // namespace mlaserve
