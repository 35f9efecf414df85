#pragma once
// PTX wrappers for the Hopper (sm_90a) GEMM kernels: mbarriers, TMA
// bulk-tensor loads, wgmma descriptors and the wgmma shapes the kernels use.
// Shared-memory tiles are in the canonical K-major 128-byte-swizzle layout
// (rows of 128 bytes, 16-byte chunk c of row r stored at chunk c ^ (r % 8),
// 8-row atoms 1024 bytes apart), which TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B and wgmma reads through the descriptor below.
#include <cuda.h>

#include <cstdint>

// Output operands of a wgmma accumulator: d[i] .. d[i + 63], read and written.
#define MLA_WGMMA_ACC8(d, i)                                                                                  \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define MLA_WGMMA_ACC64(d, i)                                                                                \
  MLA_WGMMA_ACC8(d, i), MLA_WGMMA_ACC8(d, (i) + 8), MLA_WGMMA_ACC8(d, (i) + 16), MLA_WGMMA_ACC8(d, (i) + 24), \
      MLA_WGMMA_ACC8(d, (i) + 32), MLA_WGMMA_ACC8(d, (i) + 40), MLA_WGMMA_ACC8(d, (i) + 48),                \
      MLA_WGMMA_ACC8(d, (i) + 56)

namespace mlaserve::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals));
}

// Makes the initialized barriers visible to the async (TMA) proxy.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(smem_u32(bar)); }

// A float at a shared-window address (a generic load of a pointer whose
// address space the compiler lost costs 64-bit arithmetic and LD.E).
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// One mbarrier.try_wait.parity with the semantics `sem` ("" for the default
// CTA-scope acquire) into `done`, on barrier `addr`, phase parity `parity`.
#define MLA_MBAR_TRY_WAIT(sem, done, addr, parity)                              \
  asm volatile(                                                                 \
      "{\n"                                                                     \
      ".reg .pred p;\n"                                                         \
      "mbarrier.try_wait.parity" sem ".shared::cta.b64 p, [%1], %2;\n"          \
      "selp.u32 %0, 1, 0, p;\n"                                                 \
      "}\n"                                                                     \
      : "=r"(done)                                                              \
      : "r"(addr), "r"(parity)                                                  \
      : "memory")

// Waits until the phase with the given parity has completed (the barrier by
// its shared-window address, which a hot loop keeps in a register).
// kClusterAcquire: with cluster-scope acquire, so that what other CTAs
// released before their arrivals is visible after it.
template <bool kClusterAcquire = false>
__device__ __forceinline__ void mbar_wait(uint32_t addr, uint32_t parity) {
  uint32_t done = 0;
  do {
    if constexpr (kClusterAcquire)
      MLA_MBAR_TRY_WAIT(".acquire.cluster", done, addr, parity);
    else
      MLA_MBAR_TRY_WAIT("", done, addr, parity);
  } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait(smem_u32(bar), parity); }

// 2D tile load: box at (inner coordinate c0, outer coordinate c1) into dst,
// completing `bar`'s transaction count.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// 3D tile load: box at (c0 innermost, c1, c2) into dst, completing `bar`'s transaction count.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The same load delivered to every CTA of the cluster in cta_mask, at this
// CTA's offsets of dst and bar (the CTAs share one shared-memory layout).
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// One arrival on the barrier at this CTA's offset of `bar` in cluster CTA
// `rank`. NOTES: the default (CTA-scope) release, as for a local arrival: a
// cluster-scope release waits for every earlier memory operation of the
// thread, ~500 cycles a stage on the consumers' path (measured: pairs ran
// at 0.63x of single CTAs with .release.cluster).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}

// The shared::cluster address of this CTA's shared-window address `addr` in cluster CTA `rank`.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}

// One arrival on the barrier at shared::cluster address `remote`, releasing
// this thread's earlier accesses to the cluster (once a unit, where the
// receiver then writes into memory this CTA was reading).
__device__ __forceinline__ void mbar_arrive_remote_release(uint32_t remote) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// 16 bytes into another CTA's shared memory (shared::cluster address
// `remote`), completing 16 bytes of the transaction count of the barrier at
// `remote_bar` in that CTA.
__device__ __forceinline__ void st_async_16(uint32_t remote, float4 v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
               "r"(__float_as_uint(v.w)), "r"(remote_bar)
               : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads') over `threads` threads of the CTA.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at named barrier id without waiting (the other side bar.syncs).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Every thread of every CTA of the cluster, with release / acquire ordering
// (barrier initializations made visible before any CTA signals another's).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Async copies of 16 (L2 only) or 4 bytes into shared memory; src_bytes 0
// writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// One arrival on `bar` (counted in its init count) once this thread's
// earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Orders shared-memory writes made through the generic proxy (cp.async)
// before the async proxy's reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Descriptor of a K-major 128B-swizzled tile at `addr` (1024-byte aligned
// atoms): leading offset unused for swizzled K-major, stride 1024 bytes
// between 8-row atoms, layout type 1 = 128B swizzle. Stepping 32 bytes along
// K inside the 128-byte row adds 2 to the low word.
// The high word is the same for every such tile, so a loop may step only the
// low word (32-bit adds; ptxas then needs no register for the constant half).
constexpr uint32_t kWgmmaDescHi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t wgmma_desc_lo(uint32_t addr) { return ((addr & 0x3FFFFu) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t wgmma_desc_of(uint32_t lo) { return (uint64_t(kWgmmaDescHi) << 32) | lo; }
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr) { return wgmma_desc_of(wgmma_desc_lo(addr)); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across a wgmma
// wait (the registers are written asynchronously).
template <int kN>
__device__ __forceinline__ void fence_registers(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Descriptor of an MN-major 128B-swizzled B tile at `addr` (B stored K rows
// of 64 N values, 128 bytes each, swizzled as above): 8 K rows an atom,
// atoms 1024 bytes apart along K; the next 64 N values start `n_block_bytes`
// further on (the leading offset).
__device__ __forceinline__ uint64_t wgmma_desc_mn(uint32_t addr, uint32_t n_block_bytes) {
  uint64_t d = (addr & 0x3FFFFu) >> 4;
  d |= uint64_t((n_block_bytes >> 4) & 0x3FFFu) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

// The 16-bit operand types of the wgmma shapes that take either.
enum class Mma16 { kBf16, kF16 };
// The asm statement ASM(type string) for the function's kType.
#define MLA_WGMMA_OF_TYPE(ASM)         \
  if constexpr (kType == Mma16::kF16) \
    ASM("f16");                        \
  else                                 \
    ASM("bf16")

// d (64 x 256 f32 per warpgroup) = A(64 x 16) · B(256 x 16)ᵀ + (accumulate ? d : 0),
// A and B both bf16 or both f16 (kType); kTransposeB: B is MN-major
// (wgmma_desc_mn), i.e. d += A · B with B {16, 256}.
// Accumulator layout (warp w of the warpgroup, lane l): d[4j + 2h + e] is row
// 16w + l/4 + 8h, column 8j + 2(l%4) + e.
#define MLA_WGMMA_M64N256K16(TYPE)                                                                         \
  asm volatile(                                                                                            \
      "{\n"                                                                                                \
      ".reg .pred p;\n"                                                                                    \
      "setp.ne.b32 p, %130, 0;\n"                                                                          \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {"                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                             \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                   \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                   \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                   \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                   \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                   \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "        \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"      \
      "}, %128, %129, p, 1, 1, 0, %131;\n"                                                                 \
      "}\n"                                                                                                \
      : MLA_WGMMA_ACC64(d, 0), MLA_WGMMA_ACC64(d, 64)                                                      \
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransposeB))
template <Mma16 kType, int kTransposeB = 0>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  MLA_WGMMA_OF_TYPE(MLA_WGMMA_M64N256K16);
}
#undef MLA_WGMMA_M64N256K16

// d (64 x 32 f32 per warpgroup) = A(64 x 16) · B(32 x 16)ᵀ + (accumulate ? d : 0),
// both bf16 or both f16, same accumulator layout.
#define MLA_WGMMA_M64N32K16(TYPE)                                                                            \
  asm volatile(                                                                                              \
      "{\n"                                                                                                  \
      ".reg .pred p;\n"                                                                                      \
      "setp.ne.b32 p, %18, 0;\n"                                                                             \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " {"                                       \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                 \
      "}, %16, %17, p, 1, 1, 0, 0;\n"                                                                        \
      "}\n"                                                                                                  \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "l"(a), "l"(b), "r"(accumulate))
template <Mma16 kType>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
  MLA_WGMMA_OF_TYPE(MLA_WGMMA_M64N32K16);
}
#undef MLA_WGMMA_M64N32K16
#undef MLA_WGMMA_OF_TYPE

// d (64 x 64 f32 per warpgroup) = A(64 x 16 bf16) · B(64 x 16 bf16)ᵀ + (accumulate ? d : 0),
// same accumulator layout (which is also mma.sync m16n8k16's, n-tile j of warp w).
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (64 x 128 f32 per warpgroup) = A(64 x 16 bf16) · B(128 x 16 bf16)ᵀ + (accumulate ? d : 0),
// same accumulator layout.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : MLA_WGMMA_ACC64(d, 0)
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (64 x 128 f32 per warpgroup) += A(64 x 16 bf16, from registers) · B(16 x 128 bf16, MN-major,
// wgmma_desc_mn). A's fragment is mma.sync m16n8k16's for the warp's 16 rows:
// a[0] row l/4, k 2(l%4); a[1] row + 8; a[2], a[3] the same at k + 8.
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.eq.u32 p, 1, 1;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_ACC64(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d (64 x 128 f32 per warpgroup) = A(64 x 32 e4m3) · B(128 x 32 e4m3)ᵀ + (accumulate ? d : 0),
// same accumulator layout.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_ACC64(d, 0)
      : "l"(a), "l"(b), "r"(accumulate));
}

// The same with 192 columns (96 accumulators a thread, in the same per-8-column layout).
__device__ __forceinline__ void wgmma_m64n192k32_e4m3(float (&d)[96], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1;\n"
      "}\n"
      : MLA_WGMMA_ACC64(d, 0), MLA_WGMMA_ACC8(d, 64), MLA_WGMMA_ACC8(d, 72), MLA_WGMMA_ACC8(d, 80),
        MLA_WGMMA_ACC8(d, 88)
      : "l"(a), "l"(b), "r"(accumulate));
}

}  // namespace mlaserve::cuda::sm90
