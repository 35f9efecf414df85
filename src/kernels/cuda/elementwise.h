#pragma once
// Row-wise and element-wise ops of the forward pass in bf16 (f32 math
// inside). Plain launch parameters: device pointers, sizes, a stream.
// Widths must be multiples of 8 (16-byte vectors); launchers check it.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

// out{T, D} = table{V, D}[ids{T}], an id below zero standing for
// picked[-1 - id] (an id an earlier step picked). Token ids are validated on
// the host before they reach the device (the tokenizer and the server bound
// them by vocab; the runtime bounds the picked rows).
void embedding(const int32_t* ids, const int32_t* picked, const __nv_bfloat16* table, int64_t num_tokens,
               int64_t dim, __nv_bfloat16* out, cudaStream_t stream);

// out = rmsnorm(x) * w per row; with residual != null, residual += x first
// and the sum is normalized (the fused pre-norm residual add).
void rms_norm(const __nv_bfloat16* x, const __nv_bfloat16* w, float eps, int64_t rows, int64_t dim,
              __nv_bfloat16* out, __nv_bfloat16* residual, cudaStream_t stream);

// out[r, :I] = silu(gate[r, :I]) * up[r, :I]; gate and up rows are
// in_stride apart (I for separate tensors, 2I for one [gate | up] tensor).
void silu_and_mul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride, int64_t rows,
                  int64_t inter, __nv_bfloat16* out, cudaStream_t stream);

// dst[r, dst_col : dst_col + n] = src[r, src_col : src_col + n] for row-major
// matrices of src_width / dst_width elements of elem_bytes each.
void copy_columns(const void* src, int64_t src_width, int64_t src_col, void* dst, int64_t dst_width,
                  int64_t dst_col, int64_t n, int64_t rows, int64_t elem_bytes, cudaStream_t stream);

// y += x over n elements.
void add_inplace(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n, cudaStream_t stream);

// dst[i] = bf16(src[i]) for f32 sources (weights kept in f32 by the model,
// converted once at first use).
void convert_f32_to_bf16(const float* src, int64_t n, __nv_bfloat16* dst, cudaStream_t stream);

// dst[slots[i]] = src[i] for rows of row_bytes (scatter), or
// dst[i] = src[slots[i]] (gather); any dtype.
void scatter_rows(void* dst, const void* src, const int32_t* slots, int64_t num_rows, int64_t row_bytes,
                  cudaStream_t stream);
void gather_rows(void* dst, const void* src, const int32_t* slots, int64_t num_rows, int64_t row_bytes,
                 cudaStream_t stream);

}  // namespace mlaserve::cuda
