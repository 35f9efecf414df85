#pragma once
// Block-scaled FP8 GEMM, our own kernel (sm_90a, mma.sync e4m3):
//   out[r, n] = sum_kb  sa[r, kb] * sw[n / 128, kb] * sum_{k in kb} a[r, k] * w[n, k]
// with a = e4m3 activations and their 1x128 scales (fp8_quant.h), w = e4m3
// weights {N, K} and their 128x128 scales, f32 accumulation with the scales
// applied per 128-wide K block (never FP8 accumulation across blocks).
//
// Built for the weight-bandwidth-bound side: few rows per weight (decode,
// MoE experts in decode), M = 1 included, which cuBLASLt's block-scaled path
// rejects. Any M works (rows in chunks of up to 128), but NOTES: sm_90 has
// no warp-level FP8 MMA (QMMA); ptxas lowers mma.sync e4m3 to e4m3->f16
// conversions plus HMMA.16816, redone for every 8-token tile, so past 8
// rows a weight the kernel is conversion-bound (docs/fp8.md). Hopper's FP8
// tensor cores (QGMMA) need wgmma; large M goes to cuBLASLt instead.
// NOTES: "swap AB": weight rows are the MMA's M side (16 per warp), tokens
// its N side (8 per tile), so one pass over the weights serves up to 128
// tokens and a single token wastes tensor work, not memory traffic. Each
// thread loads 16 contiguous bytes of a weight row and of a token row; both
// MMA operands permute K the same way, so no shuffle or shared memory is
// needed. Split-K over K blocks gives small-N shapes enough blocks to fill
// the GPU; partial sums go to a workspace and a second kernel adds them.
//
// Three ways to lay the rows out, one kernel:
//  - dense: `batch` independent problems of m rows (batch = 1 for a linear;
//    batch = heads for MLA's absorbed BMMs, with strides);
//  - grouped (MoE): chunk_batch != null. Logical rows [0, m) are grouped by
//    expert in chunks of block_m rows; chunk c uses weights
//    chunk_batch[c]; chunks at or past *rows_in_use are skipped; with
//    gather_ids, logical row r reads a-row gather_ids[r] / gather_div
//    (gather_sentinel: a padding row, computed as zeros).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mlaserve::cuda {

struct Fp8GemmParams {
  // A, e4m3: row r of batch b at a + b * a_batch_stride + r * a_row_stride.
  const uint8_t* a = nullptr;
  int64_t a_row_stride = 0, a_batch_stride = 0;
  // A's scale for row r, K block kb, batch b:
  // a_scale[b * a_scale_batch_stride + kb * a_scale_kb_stride + r * a_scale_row_stride].
  const float* a_scale = nullptr;
  int64_t a_scale_row_stride = 1, a_scale_kb_stride = 0, a_scale_batch_stride = 0;
  // W {N, K} e4m3 per batch, row-major; scales {ceil(N/128), w_scale_ld} f32.
  const uint8_t* w = nullptr;
  int64_t w_batch_stride = 0;
  const float* w_scale = nullptr;
  int64_t w_scale_ld = 0, w_scale_batch_stride = 0;
  // out bf16: row r of batch b at out + b * out_batch_stride + r * out_row_stride.
  __nv_bfloat16* out = nullptr;
  int64_t out_row_stride = 0, out_batch_stride = 0;
  int64_t m = 0, n = 0, k = 0;  // rows per batch (grouped: rows in all), N, K (K % 128 == 0)
  int batch = 1;
  // Grouped mode (see above); batch strides of a and out are unused there.
  const int32_t* chunk_batch = nullptr;
  const int32_t* rows_in_use = nullptr;
  int max_chunks = 0;
  const int32_t* gather_ids = nullptr;
  int gather_div = 1, gather_sentinel = -1;
};

// Host-side plan of one problem shape (graph-safe: shape only, no data).
struct Fp8GemmPlan {
  int block_m = 0;       // token rows per chunk: 8, 16, 32, 64 or 128
  int num_chunks = 0;
  int split_k = 1, kb_per_split = 0;
  size_t workspace_bytes = 0;  // f32 partial sums when split_k > 1
};

// block_m = 0 picks the smallest tile that holds m rows (dense mode);
// grouped mode passes the chunk size its rows were aligned to.
Fp8GemmPlan plan_fp8_gemm(const Fp8GemmParams& p, int block_m = 0);
void run_fp8_gemm(const Fp8GemmParams& p, const Fp8GemmPlan& plan, void* workspace, cudaStream_t stream);

}  // namespace mlaserve::cuda
