#pragma once
// What the absorbed-MLA decode kernels share: which kv rows a token attends
// to and how its context is cut into splits.
#include "kernels/cuda/mla_absorbed.h"

namespace mlaserve::cuda {

constexpr float kMlaLog2e = 1.4426950408889634f;
// Splits start on multiples of this many rows (the 16-head kernel's tile).
constexpr int kMlaSplitRows = 32;

// Which sequence token t belongs to, and the kv range it attends to.
struct TokenRange {
  int kv_begin, attend;
};
__device__ __forceinline__ TokenRange token_range(const MlaAbsorbedParams& p, int t) {
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.q_indptr[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  const int q_len = p.q_indptr[lo + 1] - p.q_indptr[lo];
  const int kv_len = p.kv_indptr[lo + 1] - p.kv_indptr[lo];
  return {p.kv_indptr[lo], kv_len - q_len + (t - p.q_indptr[lo]) + 1};
}

// Batches of at most this many tokens let a split take a single tile.
constexpr int kMlaSmallBatchTokens = 4;

// The fewest rows a split takes (mla_absorbed_num_splits plans no shorter
// ones): two of the kernel's tiles, one for the smallest batches.
__host__ __device__ constexpr int split_min_rows(int num_tokens, int tile_rows) {
  return num_tokens <= kMlaSmallBatchTokens ? tile_rows : 2 * tile_rows;
}

// Rows of each split of a token's context: the context spread over at most
// num_splits splits of at least min_rows, on 32-row bounds. A graph plans
// its splits for the longest context it replays (the engine's: the model's
// context length, 64 at one token); a shorter context then takes no more
// splits than a plan for its own length would cut, and the splits past them
// exit at once (perf.md session 37: at one token and 512 rows the
// engine's graphs had cost 6-8 us a v3-slice step over the benchmark's).
__device__ __forceinline__ int split_chunk(int attend, int num_splits, int min_rows) {
  const int splits = max(1, min(num_splits, attend / min_rows));
  return ((attend + splits - 1) / splits + kMlaSplitRows - 1) / kMlaSplitRows * kMlaSplitRows;
}

// Programmatic dependent launch (sm_90): the attention grid lets the split
// merge start early; the merge waits for the attention grid's completion and
// memory flush before it reads the partial results.
__device__ __forceinline__ void grid_dependents_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace mlaserve::cuda
