#pragma once
// TMA tensor maps (host side) for kernels that load tiles by bulk tensor copies.
#include <cuda.h>

#include <cstdint>

namespace mlaserve::cuda {

// A bf16 tensor of `rank` dimensions (dims[0] innermost, contiguous;
// byte_strides[i] the step of dimension i + 1), loaded in boxes of `box`
// elements into the 128-byte-swizzled layout (box[0] must be 64: one
// 128-byte row). `what` names the tensor in errors.
CUtensorMap bf16_swizzled_tensor_map(const void* base, int rank, const uint64_t* dims, const uint64_t* byte_strides,
                                     const uint32_t* box, const char* what);

}  // namespace mlaserve::cuda
