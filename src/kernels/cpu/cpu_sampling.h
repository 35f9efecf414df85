#pragma once
// The reference of Backend::sample_rows for one row (see backend.h), in
// double: the CUDA sampler must pick the same token up to f32 rounding at an
// interval boundary.
#include <cstdint>

#include "kernels/backend.h"

namespace mlaserve::cpu {

int32_t sample_row(const float* logits, int64_t vocab, const RowSampling& p);

}  // namespace mlaserve::cpu
