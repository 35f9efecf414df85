#include "kernels/cuda/fp8_kv_cache.h"

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/fp8_kv_cache.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kThreads = 64;  // four 128-wide groups a pass, 16 lanes each

__global__ void __launch_bounds__(kThreads) fp8_kv_store_kernel(Fp8KvLayout layout, const __nv_bfloat16* rows,
                                                                 const int32_t* slots, uint8_t* cache) {
  const int64_t t = blockIdx.x, width = layout.kv_lora_rank + layout.rope_dim;
  const __nv_bfloat16* src = rows + t * width;
  uint8_t* slot = cache + int64_t(slots[t]) * layout.slot_bytes();
  float* scales = reinterpret_cast<float*>(slot + layout.scale_offset());
  // Every warp runs the same passes (the group quantizer shuffles).
  const int groups = layout.kv_lora_rank / kFp8Group, passes = (groups + 3) / 4;
  for (int p = 0; p < passes; ++p) {
    const int g = p * 4 + threadIdx.x / 16, j = threadIdx.x & 15;
    float v[8] = {};
    if (g < groups) Bf16x8::load(src + g * kFp8Group + 8 * j).to_float(v);
    const QuantizedGroupPart part = quantize_group_16lanes(v);
    if (g < groups) {
      *reinterpret_cast<uint2*>(slot + g * kFp8Group + 8 * j) = part.q;
      if (j == 0) scales[g] = part.scale;
    }
  }
  auto* rope = reinterpret_cast<__nv_bfloat16*>(slot + layout.rope_offset());
  for (int i = threadIdx.x * 8; i < layout.rope_dim; i += kThreads * 8)
    Bf16x8::load(src + layout.kv_lora_rank + i).store(rope + i);
}

__global__ void fp8_kv_load_kernel(Fp8KvLayout layout, const uint8_t* cache, const int32_t* slots,
                                   __nv_bfloat16* out) {
  const int64_t i = blockIdx.x, width = layout.kv_lora_rank + layout.rope_dim;
  const uint8_t* slot = cache + int64_t(slots[i]) * layout.slot_bytes();
  __nv_bfloat16* dst = out + i * width;
  for (int c = threadIdx.x * 8; c < layout.kv_lora_rank; c += blockDim.x * 8) {
    float v[8];
    load_fp8_kv_latent8(slot, layout, c, v);
    Bf16x8::from_float(v).store(dst + c);
  }
  const auto* rope = reinterpret_cast<const __nv_bfloat16*>(slot + layout.rope_offset());
  for (int c = threadIdx.x * 8; c < layout.rope_dim; c += blockDim.x * 8)
    Bf16x8::load(rope + c).store(dst + layout.kv_lora_rank + c);
}

// Any layout (tiny test models): one warp per row, a value at a time.
__global__ void fp8_kv_store_generic_kernel(Fp8KvLayout layout, const __nv_bfloat16* rows, const int32_t* slots,
                                            uint8_t* cache) {
  const int64_t t = blockIdx.x;
  store_fp8_kv_row(rows + t * layout.row_width(), layout, cache + int64_t(slots[t]) * layout.slot_bytes());
}

__global__ void fp8_kv_load_generic_kernel(Fp8KvLayout layout, const uint8_t* cache, const int32_t* slots,
                                           __nv_bfloat16* out) {
  const int64_t i = blockIdx.x;
  const uint8_t* slot = cache + int64_t(slots[i]) * layout.slot_bytes();
  for (int c = threadIdx.x; c < layout.row_width(); c += blockDim.x)
    out[i * layout.row_width() + c] = __float2bfloat16_rn(load_fp8_kv_value(slot, layout, c));
}

}  // namespace

void fp8_kv_store(const Fp8KvLayout& layout, const __nv_bfloat16* rows, const int32_t* slots, int64_t num_rows,
                  uint8_t* cache, cudaStream_t stream) {
  check_fp8_kv_layout(layout);
  if (num_rows == 0) return;
  if (fp8_kv_is_vectorizable(layout))
    fp8_kv_store_kernel<<<num_rows, kThreads, 0, stream>>>(layout, rows, slots, cache);
  else
    fp8_kv_store_generic_kernel<<<num_rows, 32, 0, stream>>>(layout, rows, slots, cache);
  check_launch("fp8 kv store");
}

void fp8_kv_load(const Fp8KvLayout& layout, const uint8_t* cache, const int32_t* slots, int64_t num_rows,
                 __nv_bfloat16* out, cudaStream_t stream) {
  check_fp8_kv_layout(layout);
  if (num_rows == 0) return;
  if (fp8_kv_is_vectorizable(layout))
    fp8_kv_load_kernel<<<num_rows, 64, 0, stream>>>(layout, cache, slots, out);
  else
    fp8_kv_load_generic_kernel<<<num_rows, 64, 0, stream>>>(layout, cache, slots, out);
  check_launch("fp8 kv load");
}

}  // namespace mlaserve::cuda
