#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kRowThreads = 256;

__global__ void embedding_kernel(const int32_t* ids, const int32_t* picked, const __nv_bfloat16* table,
                                 int64_t dim, __nv_bfloat16* out) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t] < 0 ? picked[-1 - int64_t(ids[t])] : ids[t];
  const __nv_bfloat16* src = table + int64_t(id) * dim;
  __nv_bfloat16* dst = out + t * dim;
  for (int64_t i = threadIdx.x * 8; i < dim; i += blockDim.x * 8) Bf16x8::load(src + i).store(dst + i);
}

// One block a row. Pass 1 forms the (residual-added) row and its sum of
// squares; pass 2 rereads it (from L1/L2) to scale, so any width works.
__global__ void rms_norm_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, float eps, int64_t dim,
                                __nv_bfloat16* out, __nv_bfloat16* residual) {
  pdl_enter();
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * dim;
  __nv_bfloat16* rr = residual ? residual + row * dim : nullptr;
  const __nv_bfloat16* src = rr ? rr : xr;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x * 8; i < dim; i += blockDim.x * 8) {
    float v[8];
    Bf16x8::load(xr + i).to_float(v);
    if (rr) {
      float r[8];
      Bf16x8::load(rr + i).to_float(r);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += r[j];
      Bf16x8 s = Bf16x8::from_float(v);
      s.store(rr + i);
      s.to_float(v);  // normalize what the residual stream now holds
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  const float inv_rms = rsqrtf(block_sum(ss) / float(dim) + eps);
  __nv_bfloat16* o = out + row * dim;
  for (int64_t i = threadIdx.x * 8; i < dim; i += blockDim.x * 8) {
    float v[8], g[8];
    Bf16x8::load(src + i).to_float(v);
    Bf16x8::load(w + i).to_float(g);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * inv_rms * g[j];
    Bf16x8::from_float(v).store(o + i);
  }
}

__global__ void silu_and_mul_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                                    int64_t rows, int64_t inter, __nv_bfloat16* out) {
  pdl_enter();
  const int64_t vecs_per_row = inter / 8;
  const int64_t total = rows * vecs_per_row;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < total;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = v / vecs_per_row, c = (v % vecs_per_row) * 8;
    float g[8], u[8];
    Bf16x8::load(gate + r * in_stride + c).to_float(g);
    Bf16x8::load(up + r * in_stride + c).to_float(u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = g[j] / (1.0f + __expf(-g[j])) * u[j];
    Bf16x8::from_float(g).store(out + r * inter + c);
  }
}

// Word-granular column copy; Word is the widest type dividing every offset.
template <typename Word>
__global__ void copy_columns_kernel(const Word* src, int64_t src_width, int64_t src_col, Word* dst,
                                    int64_t dst_width, int64_t dst_col, int64_t n, int64_t rows) {
  pdl_enter();
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    dst[r * dst_width + dst_col + c] = src[r * src_width + src_col + c];
  }
}

__global__ void add_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n_vec) {
  pdl_enter();
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < n_vec;
       v += int64_t(gridDim.x) * blockDim.x) {
    float a[8], b[8];
    Bf16x8::load(y + v * 8).to_float(a);
    Bf16x8::load(x + v * 8).to_float(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] += b[j];
    Bf16x8::from_float(a).store(y + v * 8);
  }
}

__global__ void convert_f32_to_bf16_kernel(const float* src, int64_t n, __nv_bfloat16* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}

// One block a row; 16-byte words when the row allows, else 4-byte words.
template <typename Word, bool kScatter>
__global__ void move_rows_kernel(char* dst, const char* src, const int32_t* slots, int64_t row_words) {
  pdl_enter();
  const int64_t i = blockIdx.x;
  const int64_t di = kScatter ? slots[i] : i, si = kScatter ? i : slots[i];
  Word* d = reinterpret_cast<Word*>(dst) + di * row_words;
  const Word* s = reinterpret_cast<const Word*>(src) + si * row_words;
  for (int64_t k = threadIdx.x; k < row_words; k += blockDim.x) d[k] = s[k];
}

int grid_for(int64_t work, int threads) {
  int64_t blocks = (work + threads - 1) / threads;
  return int(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

void check_width(int64_t w, const char* op) {
  MLA_CUDA_REQUIRE(w % 8 == 0, std::string(op) + ": width " + std::to_string(w) + " is not a multiple of 8");
}

template <bool kScatter>
void move_rows(void* dst, const void* src, const int32_t* slots, int64_t num_rows, int64_t row_bytes,
               cudaStream_t stream, const char* op) {
  if (num_rows == 0) return;
  MLA_CUDA_REQUIRE(row_bytes % 4 == 0,
                   std::string(op) + ": row of " + std::to_string(row_bytes) + " bytes is not a multiple of 4");
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  const bool wide = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (wide) {
    const int64_t words = row_bytes / 16;
    launch_dependent(move_rows_kernel<uint4, kScatter>, num_rows, words < 128 ? 64 : 128, 0, stream, d, s, slots,
                     words);
  } else {
    const int64_t words = row_bytes / 4;
    launch_dependent(move_rows_kernel<uint32_t, kScatter>, num_rows, 128, 0, stream, d, s, slots, words);
  }
  check_launch(op);
}

}  // namespace

void embedding(const int32_t* ids, const int32_t* picked, const __nv_bfloat16* table, int64_t num_tokens,
               int64_t dim, __nv_bfloat16* out, cudaStream_t stream) {
  check_width(dim, "embedding");
  if (num_tokens == 0) return;
  launch_dependent(embedding_kernel, num_tokens, 128, 0, stream, ids, picked, table, dim, out);
  check_launch("embedding");
}

void rms_norm(const __nv_bfloat16* x, const __nv_bfloat16* w, float eps, int64_t rows, int64_t dim,
              __nv_bfloat16* out, __nv_bfloat16* residual, cudaStream_t stream) {
  check_width(dim, "rms_norm");
  if (rows == 0) return;
  const int threads = dim >= 8 * kRowThreads ? kRowThreads : (dim >= 1024 ? 128 : 64);
  launch_dependent(rms_norm_kernel, rows, threads, 0, stream, x, w, eps, dim, out, residual);
  check_launch("rms_norm");
}

void silu_and_mul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride, int64_t rows,
                  int64_t inter, __nv_bfloat16* out, cudaStream_t stream) {
  check_width(inter, "silu_and_mul");
  check_width(in_stride, "silu_and_mul");
  if (rows == 0) return;
  launch_dependent(silu_and_mul_kernel, grid_for(rows * inter / 8, 256), 256, 0, stream, gate, up, in_stride, rows,
                   inter, out);
  check_launch("silu_and_mul");
}

void copy_columns(const void* src, int64_t src_width, int64_t src_col, void* dst, int64_t dst_width,
                  int64_t dst_col, int64_t n, int64_t rows, int64_t elem_bytes, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(src_col + n <= src_width && dst_col + n <= dst_width,
                   "copy_columns: " + std::to_string(n) + " columns from column " + std::to_string(src_col) +
                       " of " + std::to_string(src_width) + " to column " + std::to_string(dst_col) + " of " +
                       std::to_string(dst_width) + " are out of range");
  if (rows == 0 || n == 0) return;
  // Widest word (16, 8, 4, 2 or 1 bytes) dividing every byte offset and both pointers.
  const uint64_t all = uint64_t(src_width * elem_bytes) | uint64_t(src_col * elem_bytes) |
                       uint64_t(dst_width * elem_bytes) | uint64_t(dst_col * elem_bytes) |
                       uint64_t(n * elem_bytes) | reinterpret_cast<uintptr_t>(src) |
                       reinterpret_cast<uintptr_t>(dst);
  int64_t word = 16;
  while (all % word) word /= 2;
  const int64_t k = elem_bytes;
  auto launch = [&](auto tag) {
    using Word = decltype(tag);
    const int64_t s = int64_t(sizeof(Word));
    launch_dependent(copy_columns_kernel<Word>, grid_for(rows * n * k / s, 256), 256, 0, stream,
        static_cast<const Word*>(src), src_width * k / s, src_col * k / s, static_cast<Word*>(dst),
        dst_width * k / s, dst_col * k / s, n * k / s, rows);
  };
  switch (word) {
    case 16: launch(uint4{}); break;
    case 8: launch(uint2{}); break;
    case 4: launch(uint32_t{}); break;
    case 2: launch(uint16_t{}); break;
    default: launch(uint8_t{}); break;
  }
  check_launch("copy_columns");
}

void add_inplace(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n, cudaStream_t stream) {
  check_width(n, "add");
  if (n == 0) return;
  launch_dependent(add_kernel, grid_for(n / 8, 256), 256, 0, stream, y, x, n / 8);
  check_launch("add");
}

void convert_f32_to_bf16(const float* src, int64_t n, __nv_bfloat16* dst, cudaStream_t stream) {
  if (n == 0) return;
  convert_f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(src, n, dst);
  check_launch("convert_f32_to_bf16");
}

void scatter_rows(void* dst, const void* src, const int32_t* slots, int64_t num_rows, int64_t row_bytes,
                  cudaStream_t stream) {
  move_rows<true>(dst, src, slots, num_rows, row_bytes, stream, "scatter_rows");
}

void gather_rows(void* dst, const void* src, const int32_t* slots, int64_t num_rows, int64_t row_bytes,
                 cudaStream_t stream) {
  move_rows<false>(dst, src, slots, num_rows, row_bytes, stream, "gather_rows");
}

}  // namespace mlaserve::cuda
