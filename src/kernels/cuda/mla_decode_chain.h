#pragma once
// The absorbed MLA of a one-token decode step, from the block's normed input
// to o_proj's output, as one kernel (Backend::mla_decode_chain).
//
// Why: at batch 1 the seven kernels of this chain (fused q / kv_a GEMV,
// latent write, q_nope·W_UK, split attention, merge, ·W_UV, o_proj) read
// 27 MB at V2-Lite widths but took ~28 us a layer on the H200, ~3 us per
// kernel boundary (docs/perf.md, session 5). Here one block per SM loads its
// slice of every phase's weights before waiting for the previous kernel
// (into shared memory with bulk copies, ~192 KB a block, the whole 27 MB on
// 132 SMs; the W_UK units into registers), and the phases hand their
// results on through tagged mailboxes (a reader polls the values it needs)
// instead of kernel boundaries:
//   1. qkv[r] = h · w_qkv[r] for the block's rows r (with a norm head, every
//      warp first forms h from the residual stream and the previous block's
//      output, so the chain waits on the MoE directly, not on a norm kernel);
//   2. q_cat[h, l] = q_nope[h] · W_UK[h][:, l] for the block's (head,
//      64-column) unit (one a block on all but the first and the last
//      blocks), which also ropes the head's q_pe into q_cat; the last block
//      writes the latent row (kv_a norm, k_pe rope) to the cache;
//   3. split attention over the context (16 heads on tensor cores; splits of
//      multiples of 32 rows on the first blocks, as many as fill the grid,
//      the first 24 loading their first tile before the wait), partial
//      results out; the split holding the new token's row takes it from the
//      latent writer's mailbox;
//   4. after the one grid barrier, each block merges the partials of its
//      heads and applies W_UV to its rows;
//   5. out[n] = attn · w_o[n] for the block's rows;
//   6. at a MoE layer (router set): each block adds its out rows to the
//      residual stream and writes their sum of squares, and each of the
//      first E blocks router logit e times the residual's rms, formed in
//      phase 5 from attn through the router folded with the norm's weight
//      and o_proj (mla_decode_chain_router_fold). The MoE completes the norm
//      from those sums (Backend's PendingNorm) and routes from the logits
//      (Backend::moe_route_experts), so it waits on this kernel only, and no
//      block here waits for the whole of out.
// Intermediates are rounded to bf16 where the op-by-op path stores bf16
// tensors, so both paths agree up to summation order.
// Needs every block resident at once: the grid is one block per SM and a
// block takes more than half an SM's shared memory, so this assumes the GPU
// is not shared with other work (a block that waits seconds for a value
// traps). A cooperative launch would guarantee it, but it gives up the
// programmatic early launch: 2.17-2.19 ms a bs-1 step against 2.07 (H200).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mlaserve::cuda {

struct MlaDecodeChainShape {
  int hidden = 0, heads = 0, nope_dim = 0, rope_dim = 0, latent_dim = 0, v_dim = 0;
};

// The widths the kernel is built for (V2-Lite's: D 2048, 16 heads, Dn 128,
// R 64, L 512, Dv 128) and whether a block's shared memory fits on this GPU.
bool mla_decode_chain_applies(const MlaDecodeChainShape& s, int sm_count);

struct MlaDecodeChainParams {
  const __nv_bfloat16* h = nullptr;        // {D}, the normed block input (unless x is set)
  const __nv_bfloat16* w_qkv = nullptr;    // {H (Dn + R) + L + R, D}: q_proj rows, then kv_a_proj_with_mqa's
  const __nv_bfloat16* kv_norm = nullptr;  // {L}
  const __nv_bfloat16* w_uk = nullptr;     // {H, Dn, L}
  const __nv_bfloat16* w_uv = nullptr;     // {H, Dv, L}
  const __nv_bfloat16* w_o = nullptr;      // {D, H Dv}
  __nv_bfloat16* cache = nullptr;          // {slots, L + R}
  const int32_t* positions = nullptr;      // {1}
  const int32_t* out_slots = nullptr;      // {1}
  const int32_t* kv_indptr = nullptr;      // {2}
  const int32_t* kv_slots = nullptr;       // {kv_len}, the new token's slot last
  const float* inv_freq = nullptr;         // {R / 2}
  float cos_sin_scale = 1.0f, eps = 1e-6f, softmax_scale = 1.0f;
  __nv_bfloat16* out = nullptr;            // {D}
  // The block's input norm (Backend's ResidualNorm), when x is set: each
  // block forms h = rmsnorm(in_residual + x) * in_norm itself in phase 1;
  // one block writes in_residual += x after the grid barrier (when no block
  // reads it any more), unless phase 6 writes the same row as residual. No
  // in_residual (the first block): h = rmsnorm(x) * in_norm.
  const __nv_bfloat16* x = nullptr;        // {D}
  const __nv_bfloat16* in_norm = nullptr;  // {D}
  float in_eps = 1e-6f;
  __nv_bfloat16* in_residual = nullptr;    // {D}
  // The MoE layer's start (Backend's MlaChainMoeTail), when router is set:
  const __nv_bfloat16* router = nullptr;    // {E, D}
  const __nv_bfloat16* moe_norm = nullptr;  // {D}
  __nv_bfloat16* residual = nullptr;        // {D}, += out
  float* norm_parts = nullptr;              // {grid}: sums of squares of each block's residual rows
  const float* router_fold = nullptr;       // {E, H Dv}: mla_decode_chain_router_fold's
  int num_experts = 0;                      // router rows E
  float* logits = nullptr;                  // {E}: rms(residual) x normed · router[e], up to the fold's rounding
  // Scratch (mla_decode_chain_scratch_bytes); sync: the grid barrier's
  // arrival counter and the mailboxes (mla_decode_chain_sync_bytes), zeroed
  // once and kept between launches, used by no other kernel.
  void* scratch = nullptr;
  void* sync = nullptr;
};

// Whether phase 6 handles E routed experts on this grid.
bool mla_decode_chain_routes(int num_experts, int sm_count);
// Whether the kernel at a MoE layer of this hidden size, attention width
// (H Dv) and expert count takes a router fold on this grid.
bool mla_decode_chain_takes_fold(int hidden, int attn_width, int num_experts, int sm_count);
// fold{E, K} = router{E, D} · diag(norm{D}) · w_o{D, K} in f32: a router
// logit of the normed row is then (residual · diag(norm) · router[e] +
// fold[e] · attn) / rms, with no rounding of out, the residual or the
// normed row in between (a few 1e-3 relative against the op-by-op logits).
void mla_decode_chain_router_fold(const __nv_bfloat16* router, const __nv_bfloat16* norm,
                                  const __nv_bfloat16* w_o, int num_experts, int hidden, int attn_width, float* fold,
                                  cudaStream_t stream);
// Bytes of the sync state (zero it once).
size_t mla_decode_chain_sync_bytes();
size_t mla_decode_chain_scratch_bytes(int sm_count);
void mla_decode_chain(const MlaDecodeChainParams& p, int sm_count, cudaStream_t stream);

// The phase boundaries a timeline build stamps (cmake
// -DMLASERVE_CHAIN_TIMELINE=ON): thread 0 of each block records %globaltimer
// when the block passes them, so a latency-bound chain shows where its time
// goes (docs/perf.md, session 25). scripts/device/chain_timeline.py names
// them in this order.
enum class ChainEvent {
  Enter, WaitReturned, Phase1Ready, Phase1Done, Phase2Ready, Phase2Done, AttnQIn, AttnFirstTileIn, AttnFirstScores,
  AttnFirstPv, AttentionDone, Barrier, FirstMergeDone, Phase4Done, Phase5AttnIn, Phase5Ready, Phase5Done,
  TailWritten, Exit, Count
};
constexpr int kChainTimelineLaunches = 512, kChainTimelineBlocks = 256;
// Writes the stamps of the last kChainTimelineLaunches launches to path as
// u64 ns {launch % kChainTimelineLaunches, event, block}, 0 where a block
// passed no such point. Throws in builds without the timeline.
void mla_decode_chain_timeline_dump(const std::string& path);

}  // namespace mlaserve::cuda
