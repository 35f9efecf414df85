#pragma once
// The sizes of one Backend::mla_prepare call, checked against each other in
// one place so every backend rejects the same malformed calls with the same
// message.
#include <cstdint>

#include "kernels/backend.h"

namespace mlaserve {

struct MlaPrepareDims {
  int64_t tokens = 0;
  int64_t rope = 0;                     // R = 2 * inv_freq.numel()
  int64_t latent = 0;                   // L (latent write)
  int64_t q_a = 0;                      // Q (q_a norm)
  int64_t heads = 0, nope = 0;          // H, Dn (q split)
  bool latent_write = false, q_a_norm = false, q_split = false;
};

// Throws an Error naming the offending tensor when the parts of p do not fit
// together (widths, column ranges, token counts, index dtypes).
// q_a_rows_elsewhere: the q_a norm runs with q_a set and q_a_out undefined
// (its rows go to a backend's own buffer, Backend::mla_prepare_q_b).
MlaPrepareDims check_mla_prepare(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                                 const Tensor& inv_freq, bool q_a_rows_elsewhere = false);

}  // namespace mlaserve
