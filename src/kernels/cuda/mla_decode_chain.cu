#include "kernels/cuda/mla_decode_chain.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm_sm90.cuh"
#include "kernels/cuda/l2_policy.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kD = 2048, kH = 16, kDn = 128, kR = 64, kL = 512, kDv = 128;
constexpr int kRow = kL + kR;                         // a latent cache row
constexpr int kQkvRows = kH * (kDn + kR) + kL + kR;   // fused q / kv_a outputs
constexpr int kKvCol = kH * (kDn + kR);               // kv_a's first column in qkv
constexpr int kUkCols = 64;                           // W_UK output columns of one unit
constexpr int kUkUnits = kH * (kL / kUkCols);
constexpr int kMaxUkPerBlock = 2;
constexpr int kAttnWidth = kH * kDv;                  // W_UV rows, o_proj's K
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunks = kD / 256;                     // 16-byte chunks a lane holds of h
constexpr int kAttnChunks = kAttnWidth / 256;         // and of attn
constexpr int kMaxGrid = 256;
static_assert(kChainTimelineBlocks == kMaxGrid, "a timeline column a block");

// Attention tiles: 32 latent rows; rows padded to 73 16-byte chunks (odd) so
// the 8 rows an ldmatrix phase reads fall in 8 distinct bank groups.
constexpr int kTile = 32, kPitch = kRow + 8, kPPitch = kTile + 8;
constexpr int kRowChunks = kRow / 8;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The first kEarlySplits blocks, which enter first, load their attention
// split's first tile before the PDL wait: issued after phase 1, those copies
// kept the split blocks ~1.3 us from phase 3, which waited for them
// (perf.md, session 32). Their qkv weights start after the tile's stage and
// they take 6 qkv rows fewer than the other blocks.
constexpr int kEarlySplits = 24, kEarlySplitRowsFewer = 6;
constexpr size_t kTileStageBytes = sizeof(__nv_bfloat16) * kTile * kPitch;

// Byte offsets of the dynamic shared-memory regions of a block, its rows of
// each phase, and where the W_UK units sit: uk_per_block a block on the
// blocks from uk_block0 up to the last, which writes the latent row (one a
// block where the grid allows: on 132 SMs two a block on 64 blocks took
// 0.5 us longer, perf.md session 32).
struct Layout {
  int qkv_rows, split_qkv_rows, uv_rows, o_rows, uk_per_block, uk_block0;
  size_t uv, o, total;
  __host__ __device__ int qkv_first(int b) const {
    const int r = b < kEarlySplits ? b * split_qkv_rows
                                   : kEarlySplits * split_qkv_rows + (b - kEarlySplits) * qkv_rows;
    return r < kQkvRows ? r : kQkvRows;
  }
  __host__ __device__ int qkv_count(int b) const {
    const int end = qkv_first(b) + (b < kEarlySplits ? split_qkv_rows : qkv_rows);
    return (end < kQkvRows ? end : kQkvRows) - qkv_first(b);
  }
  // Where block b's qkv weights start.
  __host__ __device__ static size_t qkv_offset(int b) { return b < kEarlySplits ? kTileStageBytes : 0; }
};

constexpr size_t kAttnBytes = sizeof(__nv_bfloat16) * (kH * kPitch + 2 * kTile * kPitch + kH * kPPitch) +
                              sizeof(float) * (kH * kTile + 4 * 32 * 4);

__host__ __device__ inline Layout layout_for(int grid) {
  Layout l{};
  const int even = ceil_div(kQkvRows, grid);
  l.split_qkv_rows = even > kEarlySplitRowsFewer ? even - kEarlySplitRowsFewer : 0;
  const int rest = kQkvRows - kEarlySplits * l.split_qkv_rows;
  l.qkv_rows = grid > kEarlySplits && rest > 0 ? ceil_div(rest, grid - kEarlySplits) : 0;
  l.uk_per_block = grid > kUkUnits ? 1 : kMaxUkPerBlock;
  l.uk_block0 = grid - 1 - ceil_div(kUkUnits, l.uk_per_block);
  l.uv_rows = ceil_div(kAttnWidth, grid);
  l.o_rows = ceil_div(kD, grid);
  const size_t a = sizeof(__nv_bfloat16) * size_t(l.qkv_rows) * kD;
  const size_t split_a = kTileStageBytes + sizeof(__nv_bfloat16) * size_t(l.split_qkv_rows) * kD;
  l.uv = a > split_a ? a : split_a;
  if (kAttnBytes > l.uv) l.uv = kAttnBytes;
  l.o = l.uv + sizeof(__nv_bfloat16) * size_t(l.uv_rows) * kL;
  l.total = l.o + sizeof(__nv_bfloat16) * size_t(l.o_rows) * kAttnWidth;
  return l;
}

__host__ __device__ inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Consecutive 256-byte aligned pieces of base (null: sizes only).
struct Carver {
  char* base;
  size_t off = 0;
  __host__ __device__ char* take(size_t n) {
    char* r = base ? base + off : nullptr;
    off += align256(n);
    return r;
  }
};

// Scratch: the attention partials o{grid, H, L} and (m, l){grid, H} (f32).
struct Scratch {
  float *partial_o, *partial_ml;
};
__host__ __device__ inline Scratch carve(void* base, int grid, size_t* bytes) {
  Carver c{static_cast<char*>(base)};
  Scratch s;
  s.partial_o = reinterpret_cast<float*>(c.take(4 * size_t(grid) * kH * kL));
  s.partial_ml = reinterpret_cast<float*>(c.take(4 * size_t(grid) * kH * 2));
  if (bytes) *bytes = c.off;
  return s;
}

// The sync state (zeroed once, kept between launches): the grid barrier's
// arrival counter, which only grows (every block adds 1 a launch), then the
// mailboxes of the phases' bf16 hand-offs, one tagged 32-bit word a value:
// the value's bits in the low half, its launch's tag in the high half. A
// reader polls the words it needs until each carries its own launch's tag,
// so it takes a value as soon as the writer stores it, with no grid barrier
// in between (a release, an arrival and an acquire poll: ~0.8 us each,
// perf.md session 25) and no load after it. No other kernel writes here, so
// a word that is not this launch's holds an earlier launch's tag (tags run
// 1..65535 and every launch rewrites every word; zero never matches).
struct Mailbox {
  unsigned long long* count;              // the grid barrier's arrivals
  uint32_t *qkv, *q_cat, *latent, *attn;  // {kQkvRows}, {kH, kRow}, {kRow}, {kAttnWidth}
};
__host__ __device__ inline Mailbox mailbox_of(void* sync, size_t* bytes) {
  Carver c{static_cast<char*>(sync)};
  Mailbox m;
  m.count = reinterpret_cast<unsigned long long*>(c.take(sizeof(unsigned long long)));
  m.qkv = reinterpret_cast<uint32_t*>(c.take(4 * kQkvRows));
  m.q_cat = reinterpret_cast<uint32_t*>(c.take(4 * kH * kRow));
  m.latent = reinterpret_cast<uint32_t*>(c.take(4 * kRow));
  m.attn = reinterpret_cast<uint32_t*>(c.take(4 * kAttnWidth));
  if (bytes) *bytes = c.off;
  return m;
}

__device__ __forceinline__ uint32_t tagged(__nv_bfloat16 v, uint32_t tag) {
  return uint32_t(__bfloat16_as_ushort(v)) | tag << 16;
}
__device__ __forceinline__ float word_value(uint32_t w) { return __uint_as_float(w << 16); }
// The bf16 halves of two words as one bf16 pair (a's first).
__device__ __forceinline__ uint32_t word_pair(uint32_t a, uint32_t b) { return __byte_perm(a, b, 0x5410); }
__device__ __forceinline__ bool has_tag(uint32_t w, uint32_t tag) { return w >> 16 == tag; }
__device__ __forceinline__ bool has_tag(uint4 v, uint32_t tag) {
  return has_tag(v.x, tag) && has_tag(v.y, tag) && has_tag(v.z, tag) && has_tag(v.w, tag);
}

__device__ __forceinline__ void post(uint32_t* p, uint32_t word) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(word) : "memory");
}
__device__ __forceinline__ uint2 peek2(const uint32_t* p) {
  uint2 v;
  asm volatile("ld.relaxed.gpu.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint4 peek4(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// A reader that waits far beyond any real phase traps instead of hanging.
__device__ __forceinline__ void count_spin(long long& spins) {
  if (++spins > (1ll << 22)) __trap();  // seconds: a real phase takes microseconds
}

// Two words at p (8-byte aligned) once both carry tag.
__device__ __forceinline__ uint2 await2(const uint32_t* p, uint32_t tag) {
  uint2 v = peek2(p);
  for (long long spins = 0; !has_tag(v.x, tag) || !has_tag(v.y, tag); v = peek2(p)) count_spin(spins);
  return v;
}

// 4 words at p (16-byte aligned) once all carry tag.
__device__ __forceinline__ uint4 await4_one(const uint32_t* p, uint32_t tag) {
  uint4 v = peek4(p);
  for (long long spins = 0; !has_tag(v, tag); v = peek4(p)) count_spin(spins);
  return v;
}

// kN chunks of 4 words (at addr(j), 16-byte aligned) once all carry tag. All
// are requested at once; only the stale ones again.
template <int kN, class Addr>
__device__ __forceinline__ void await4(Addr addr, uint32_t tag, uint4 (&v)[kN]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) v[j] = peek4(addr(j));
  for (long long spins = 0;; count_spin(spins)) {
    bool done = true;
#pragma unroll
    for (int j = 0; j < kN; ++j)
      if (!has_tag(v[j], tag)) {
        done = false;
        v[j] = peek4(addr(j));
      }
    if (done) return;
  }
}

// Weights: read once a step, first to leave L2.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
      ::"r"(sm90::smem_u32(dst)), "l"(src), "r"(bytes), "r"(sm90::smem_u32(bar)), "l"(stream_once_policy())
      : "memory");
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The one grid barrier (the attention partials are f32, too wide to tag), on
// the arrival counter: launch k starts at k x grid (every thread reads the
// count after the PDL wait, when the previous launch has completed; fewer
// than `grid` arrivals of this launch can precede the read) and the barrier
// waits for (k + 1) x grid. One release add and acquire polls by thread 0,
// which the block's __syncthreads extend to its other threads; writes before
// the barrier are visible after it (read them with ld.global.cg: L1 is not
// coherent).
__device__ void grid_barrier(unsigned long long* count, unsigned long long target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(count) : "memory");
    long long spins = 0;
    while (load_acquire(count) < target) count_spin(spins);
  }
  __syncthreads();
}

// 8 bf16 of global memory written earlier in this kernel (L2, not L1).
__device__ __forceinline__ uint4 load_cg(const __nv_bfloat16* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  float wf[8], xf[8];
  bf16x8_to_float(w, wf);
  bf16x8_to_float(x, xf);
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(wf[i], xf[i], acc);
  return acc;
}

// store(r, x · w[r]) for the rows [0, rows) of w in shared memory ({rows, K}
// bf16), x held by each lane as its K / 256 chunks; a warp a row.
template <int kK, class Store>
__device__ __forceinline__ void rows_times_vector(const __nv_bfloat16* w, int rows, const uint4 (&x)[kK / 256],
                                                  Store store) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int r = warp; r < rows; r += kWarps) {
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < kK / 256; ++c)
      acc += dot8(*reinterpret_cast<const uint4*>(w + size_t(r) * kK + c * 256 + lane * 8), x[c]);
    acc = warp_sum(acc);
    if (lane == 0) store(r, acc);
  }
}

// Small shared-memory state of a block (static; the weights are dynamic).
struct Misc {
  float o[kL];                   // a head's merged attention output (phase 4)
  float weight[kMaxGrid], l[kMaxGrid];  // the splits' maxima / merge weights and sums
  float4 part[kL / 4];           // the second half of the splits' sum
  float q[kDn];                  // a head's q_nope (phase 2)
  float uk_sum[kWarps * kUkCols];  // phase 2's sums of each warp
  float cs[kR];                  // {cos, sin} * cos_sin_scale of the token's angles
  __nv_bfloat16 kv_norm[kL];
  // A row every warp reads whole, staged once a block: h (phase 1), attn
  // (phase 5). Each of the grid's ~1,000 warps reading such a row from L2
  // queued their requests on the same 32 lines (~2 us a phase on the H100).
  __nv_bfloat16 row[kD];
  // The residual stream's row for phase 5, staged before the grid barrier:
  // after it, the blocks write their rows of residual + out.
  __nv_bfloat16 residual[kD];
#ifdef MLASERVE_CHAIN_TIMELINE
  unsigned long long timeline_enter;  // thread 0's
  int timeline_slot;
#endif
};

#ifdef MLASERVE_CHAIN_TIMELINE
__device__ unsigned long long g_chain_timeline[kChainTimelineLaunches][int(ChainEvent::Count)][kMaxGrid];

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0 stamps, into its launch's slot.
#define CHAIN_TIMELINE_ENTER(m) \
  do { \
    if (threadIdx.x == 0) (m).timeline_enter = global_ns(); \
  } while (0)
#define CHAIN_TIMELINE_BASE(m, launch) \
  do { \
    if (threadIdx.x == 0) { \
      (m).timeline_slot = int((launch) % kChainTimelineLaunches); \
      g_chain_timeline[(m).timeline_slot][int(ChainEvent::Enter)][blockIdx.x] = (m).timeline_enter; \
    } \
  } while (0)
#define CHAIN_STAMP(m, event) \
  do { \
    if (threadIdx.x == 0) g_chain_timeline[(m).timeline_slot][int(ChainEvent::event)][blockIdx.x] = global_ns(); \
  } while (0)
// When the whole block is done with a phase.
#define CHAIN_STAMP_ALL(m, event) \
  do { \
    __syncthreads(); \
    CHAIN_STAMP(m, event); \
  } while (0)
#else
#define CHAIN_TIMELINE_ENTER(m) do {} while (0)
#define CHAIN_TIMELINE_BASE(m, launch) do {} while (0)
#define CHAIN_STAMP(m, event) do {} while (0)
#define CHAIN_STAMP_ALL(m, event) do {} while (0)
#endif

// What the chain reads that no earlier kernel writes, loaded into registers
// before the PDL wait and staged after it: the blocks that enter last (as
// the previous kernel's final blocks leave) are on the step's critical path,
// and while that kernel streams, each dependent round trip before the wait
// cost them ~1 us.
struct Constants {
  int kv_begin = 0, kv_end = 0;  // the request's kv_slots
  int position = 0;
  float inv_freq = 0.0f;  // of the pair this thread ropes (threads < kR / 2)
  uint4 kv_norm{};        // kv_a_layernorm's weight, 8 values (last block, threads < kL / 8)
  uint4 in_norm{};        // the input norm's weight, this thread's 8 values (norm head)
};

__device__ Constants load_constants(const MlaDecodeChainParams& p, bool latent_block) {
  static_assert(kD == 8 * kThreads && kL / 8 <= kThreads && kR / 2 <= kThreads, "one chunk a thread");
  Constants c;
  c.kv_begin = p.kv_indptr[0];
  c.kv_end = p.kv_indptr[1];
  c.position = p.positions[0];
  if (threadIdx.x < kR / 2) c.inv_freq = p.inv_freq[threadIdx.x];
  if (latent_block && threadIdx.x < kL / 8) c.kv_norm = reinterpret_cast<const uint4*>(p.kv_norm)[threadIdx.x];
  if (p.x) c.in_norm = reinterpret_cast<const uint4*>(p.in_norm)[threadIdx.x];
  return c;
}

// The rope table as mla_prepare forms it, and kv_a_layernorm's weight, for
// phase 2 (a __syncthreads orders these stores before its reads). Off
// phase 1's path: its syncs would wait for the warp that does the sincosf.
__device__ void stage_constants(const MlaDecodeChainParams& p, const Constants& c, Misc& m, bool latent_block) {
  if (threadIdx.x < kR / 2) {
    float s, co;
    sincosf(float(c.position) * c.inv_freq, &s, &co);
    m.cs[2 * threadIdx.x] = co * p.cos_sin_scale;
    m.cs[2 * threadIdx.x + 1] = s * p.cos_sin_scale;
  }
  if (latent_block && threadIdx.x < kL / 8) reinterpret_cast<uint4*>(m.kv_norm)[threadIdx.x] = c.kv_norm;
}

// The lane's kChunks 16-byte chunks of h (c * 256 + lane * 8), through
// m.row: loaded, or with a norm head formed as rms_norm does (r = bf16(
// residual + x), h = bf16(r * rsqrt(mean(r^2) + eps) * w), w's 8 values of
// this thread in in_norm), 8 values a thread; `sum` gets the thread's 8
// values of r, for the block that writes them back (no block may before the
// grid barrier: all read in_residual). (Every warp norming the whole row
// itself made the step slower than the separate norm kernel.)
__device__ __forceinline__ void load_h(const MlaDecodeChainParams& p, uint4 in_norm, Misc& m, uint4 (&h)[kChunks],
                                       Bf16x8& sum) {
  static_assert(kD == 8 * kThreads, "8 hidden values a thread");
  const int i0 = threadIdx.x * 8;
  if (!p.x) {
    *reinterpret_cast<uint4*>(m.row + i0) = load_cg(p.h + i0);
  } else {
    Bf16x8 a;
    *reinterpret_cast<uint4*>(&a) = load_cg(p.x + i0);
    float v[8], g[8];
    a.to_float(v);
    if (p.in_residual) {
      Bf16x8 b;
      *reinterpret_cast<uint4*>(&b) = load_cg(p.in_residual + i0);
      float r[8];
      b.to_float(r);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += r[j];
      sum = Bf16x8::from_float(v);
      sum.to_float(v);  // the residual stream's bf16 values
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
    const float inv_rms = rsqrtf(block_sum(ss) / float(kD) + p.in_eps);
    Bf16x8 w;
    *reinterpret_cast<uint4*>(&w) = in_norm;
    w.to_float(g);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * inv_rms * g[j];
    Bf16x8::from_float(v).store(m.row + i0);
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) h[c] = *reinterpret_cast<const uint4*>(m.row + c * 256 + lane * 8);
}

// Pair i of a rope row, its two values in the tagged words v, as bf16.
__device__ __forceinline__ void rotate_pair(uint2 v, const float* cs, int i, __nv_bfloat16& x, __nv_bfloat16& y) {
  const float a = word_value(v.x), b = word_value(v.y);
  const float c = cs[2 * i], s = cs[2 * i + 1];
  x = __float2bfloat16_rn(a * c - b * s);
  y = __float2bfloat16_rn(b * c + a * s);
}

// Phase 2's side work (the last block): the latent row [kv_a_layernorm(c_kv)
// | rope(k_pe)] into the cache, mla_prepare's arithmetic, and to the split
// that holds the new token's row through the mailbox.
__device__ void latent_write(const MlaDecodeChainParams& p, const Mailbox& box, uint32_t tag, const Misc& m) {
  static_assert(kL == 2 * kThreads && kKvCol % 2 == 0, "two latent values a thread; pairs 8-byte aligned");
  const uint32_t* kv = box.qkv + kKvCol;
  const uint2 words = await2(kv + 2 * threadIdx.x, tag);
  const float2 v = make_float2(word_value(words.x), word_value(words.y));
  const float inv_rms = rsqrtf(block_sum(v.x * v.x + v.y * v.y) / float(kL) + p.eps);
  __nv_bfloat16* row = p.cache + int64_t(p.out_slots[0]) * kRow;
  const float2 w = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(m.kv_norm)[threadIdx.x]);
  auto put = [&](int i, __nv_bfloat16 x, __nv_bfloat16 y) {
    row[i] = x;
    row[i + 1] = y;
    post(box.latent + i, tagged(x, tag));
    post(box.latent + i + 1, tagged(y, tag));
  };
  put(2 * threadIdx.x, __float2bfloat16_rn(v.x * inv_rms * w.x), __float2bfloat16_rn(v.y * inv_rms * w.y));
  if (threadIdx.x < kR / 2) {
    const int i = threadIdx.x;
    __nv_bfloat16 x, y;
    rotate_pair(await2(kv + kL + 2 * i, tag), m.cs, i, x, y);
    put(kL + 2 * i, x, y);
  }
}

// A W_UK unit's weights (64 columns of a head's Dn rows) as thread t holds
// them, loaded before the PDL wait: rows 4 (t / 8) + j (j < 4), columns
// l0 + 8 (t % 8) .. + 7. In registers, they leave shared memory to the qkv
// rows (Layout).
struct UkWeights {
  uint4 w[4];
};
__device__ UkWeights load_uk(const MlaDecodeChainParams& p, int unit) {
  static_assert(kThreads == 8 * (kDn / 4) && kUkCols == 8 * 8, "8 column groups x 32 row quads");
  const int h = unit / (kL / kUkCols), l0 = unit % (kL / kUkCols) * kUkCols;
  const int cg = threadIdx.x % 8, dg = threadIdx.x / 8;
  UkWeights u;
#pragma unroll
  for (int j = 0; j < 4; ++j) u.w[j] = load_streamed_16(p.w_uk + (size_t(h) * kDn + 4 * dg + j) * kL + l0 + 8 * cg);
  return u;
}

// q_cat[h, l0 + j] = sum_d q_nope[h, d] · W_UK[h, d, l0 + j] for one unit.
// The unit at l0 = 0 also ropes the head's q_pe into q_cat.
__device__ void uk_unit(const Mailbox& box, uint32_t tag, int unit, const UkWeights& w, Misc& m) {
  static_assert(kDn / 2 <= kThreads && (kDn + kR) % 2 == 0, "a q_nope pair a thread; pairs 8-byte aligned");
  const int h = unit / (kL / kUkCols), l0 = unit % (kL / kUkCols) * kUkCols;
  const uint32_t* q = box.qkv + h * (kDn + kR);
  if (threadIdx.x < kDn / 2) {
    const uint2 v = await2(q + 2 * threadIdx.x, tag);
    m.q[2 * threadIdx.x] = word_value(v.x);
    m.q[2 * threadIdx.x + 1] = word_value(v.y);
  }
  if (l0 == 0 && threadIdx.x >= kThreads - kR / 2) {
    const int i = threadIdx.x - (kThreads - kR / 2);
    __nv_bfloat16 x, y;
    rotate_pair(await2(q + kDn + 2 * i, tag), m.cs, i, x, y);
    uint32_t* dst = box.q_cat + h * kRow + kL + 2 * i;
    post(dst, tagged(x, tag));
    post(dst + 1, tagged(y, tag));
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, cg = threadIdx.x % 8, dg = threadIdx.x / 8;
  float acc[8] = {};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float f[8];
    bf16x8_to_float(w.w[j], f);
    const float qd = m.q[4 * dg + j];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(qd, f[i], acc[i]);
  }
  // The warp's four row quads (lanes 8 apart), then the warps.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 8);
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 16);
  }
  if (lane < 8)
#pragma unroll
    for (int i = 0; i < 8; ++i) m.uk_sum[warp * kUkCols + 8 * cg + i] = acc[i];
  __syncthreads();
  if (threadIdx.x < kUkCols) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) v += m.uk_sum[i * kUkCols + threadIdx.x];
    post(box.q_cat + h * kRow + l0 + threadIdx.x, tagged(__float2bfloat16(v), tag));
  }
  __syncthreads();  // m.q and m.uk_sum are the next unit's
}

// A block's split of the context: rows [row0, row0 + rows) of the kv_slots
// at kv_begin; the last context row (the new token's, written in phase 2).
struct Split {
  int kv_begin, last_row, row0, rows;
  uint64_t* tile_bar;        // the first tile in (preload_first_tile)
  const int* first_slots;    // shared copy of the first two tiles' slots (read during phase 1)
  const int32_t* all_slots;  // the batch's kv_slots
  __device__ int64_t slot(int row) const {
    return row < 2 * kTile ? first_slots[row] : all_slots[kv_begin + row0 + row];
  }
};

// Phase 3's shared memory, in the qkv weights' region once phase 1 is done,
// but for the first tile's stage on the early split blocks (Layout).
struct AttnSmem {
  __nv_bfloat16 *k, *q, *p;  // k{2 stages, kTile, kPitch}, q{kH, kPitch}, p{kH, kPPitch}
  float *score, *exchange;   // {kH, kTile}, {4, 32, 4}
  __device__ explicit AttnSmem(uint8_t* smem) {
    k = reinterpret_cast<__nv_bfloat16*>(smem);
    q = k + 2 * kTile * kPitch;
    p = q + kH * kPitch;
    score = reinterpret_cast<float*>(p + kH * kPPitch);
    exchange = score + kH * kTile;
  }
};

// cp.async of tile `tile` of the split into `stage`, all its rows but the
// new token's (it comes through the mailbox); rows past the split's end are zeroed.
__device__ void load_tile(const MlaDecodeChainParams& p, const Split& sp, const AttnSmem& a, int tile, int stage) {
  for (int i = threadIdx.x; i < kTile * kRowChunks; i += kThreads) {
    const int r = i / kRowChunks, c = i % kRowChunks, row = tile * kTile + r;
    const bool valid = row < sp.rows;
    if (valid && sp.row0 + row == sp.last_row) continue;
    const int64_t slot = valid ? sp.slot(row) : 0;
    cp_async_16(a.k + (stage * kTile + r) * kPitch + c * 8, p.cache + slot * kRow + c * 8, valid ? 16 : 0);
  }
}

// The split's first tile into stage 0, a bulk copy a row from warp 0's
// lanes, all but the new token's row; the other warps zero the rows past the
// split's end. early: before the PDL wait (the rows' slots from the batch,
// which was uploaded before the step's first kernel), else after phase 1,
// whose reads of the region the copies then follow.
__device__ void preload_first_tile(const MlaDecodeChainParams& p, const Split& sp, uint8_t* smem, bool early) {
  const AttnSmem a(smem);
  const int rows = min(sp.rows, kTile), new_row = sp.last_row - sp.row0, tid = threadIdx.x;
  if (tid < 32) {
    const bool has_new = new_row >= 0 && new_row < rows;
    if (tid == 0) sm90::mbar_arrive_expect_tx(sp.tile_bar, uint32_t(rows - (has_new ? 1 : 0)) * kRow * 2);
    if (!early) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if (tid < rows && tid != new_row) {
      const int64_t slot = early ? p.kv_slots[sp.kv_begin + sp.row0 + tid] : sp.slot(tid);
      bulk_load(a.k + tid * kPitch, p.cache + slot * kRow, kRow * 2, sp.tile_bar);
    }
  } else {
    for (int i = tid - 32; i < (kTile - rows) * kRowChunks; i += kThreads - 32)
      *reinterpret_cast<uint4*>(a.k + (rows + i / kRowChunks) * kPitch + i % kRowChunks * 8) = make_uint4(0, 0, 0, 0);
  }
}

// Phase 3 for one split, all 16 heads. Unnormalized output and (max, sum) of
// the block's softmax (log2 domain) go to the partials. Warps: scores as a 4
// (8-row groups) x 2 (dim halves) grid, then each warp owns 64 of the 512
// output dims.
__device__ void attention_split(const MlaDecodeChainParams& p, const Scratch& s, const Mailbox& box, uint32_t tag,
                                uint8_t* smem, int split, const Split& sp, Misc& m) {
  const AttnSmem a(smem);
  __nv_bfloat16 *q_s = a.q, *k_s = a.k, *p_s = a.p;
  float *score_s = a.score, *exchange = a.exchange;
  __shared__ float m_run[kH], l_run[kH], alpha_s[kH];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c4 = lane % 4;
  const int rows = sp.rows;
  {
    constexpr int kQChunks = kH * kRow / 4 / kThreads;  // 4-word chunks of q_cat a thread
    static_assert(kH * kRow % (4 * kThreads) == 0 && kRow % 4 == 0, "whole chunks, none across rows");
    uint4 v[kQChunks];
    await4<kQChunks>([&](int j) { return box.q_cat + 4 * (tid + j * kThreads); }, tag, v);
#pragma unroll
    for (int j = 0; j < kQChunks; ++j) {
      const int i = 4 * (tid + j * kThreads), r = i / kRow, c = i % kRow;
      *reinterpret_cast<uint2*>(q_s + r * kPitch + c) =
          make_uint2(word_pair(v[j].x, v[j].y), word_pair(v[j].z, v[j].w));
    }
  }
  CHAIN_STAMP(m, AttnQIn);
  // The tile that holds the new token's row, if this split has it.
  const int new_row = sp.last_row - sp.row0, new_tile = new_row >= 0 && new_row < rows ? new_row / kTile : -1;
  if (tid < kH) m_run[tid] = -INFINITY, l_run[tid] = 0.0f;

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const int n_tile = warp % 4, k_half = warp / 4;
  float o[8][4] = {};
  const int tiles = ceil_div(rows, kTile);
  for (int t = 0; t < tiles; ++t) {
    const bool next = t + 1 < tiles;  // tile 0 came with preload_first_tile
    if (next) {
      load_tile(p, sp, a, t + 1, (t + 1) % 2);
      cp_async_commit();
    }
    if (t == 0)
      sm90::mbar_wait(sp.tile_bar, 0);
    else if (next)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    if (t == new_tile && tid < kRow / 4) {
      const uint4 v = await4_one(box.latent + 4 * tid, tag);
      *reinterpret_cast<uint2*>(k_s + ((t % 2) * kTile + new_row % kTile) * kPitch + 4 * tid) =
          make_uint2(word_pair(v.x, v.y), word_pair(v.z, v.w));
    }
    __syncthreads();
    if (t == 0) CHAIN_STAMP(m, AttnFirstTileIn);
    const __nv_bfloat16* kt = k_s + (t % 2) * kTile * kPitch;

    // Scores of 8 rows x 16 heads over half of the 576 dims, two k-steps a round.
    // Two accumulators halve the chain of dependent MMAs.
    float c[4] = {}, c_odd[4] = {};
#pragma unroll 3
    for (int k = k_half * (kRow / 2); k < (k_half + 1) * (kRow / 2); k += 32) {
      uint32_t a0[4], a1[4], b[4];
      ldmatrix_x4(a0, q_s + (lane % 16) * kPitch + k + (lane / 16) * 8);
      ldmatrix_x4(a1, q_s + (lane % 16) * kPitch + k + 16 + (lane / 16) * 8);
      ldmatrix_x4(b, kt + (n_tile * 8 + lane % 8) * kPitch + k + (lane / 8) * 8);
      mma_bf16_16816(c, a0, b[0], b[1]);
      mma_bf16_16816(c_odd, a1, b[2], b[3]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] += c_odd[i];
    if (k_half == 1)
#pragma unroll
      for (int i = 0; i < 4; ++i) exchange[(n_tile * 32 + lane) * 4 + i] = c[i];
    __syncthreads();
    if (k_half == 0) {
      const int col = n_tile * 8 + 2 * c4;
      score_s[g * kTile + col] = c[0] + exchange[(n_tile * 32 + lane) * 4 + 0];
      score_s[g * kTile + col + 1] = c[1] + exchange[(n_tile * 32 + lane) * 4 + 1];
      score_s[(g + 8) * kTile + col] = c[2] + exchange[(n_tile * 32 + lane) * 4 + 2];
      score_s[(g + 8) * kTile + col + 1] = c[3] + exchange[(n_tile * 32 + lane) * 4 + 3];
    }
    __syncthreads();
    if (t == 0) CHAIN_STAMP(m, AttnFirstScores);

    // Online softmax: a warp per two heads (interleaved), a lane per row
    // (tile row 0 is valid).
    {
      const int h0 = warp * 2, h1 = h0 + 1;
      const bool valid = t * kTile + lane < rows;
      const float s0 = valid ? score_s[h0 * kTile + lane] * scale_log2 : -INFINITY;
      const float s1 = valid ? score_s[h1 * kTile + lane] * scale_log2 : -INFINITY;
      float mx0 = s0, mx1 = s1;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
      }
      const float m_old0 = m_run[h0], m_new0 = fmaxf(m_old0, mx0);
      const float m_old1 = m_run[h1], m_new1 = fmaxf(m_old1, mx1);
      const float p0 = valid ? exp2f(s0 - m_new0) : 0.0f, p1 = valid ? exp2f(s1 - m_new1) : 0.0f;
      float sum0 = p0, sum1 = p1;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, o);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, o);
      }
      p_s[h0 * kPPitch + lane] = __float2bfloat16(p0);
      p_s[h1 * kPPitch + lane] = __float2bfloat16(p1);
      if (lane == 0) {
        const float alpha0 = exp2f(m_old0 - m_new0), alpha1 = exp2f(m_old1 - m_new1);
        alpha_s[h0] = alpha0;
        alpha_s[h1] = alpha1;
        l_run[h0] = l_run[h0] * alpha0 + sum0;
        l_run[h1] = l_run[h1] * alpha1 + sum1;
        m_run[h0] = m_new0;
        m_run[h1] = m_new1;
      }
    }
    __syncthreads();

    // o = o * alpha + P · V over the warp's 64 dims.
    const float alpha_lo = alpha_s[g], alpha_hi = alpha_s[g + 8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      o[j][0] *= alpha_lo;
      o[j][1] *= alpha_lo;
      o[j][2] *= alpha_hi;
      o[j][3] *= alpha_hi;
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t pa[4];
      ldmatrix_x4(pa, p_s + (lane % 16) * kPPitch + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, kt + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kPitch + warp * 64 + np * 16 +
                                  (lane / 16) * 8);
        mma_bf16_16816(o[2 * np], pa, vb[0], vb[1]);
        mma_bf16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // the stage is refilled two tiles on
    if (t == 0) CHAIN_STAMP(m, AttnFirstPv);
  }

  // The output through the tiles' stages (free after the loop's last
  // __syncthreads) into whole-line stores: the fragments' own stores touch 8 rows'
  // lines each. Rows padded to 520 floats: the 8 rows a store writes fall
  // on distinct banks.
  constexpr int kStagePitch = kL + 8;
  static_assert(sizeof(float) * kH * kStagePitch <= sizeof(__nv_bfloat16) * 2 * kTile * kPitch, "fits the stages");
  float* stage = reinterpret_cast<float*>(k_s);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int d = warp * 64 + j * 8 + 2 * c4;
    *reinterpret_cast<float2*>(stage + g * kStagePitch + d) = make_float2(o[j][0], o[j][1]);
    *reinterpret_cast<float2*>(stage + (g + 8) * kStagePitch + d) = make_float2(o[j][2], o[j][3]);
  }
  __syncthreads();
  float4* po = reinterpret_cast<float4*>(s.partial_o + size_t(split) * kH * kL);
#pragma unroll
  for (int i = tid; i < kH * kL / 4; i += kThreads)
    po[i] = *reinterpret_cast<const float4*>(stage + i / (kL / 4) * kStagePitch + i % (kL / 4) * 4);
  if (tid < kH)
    *reinterpret_cast<float2*>(s.partial_ml + (size_t(split) * kH + tid) * 2) = make_float2(m_run[tid], l_run[tid]);
}

// m.o = the merged attention output of head h, rounded to bf16 as the
// op-by-op path stores it. Every thread requests its partials (4 dims of
// half of the splits, up to kMergeInFlight of them) and the splits' (max,
// sum) at once, one L2 round trip; warp 0 turns the maxima into weights.
constexpr int kMergeInFlight = 16;

__device__ void merge_head(const Scratch& s, int h, int splits, Misc& m) {
  const int tid = threadIdx.x, lane = tid % 32;
  static_assert(kL / 4 * 2 == kThreads, "two halves of 128 float4 columns");
  const int quad = tid % (kL / 4), half = tid / (kL / 4);
  const float4* src = reinterpret_cast<const float4*>(s.partial_o + size_t(h) * kL) + quad;
  const size_t split_stride = size_t(kH) * kL / 4;
  float4 v[kMergeInFlight];
#pragma unroll
  for (int j = 0; j < kMergeInFlight; ++j) {
    const int i = half + 2 * j;
    if (i < splits) v[j] = __ldcg(src + i * split_stride);
  }
  for (int i = tid; i < splits; i += blockDim.x) {
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(s.partial_ml) + size_t(i) * kH + h);
    m.weight[i] = ml.x;
    m.l[i] = ml.y;
  }
  __syncthreads();
  if (tid < 32) {
    float mx = -INFINITY;
    for (int i = lane; i < splits; i += 32) mx = fmaxf(mx, m.weight[i]);
    mx = warp_max(mx);
    float denom = 0.0f;
    for (int i = lane; i < splits; i += 32) {
      const float w = exp2f(m.weight[i] - mx);
      m.weight[i] = w;
      denom += w * m.l[i];
    }
    denom = warp_sum(denom);
    __syncwarp();
    const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
    for (int i = lane; i < splits; i += 32) m.weight[i] *= inv;
  }
  __syncthreads();
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto add = [&](float w, float4 x) {
    acc.x = fmaf(w, x.x, acc.x);
    acc.y = fmaf(w, x.y, acc.y);
    acc.z = fmaf(w, x.z, acc.z);
    acc.w = fmaf(w, x.w, acc.w);
  };
#pragma unroll
  for (int j = 0; j < kMergeInFlight; ++j) {
    const int i = half + 2 * j;
    if (i < splits) add(m.weight[i], v[j]);
  }
  for (int i = half + 2 * kMergeInFlight; i < splits; i += 2) add(m.weight[i], __ldcg(src + i * split_stride));
  if (half == 1) m.part[quad] = acc;
  __syncthreads();
  if (half == 0) {
    const float4 b = m.part[quad];
    m.o[4 * quad] = __bfloat162float(__float2bfloat16(acc.x + b.x));
    m.o[4 * quad + 1] = __bfloat162float(__float2bfloat16(acc.y + b.y));
    m.o[4 * quad + 2] = __bfloat162float(__float2bfloat16(acc.z + b.z));
    m.o[4 * quad + 3] = __bfloat162float(__float2bfloat16(acc.w + b.w));
  }
  __syncthreads();
}

// Block e's share of router logit e before the norm's scale: router[e] ·
// diag(moe_norm) · (residual + w_o · attn), the w_o part through the fold,
// over this thread's 8 of the D (= H Dv) terms: attn's in the tagged words,
// the residual's in m.residual; w: its 8 router and norm weights and fold
// values, loaded before the PDL wait.
struct LogitWeights {
  uint4 router{}, norm{};
  float4 fold[2]{};
};

__device__ float logit_share(const uint4 (&attn)[2], const LogitWeights& w, const Misc& m) {
  static_assert(kD == 8 * kThreads && kAttnWidth == kD, "8 values a thread of the residual and of attn");
  float r[8], g[8], res[8];
  bf16x8_to_float(w.router, r);
  bf16x8_to_float(w.norm, g);
  Bf16x8::load(m.residual + threadIdx.x * 8).to_float(res);
  const float fold[8] = {w.fold[0].x, w.fold[0].y, w.fold[0].z, w.fold[0].w,
                         w.fold[1].x, w.fold[1].y, w.fold[1].z, w.fold[1].w};
  const uint32_t a[8] = {attn[0].x, attn[0].y, attn[0].z, attn[0].w, attn[1].x, attn[1].y, attn[1].z, attn[1].w};
  float share = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) share = fmaf(fold[j], word_value(a[j]), fmaf(r[j] * g[j], res[j], share));
  return share;
}

// Phase 6: the block's sum of squares of its residual rows (ss, the lanes'
// sums) into norm_parts and, in block e < E, logit e times the residual's
// rms (share, the threads' logit_share) into logits; the MoE norms from the
// parts (Backend's PendingNorm), so no block waits for another here.
__device__ void moe_tail(const MlaDecodeChainParams& p, float ss, float share) {
  __shared__ float2 part[kWarps];
  const int tid = threadIdx.x, b = blockIdx.x;
  const bool routes = b < p.num_experts;
  ss = warp_sum(ss);
  if (routes) share = warp_sum(share);
  if (tid % 32 == 0) part[tid / 32] = make_float2(ss, share);
  __syncthreads();
  if (tid == 0) {
    float2 sum = part[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum.x += part[w].x, sum.y += part[w].y;
    p.norm_parts[b] = sum.x;
    if (routes) p.logits[b] = sum.y;
  }
}

__global__ void __launch_bounds__(kThreads, 1) mla_decode_chain_kernel(MlaDecodeChainParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  // The qkv, W_UV and o_proj weights in; the split's first tile in.
  __shared__ __align__(8) uint64_t bars[4];
  __shared__ Misc misc;
  const int grid = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
  CHAIN_TIMELINE_ENTER(misc);
  const Layout lay = layout_for(grid);
  const Scratch s = carve(p.scratch, grid, nullptr);
  auto* qkv_w = reinterpret_cast<__nv_bfloat16*>(smem + Layout::qkv_offset(b));
  auto* uv_w = reinterpret_cast<__nv_bfloat16*>(smem + lay.uv);
  auto* o_w = reinterpret_cast<__nv_bfloat16*>(smem + lay.o);

  // Each phase's rows of this block.
  const int qkv0 = lay.qkv_first(b), qkv_n = lay.qkv_count(b);
  const int uv0 = min(kAttnWidth, b * lay.uv_rows), uv_n = min(kAttnWidth, uv0 + lay.uv_rows) - uv0;
  const int o0 = min(kD, b * lay.o_rows), o_n = min(kD, o0 + lay.o_rows) - o0;
  const int uk_n =
      b >= lay.uk_block0 && b < grid - 1 ? min(lay.uk_per_block, kUkUnits - (b - lay.uk_block0) * lay.uk_per_block) : 0;

  // Weights do not depend on earlier kernels: request all of them now.
  if (tid == 0) {
    for (auto& bar : bars) sm90::mbar_init(&bar, 1);
    sm90::mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    const uint32_t qkv_bytes = 2u * qkv_n * kD, uv_bytes = 2u * uv_n * kL, o_bytes = 2u * o_n * kAttnWidth;
    sm90::mbar_arrive_expect_tx(&bars[0], qkv_bytes);
    if (qkv_bytes) bulk_load(qkv_w, p.w_qkv + size_t(qkv0) * kD, qkv_bytes, &bars[0]);
    sm90::mbar_arrive_expect_tx(&bars[1], uv_bytes);
    if (uv_bytes) bulk_load(uv_w, p.w_uv + size_t(uv0) * kL, uv_bytes, &bars[1]);
    sm90::mbar_arrive_expect_tx(&bars[2], o_bytes);
    if (o_bytes) bulk_load(o_w, p.w_o + size_t(o0) * kAttnWidth, o_bytes, &bars[2]);
  }
  UkWeights uk[kMaxUkPerBlock];
#pragma unroll
  for (int i = 0; i < kMaxUkPerBlock; ++i)
    if (i < uk_n) uk[i] = load_uk(p, (b - lay.uk_block0) * lay.uk_per_block + i);

  // The batch was uploaded before the step's first kernel.
  const Constants constants = load_constants(p, b == grid - 1);
  const bool routes = p.router && b < p.num_experts;
  LogitWeights logit_w;
  if (routes) {
    logit_w.router = *reinterpret_cast<const uint4*>(p.router + size_t(b) * kD + tid * 8);
    logit_w.norm = *reinterpret_cast<const uint4*>(p.moe_norm + tid * 8);
    const float4* fold = reinterpret_cast<const float4*>(p.router_fold + size_t(b) * kAttnWidth + tid * 8);
    logit_w.fold[0] = fold[0];
    logit_w.fold[1] = fold[1];
  }

  Split sp;
  sp.kv_begin = constants.kv_begin;
  const int kv_len = constants.kv_end - sp.kv_begin;
  const int chunk = max(kTile, ceil_div(ceil_div(kv_len, grid), kTile) * kTile);
  const int splits = ceil_div(kv_len, chunk);
  sp.last_row = kv_len - 1;
  sp.row0 = b * chunk;
  sp.rows = b < splits ? min(chunk, kv_len - sp.row0) : 0;
  __shared__ int first_slots[2 * kTile];
  sp.first_slots = first_slots;
  sp.tile_bar = bars + 3;
  sp.all_slots = p.kv_slots;
  if (sp.rows > 0 && b < kEarlySplits) preload_first_tile(p, sp, smem, true);

  pdl_wait();  // h comes from the previous kernel
  // Phase 5's residual stream, unless it is phase 1's sum (in place).
  const bool residual_in_place = p.x && p.in_residual && p.in_residual == p.residual && p.router;
  const uint4 tail_residual =
      p.router && !residual_in_place ? load_cg(p.residual + tid * 8) : make_uint4(0, 0, 0, 0);
  // Every thread reads the count: the tags of its posts and polls.
  const Mailbox box = mailbox_of(p.sync, nullptr);
  const unsigned long long count = load_relaxed(box.count), launch = count / unsigned(grid);
  const uint32_t tag = uint32_t(launch % 65535) + 1;
  CHAIN_TIMELINE_BASE(misc, launch);
  CHAIN_STAMP(misc, WaitReturned);

  // 1. qkv rows.
  Bf16x8 input_residual;  // in_residual + x, this thread's 8 values (norm head)
  int first_slot;
  {
    uint4 x[kChunks];
    load_h(p, constants.in_norm, misc, x, input_residual);
    // The first two tiles' slots (a dependent load: not before the wait),
    // staged after this phase.
    static_assert(2 * kTile <= kThreads, "a slot a thread");
    first_slot = tid < min(sp.rows, 2 * kTile) ? p.kv_slots[sp.kv_begin + sp.row0 + tid] : 0;
    sm90::mbar_wait(&bars[0], 0);
    CHAIN_STAMP(misc, Phase1Ready);
    rows_times_vector<kD>(qkv_w, qkv_n, x, [&](int r, float acc) {
      post(box.qkv + qkv0 + r, tagged(__float2bfloat16(acc), tag));
    });
  }
  CHAIN_STAMP_ALL(misc, Phase1Done);
  if (tid < 2 * kTile) first_slots[tid] = first_slot;
  stage_constants(p, constants, misc, b == grid - 1);
  if (residual_in_place)
    input_residual.store(misc.residual + tid * 8);
  else if (p.router)
    reinterpret_cast<uint4*>(misc.residual)[tid] = tail_residual;
  __syncthreads();  // the staged slots and constants; the qkv weights' region is free for the tiles
  // The context rows of tiles past the second go to L2 now (they are read
  // after phase 2; earlier, the previous kernels' traffic would evict them).
  for (int i = tid; i < max(0, sp.rows - 2 * kTile) * (kRow * 2 / 128); i += kThreads) {
    const int r = 2 * kTile + i / (kRow * 2 / 128), line = i % (kRow * 2 / 128);
    prefetch_l2(reinterpret_cast<const uint8_t*>(p.cache + sp.slot(r) * kRow) + line * 128);
  }
  if (sp.rows > 0 && b >= kEarlySplits) preload_first_tile(p, sp, smem, false);

  // 2. q_nope · W_UK and the q_pe rope; the latent write.
#pragma unroll
  for (int i = 0; i < kMaxUkPerBlock; ++i)
    if (i < uk_n) {
      uk_unit(box, tag, (b - lay.uk_block0) * lay.uk_per_block + i, uk[i], misc);
      if (i == 0) CHAIN_STAMP(misc, Phase2Ready);
    }
  if (b == grid - 1) latent_write(p, box, tag, misc);
  CHAIN_STAMP_ALL(misc, Phase2Done);

  // 3. Attention over this block's split.
  if (sp.rows > 0) attention_split(p, s, box, tag, smem, b, sp, misc);
  // The next kernel launches as this grid's blocks exit. A trigger here made
  // the step slower while a chain block left room for other blocks beside it
  // (bs 1 on the H200: 2.04 ms a step against 2.14); with a block filling its
  // SM, earlier triggers were within noise (perf.md, session 26) or slowed
  // the chain's last phases (2.203 / 2.201 against 2.186, session 31).
  CHAIN_STAMP_ALL(misc, AttentionDone);
  grid_barrier(box.count, (launch + 1) * unsigned(grid));
  CHAIN_STAMP(misc, Barrier);

  // The input residual, now that every block has read it, unless phase 5
  // writes the residual stream into the same row.
  if (p.in_residual && !residual_in_place && b == max(0, grid - 2)) input_residual.store(p.in_residual + tid * 8);

  // 4. Merge and W_UV for this block's rows (one or two heads).
  sm90::mbar_wait(&bars[1], 0);
  for (int r = uv0; r < uv0 + uv_n;) {
    const int h = r / kDv, end = min(uv0 + uv_n, (h + 1) * kDv);
    merge_head(s, h, splits, misc);
    if (r == uv0) CHAIN_STAMP(misc, FirstMergeDone);
    const int lane = tid % 32, warp = tid / 32;
    for (int i = r + warp; i < end; i += kWarps) {
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < kL / 256; ++c) {
        float wf[8];
        bf16x8_to_float(*reinterpret_cast<const uint4*>(uv_w + size_t(i - uv0) * kL + c * 256 + lane * 8), wf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc = fmaf(wf[j], misc.o[c * 256 + lane * 8 + j], acc);
      }
      acc = warp_sum(acc);
      if (lane == 0) post(box.attn + i, tagged(__float2bfloat16(acc), tag));
    }
    __syncthreads();  // misc.o is the next head's
    r = end;
  }
  CHAIN_STAMP_ALL(misc, Phase4Done);

  // 5. o_proj rows; at a MoE layer, also the residual stream's rows and the
  // share of a router logit.
  float ss = 0.0f, share = 0.0f;  // phase 6's
  {
    static_assert(kAttnWidth == kD, "attn is staged in misc.row");
    uint4 words[2];
    await4<2>([&](int j) { return box.attn + tid * 8 + 4 * j; }, tag, words);
    reinterpret_cast<uint4*>(misc.row)[tid] = make_uint4(word_pair(words[0].x, words[0].y),
                                                         word_pair(words[0].z, words[0].w),
                                                         word_pair(words[1].x, words[1].y),
                                                         word_pair(words[1].z, words[1].w));
    if (routes) share = logit_share(words, logit_w, misc);
    CHAIN_STAMP(misc, Phase5AttnIn);
    __syncthreads();
    uint4 a[kAttnChunks];
#pragma unroll
    for (int c = 0; c < kAttnChunks; ++c) a[c] = *reinterpret_cast<const uint4*>(misc.row + c * 256 + (tid % 32) * 8);
    sm90::mbar_wait(&bars[2], 0);
    CHAIN_STAMP(misc, Phase5Ready);
    rows_times_vector<kAttnWidth>(o_w, o_n, a, [&](int r, float acc) {
      const __nv_bfloat16 v = __float2bfloat16(acc);
      p.out[o0 + r] = v;
      if (p.router) {  // rms_norm's residual add, and the sum its norm takes
        const __nv_bfloat16 sum = __float2bfloat16(__bfloat162float(misc.residual[o0 + r]) + __bfloat162float(v));
        p.residual[o0 + r] = sum;
        ss = fmaf(__bfloat162float(sum), __bfloat162float(sum), ss);
      }
    });
  }
  CHAIN_STAMP_ALL(misc, Phase5Done);

  // 6. The MoE layer's start.
  if (p.router) {
    moe_tail(p, ss, share);
    CHAIN_STAMP(misc, TailWritten);
  }
  CHAIN_STAMP(misc, Exit);
}

}  // namespace

void mla_decode_chain_timeline_dump(const std::string& path) {
#ifdef MLASERVE_CHAIN_TIMELINE
  std::vector<unsigned long long> stamps(sizeof(g_chain_timeline) / sizeof(unsigned long long));
  MLA_CUDA_CHECK(cudaMemcpyFromSymbol(stamps.data(), g_chain_timeline, sizeof(g_chain_timeline)),
                 "mla_decode_chain_timeline_dump");
  FILE* f = std::fopen(path.c_str(), "wb");
  const bool written = f && std::fwrite(stamps.data(), sizeof(stamps[0]), stamps.size(), f) == stamps.size();
  if (f) std::fclose(f);
  if (!written) throw std::runtime_error("mla_decode_chain_timeline_dump: cannot write " + path);
#else
  throw std::runtime_error("mla_decode_chain_timeline_dump: " + path +
                           ": built without the timeline (cmake -DMLASERVE_CHAIN_TIMELINE=ON)");
#endif
}

bool mla_decode_chain_applies(const MlaDecodeChainShape& s, int sm_count) {
  if (s.hidden != kD || s.heads != kH || s.nope_dim != kDn || s.rope_dim != kR || s.latent_dim != kL ||
      s.v_dim != kDv || sm_count < 1 || sm_count > kMaxGrid)
    return false;
  int device = 0, major = 0, max_smem = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess || major < 9)
    return false;  // bulk copies and programmatic launch are Hopper's
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, mla_decode_chain_kernel) != cudaSuccess) return false;
  // More than half of an SM's shared memory keeps it to one block per SM.
  const Layout l = layout_for(sm_count);
  return sm_count > kEarlySplits && l.uk_block0 >= 0 &&
         l.total + attr.sharedSizeBytes <= size_t(max_smem);
}

bool mla_decode_chain_routes(int num_experts, int sm_count) { return num_experts >= 1 && num_experts <= sm_count; }

bool mla_decode_chain_takes_fold(int hidden, int attn_width, int num_experts, int sm_count) {
  return hidden == kD && attn_width == kAttnWidth && mla_decode_chain_routes(num_experts, sm_count);
}

namespace {

// fold[e, k] in f32, a thread a column: products of bf16 values are exact in
// f32, so only the sums round. A tile of router[e] · norm is staged at a time.
constexpr int kFoldThreads = 256, kFoldTile = 1024;

__global__ void __launch_bounds__(kFoldThreads) router_fold_kernel(const __nv_bfloat16* router,
                                                                   const __nv_bfloat16* norm,
                                                                   const __nv_bfloat16* w_o, int hidden,
                                                                   int attn_width, float* fold) {
  __shared__ float scaled[kFoldTile];
  const int e = blockIdx.y, k = blockIdx.x * kFoldThreads + threadIdx.x;
  float acc = 0.0f;
  for (int i0 = 0; i0 < hidden; i0 += kFoldTile) {
    const int n = min(kFoldTile, hidden - i0);
    __syncthreads();  // the previous tile is read
    for (int i = threadIdx.x; i < n; i += kFoldThreads)
      scaled[i] = __bfloat162float(router[size_t(e) * hidden + i0 + i]) * __bfloat162float(norm[i0 + i]);
    __syncthreads();
    if (k < attn_width)
      for (int i = 0; i < n; ++i) acc = fmaf(scaled[i], __bfloat162float(w_o[size_t(i0 + i) * attn_width + k]), acc);
  }
  if (k < attn_width) fold[size_t(e) * attn_width + k] = acc;
}

}  // namespace

void mla_decode_chain_router_fold(const __nv_bfloat16* router, const __nv_bfloat16* norm,
                                  const __nv_bfloat16* w_o, int num_experts, int hidden, int attn_width, float* fold,
                                  cudaStream_t stream) {
  MLA_CUDA_REQUIRE(num_experts >= 1 && num_experts <= 65535 && hidden >= 1 && attn_width >= 1,
                   "mla_decode_chain_router_fold: " + std::to_string(num_experts) + " experts, hidden " +
                       std::to_string(hidden) + ", attention width " + std::to_string(attn_width));
  router_fold_kernel<<<dim3(ceil_div(attn_width, kFoldThreads), num_experts), kFoldThreads, 0, stream>>>(
      router, norm, w_o, hidden, attn_width, fold);
  check_launch("mla_decode_chain_router_fold");
}

size_t mla_decode_chain_sync_bytes() {
  size_t bytes = 0;
  mailbox_of(nullptr, &bytes);
  return bytes;
}

size_t mla_decode_chain_scratch_bytes(int sm_count) {
  size_t bytes = 0;
  carve(nullptr, sm_count, &bytes);
  return bytes;
}

void mla_decode_chain(const MlaDecodeChainParams& p, int sm_count, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(sm_count >= 1 && sm_count <= kMaxGrid && p.scratch && p.sync,
                   "mla_decode_chain: " + std::to_string(sm_count) + " SMs (1 to " + std::to_string(kMaxGrid) +
                       "), scratch and sync state required");
  MLA_CUDA_REQUIRE(!p.router || (p.router_fold && p.norm_parts),
                   "mla_decode_chain: a router without its fold or the norm's parts");
  // A block takes all of an SM's shared memory, not only its layout's: the
  // MoE's gate_up then starts on the SMs whose blocks have left instead of
  // beside the chain's last phases, which it slowed by up to 2.5 us (v2-lite
  // bs 1, H100: 2.303 against 2.324 ms a step).
  static const int smem = [] {  // once per process, as the other kernels set theirs
    int device = 0, max_smem = 0;
    MLA_CUDA_CHECK(cudaGetDevice(&device), "mla_decode_chain");
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                   "mla_decode_chain");
    cudaFuncAttributes attr{};
    MLA_CUDA_CHECK(cudaFuncGetAttributes(&attr, mla_decode_chain_kernel), "mla_decode_chain");
    const int bytes = max_smem - int(attr.sharedSizeBytes);
    MLA_CUDA_CHECK(
        cudaFuncSetAttribute(mla_decode_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "mla_decode_chain");
    return bytes;
  }();
  MLA_CUDA_REQUIRE(size_t(smem) >= layout_for(sm_count).total, "mla_decode_chain: shared memory too small");
  launch_dependent(mla_decode_chain_kernel, dim3(sm_count), dim3(kThreads), size_t(smem), stream, p);
  check_launch("mla_decode_chain");
}

}  // namespace mlaserve::cuda
