#pragma once
// The absorbed-MLA decode attention on Hopper tensor cores (wgmma) for
// 64-head blocks: V3's 128 heads load each latent tile twice a token instead
// of eight times, and q·k and P·V run as warpgroup MMAs; a bf16 or FP8
// cache. Internal to mla_absorbed.cu, which launches the split merge after it.
#include <cuda_runtime_api.h>

#include "kernels/cuda/mla_absorbed.h"

namespace mlaserve::cuda {

constexpr int kMlaWideHeads = 64;  // query heads a block of the wgmma kernel takes

// The attention grid only (partials when p.num_splits > 1).
void launch_mla_absorbed_sm90(const MlaAbsorbedParams& p, cudaStream_t stream);

}  // namespace mlaserve::cuda
