// How fast the GPU reads a buffer it never writes, the way a decode step
// streams weights: plain 16-byte loads (each thread `depth` in flight, grid
// stride, 1 to 8 blocks an SM), and a ring of shared-memory stages filled by
// one thread's bulk copies (cp.async.bulk on mbarriers, one block an SM). Each
// launch reads `mib` MiB; launches rotate over six such regions so that L2
// holds none of the next one. Prints us a launch and GB/s (best of 5 runs of
// 20 launches; GB/s of 10^9 bytes): the rate a bs-1 MoE layer's weights
// (v2-lite: 138.4 MB) could stream at, beside the copy rate of
// bench_kernels_cuda (docs/perf.md session 23; not part of the build).
// Build here, run on the GPU machine (carry the folder it is built into):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o .device-x/stream_rate scripts/device/stream_rate.cu
//   .device-x/stream_rate [mib]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kConsumerWarps = 8, kMaxStages = 16;

__device__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// The consumers only touch each stage (one word a thread) and hand it back:
// the ring's rate, not any computation's.
__global__ void __launch_bounds__(kConsumerWarps * 32 + 32, 1)
    ring_kernel(const uint8_t* src, size_t bytes, int stage_bytes, int stages, float* sink) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
  const size_t share = bytes / gridDim.x / stage_bytes * stage_bytes;
  const uint8_t* mine = src + share * blockIdx.x;
  const int count = int(share / stage_bytes);
  const int producer = kConsumerWarps * 32;
  if (threadIdx.x == producer) {
    for (int i = 0; i < stages; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= producer) {
    if (threadIdx.x != producer) return;
    for (int i = 0, st = 0, phase = 1; i < count; ++i) {
      mbar_wait(&empty[st], phase);
      mbar_expect_tx(&full[st], stage_bytes);
      bulk_load(ring + st * stage_bytes, mine + size_t(i) * stage_bytes, stage_bytes, &full[st]);
      if (++st == stages) st = 0, phase ^= 1;
    }
    return;
  }
  float acc = 0.0f;
  for (int i = 0, st = 0, phase = 0; i < count; ++i) {
    mbar_wait(&full[st], phase);
    for (int o = threadIdx.x * 16; o < stage_bytes; o += producer * 16)
      acc += *reinterpret_cast<const float*>(ring + st * stage_bytes + o);
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(&empty[st]);
    if (++st == stages) st = 0, phase ^= 1;
  }
  if (acc == 1234.5f) *sink = acc;  // never true for the fill below; keeps the loads
}

template <int kDepth>
__global__ void __launch_bounds__(256) plain_kernel(const uint4* src, size_t n, float* sink) {
  float acc = 0.0f;
  const size_t stride = size_t(gridDim.x) * blockDim.x * kDepth;
  for (size_t b = size_t(blockIdx.x) * blockDim.x * kDepth + threadIdx.x; b < n; b += stride) {
    uint4 v[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      const size_t k = b + size_t(i) * blockDim.x;
      v[i] = k < n ? __ldg(src + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kDepth; ++i) acc += __int_as_float(v[i].x ^ v[i].w);
  }
  if (acc == 1234.5f) *sink = acc;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = size_t(argc > 1 ? std::atoi(argv[1]) : 138) << 20;  // MiB
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  uint8_t* buf = nullptr;
  float* sink = nullptr;
  check(cudaMalloc(&buf, 6 * bytes), "malloc");
  check(cudaMalloc(&sink, 4), "malloc");
  check(cudaMemset(buf, 1, 6 * bytes), "memset");
  check(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), "attribute");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  auto time_us = [&](auto launch) {
    float best = 1e30f;
    for (int run = 0; run < 5; ++run) {
      check(cudaEventRecord(start), "record");
      for (int i = 0; i < 20; ++i) launch(buf + size_t(i % 6) * bytes);
      check(cudaEventRecord(stop), "record");
      check(cudaEventSynchronize(stop), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      best = std::min(best, ms * 1000 / 20);
    }
    check(cudaGetLastError(), "launch");
    return best;
  };
  std::printf("%zu MiB a launch, %d SMs\n", bytes >> 20, sms);
  for (int blocks_per_sm : {1, 2, 4, 8})
    for (int depth : {8, 16}) {
      const int blocks = blocks_per_sm * sms;
      const float us = time_us([&](const uint8_t* p) {
        if (depth == 8) plain_kernel<8><<<blocks, 256>>>(reinterpret_cast<const uint4*>(p), bytes / 16, sink);
        else plain_kernel<16><<<blocks, 256>>>(reinterpret_cast<const uint4*>(p), bytes / 16, sink);
      });
      std::printf("plain loads, %d blocks an SM, %2d in flight a thread: %7.1f us %6.0f GB/s\n", blocks_per_sm, depth,
                  us, bytes / us / 1e3);
    }
  const int rings[][2] = {{4096, 16}, {8192, 16}, {16384, 6}, {16384, 12}, {32768, 6}};
  for (const auto& r : rings) {
    const float us = time_us([&](const uint8_t* p) {
      ring_kernel<<<sms, kConsumerWarps * 32 + 32, r[0] * r[1]>>>(p, bytes, r[0], r[1], sink);
    });
    std::printf("bulk-copy ring, %5d-byte stages x %2d: %7.1f us %6.0f GB/s\n", r[0], r[1], us, bytes / us / 1e3);
  }
  return 0;
}
