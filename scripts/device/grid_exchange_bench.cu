// Grid-wide exchange latency on one block per SM (an experiment behind the
// decode chain's design, docs/perf.md session 15; not part of the build).
// Build here, run on the GPU machine (carry the folder it is built into):
//   nvcc -O3 -arch=sm_90a -o .device-x/grid_exchange_bench scripts/device/grid_exchange_bench.cu
// Prints, per variant, microseconds per grid barrier (counter release +
// acquire poll, atomic-last-arriver flags, two levels, backoff), per
// barrier after reductions into shared accumulators (u64 / f32 / f32x4
// atomics), and per exchange of data (NCCL-style LL words against plain
// stores, a barrier and ld.cg).
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v; asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v; asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ unsigned long long atom_add_acq_rel(unsigned long long* p, unsigned long long x) {
  unsigned long long o; asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], %2;" : "=l"(o) : "l"(p), "l"(x) : "memory"); return o;
}
__device__ __forceinline__ void red_release(unsigned long long* p) {
  asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(p) : "memory");
}
__device__ __forceinline__ void st_release(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Lines: 32 u64 (256 B) apart.
constexpr int kLine = 32;

template <int V>
__global__ void __launch_bounds__(256, 1) bar_kernel(unsigned long long* mem, int iters, int exchange, int* bad) {
  extern __shared__ char smem[];
  const int G = gridDim.x, b = blockIdx.x;
  unsigned long long* count = mem;            // line 0
  unsigned long long* flag = mem + kLine;      // line 1
  unsigned long long* sub = mem + 2 * kLine;   // lines 2..(2+16)
  unsigned long long* flags8 = mem + 20 * kLine;  // lines 20..27
  unsigned long long* data = mem + 40 * kLine; // G lines
  constexpr int kGroup = 12;
  const int groups = (G + kGroup - 1) / kGroup;
  for (int it = 1; it <= iters; ++it) {
    if (exchange && threadIdx.x == 0) data[b * kLine] = it;
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned long long target = (unsigned long long)it * G;
      if (V == 0) {
        red_release(count);
        while (ld_acquire(count) < target) {}
      } else if (V == 1) {
        red_release(count);
        while (ld_relaxed(count) < target) {}
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
      } else if (V == 2) {
        if (atom_add_acq_rel(count, 1) == target - 1) st_release(flag, it);
        else while (ld_acquire(flag) < (unsigned long long)it) {}
      } else if (V == 3) {
        const int g = b / kGroup, gsize = min(kGroup, G - g * kGroup);
        bool top = atom_add_acq_rel(sub + g * kLine, 1) == (unsigned long long)it * gsize - 1;
        bool released = false;
        if (top && atom_add_acq_rel(count, 1) == (unsigned long long)it * groups - 1) { st_release(flag, it); released = true; }
        if (!released) while (ld_acquire(flag) < (unsigned long long)it) {}
      } else if (V == 4) {
        red_release(count);
        while (ld_acquire(count) < target) __nanosleep(20);
      } else if (V == 5) {
        if (atom_add_acq_rel(count, 1) == target - 1) {
          for (int i = 0; i < 8; ++i) st_release(flags8 + i * kLine, it);
        } else while (ld_acquire(flags8 + (b % 8) * kLine) < (unsigned long long)it) {}
      }
    }
    __syncthreads();
    if (exchange && threadIdx.x == 0) {
      const unsigned long long v = __ldcg(data + ((b + 1) % G) * kLine);
      if (v < (unsigned long long)it) atomicAdd(bad, 1);
    }
  }
}

template <int V>
void run(const char* name, int sms, unsigned long long* mem, int* bad, int exchange) {
  const int iters = 4000;
  cudaFuncSetAttribute(bar_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, 150 * 1024);
  cudaMemset(mem, 0, 256 * 1024);
  bar_kernel<V><<<sms, 256, 150 * 1024>>>(mem, 10, exchange, bad);
  cudaDeviceSynchronize();
  float best = 1e9;
  for (int r = 0; r < 5; ++r) {
    cudaMemset(mem, 0, 256 * 1024);
    cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
    cudaEventRecord(a);
    bar_kernel<V><<<sms, 256, 150 * 1024>>>(mem, iters, exchange, bad);
    cudaEventRecord(z);
    cudaEventSynchronize(z);
    float ms; cudaEventElapsedTime(&ms, a, z);
    if (ms < best) best = ms;
  }
  int h_bad = 0; cudaMemcpy(&h_bad, bad, 4, cudaMemcpyDeviceToHost);
  printf("%-28s grid %3d exchange %d: %.3f us a barrier (bad %d) %s\n", name, sms, exchange, best * 1000 / iters, h_bad,
         cudaGetErrorString(cudaGetLastError()));
}


// Reductions into shared accumulators, then a grid barrier (variant 0).
// mode 0: none; 1: red.add.u64 x8 a thread (2048 outputs); 2: float4 atomicAdd x2 (2048 outputs);
// 3: red.add.f32 x8; 4: u64 x2 a thread onto one head's 512 (W_UK-like, 132 blocks).
__global__ void __launch_bounds__(256, 1) red_kernel(unsigned long long* mem, int iters, int mode, int contributors) {
  extern __shared__ char smem[];
  const int G = gridDim.x, b = blockIdx.x, t = threadIdx.x;
  unsigned long long* count = mem;
  unsigned long long* acc = mem + 64 * kLine;  // 2048 u64 = 16 KB
  float* accf = reinterpret_cast<float*>(mem + 1024 * kLine);
  for (int it = 1; it <= iters; ++it) {
    if (b < contributors) {
      if (mode == 1) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const long long v = (long long)((b * 7 + t + j) & 255) << 20;
          asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(acc + t * 8 + j), "l"(v) : "memory");
        }
      } else if (mode == 2) {
        atomicAdd(reinterpret_cast<float4*>(accf) + t * 2, make_float4(1.f, 2.f, 3.f, 4.f));
        atomicAdd(reinterpret_cast<float4*>(accf) + t * 2 + 1, make_float4(1.f, 2.f, 3.f, 4.f));
      } else if (mode == 3) {
#pragma unroll
        for (int j = 0; j < 8; ++j) atomicAdd(accf + t * 8 + j, 1.0f);
      } else if (mode == 4) {
        const int head = b * 16 / G;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const long long v = (long long)((b * 7 + t + j) & 255) << 20;
          asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(acc + head * 512 + t * 2 + j), "l"(v) : "memory");
        }
      }
    }
    __syncthreads();
    if (t == 0) {
      red_release(count);
      while (ld_acquire(count) < (unsigned long long)it * G) {}
    }
    __syncthreads();
  }
}

void run_red(const char* name, int sms, unsigned long long* mem, int mode, int contributors) {
  const int iters = 2000;
  cudaFuncSetAttribute(red_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 150 * 1024);
  float best = 1e9;
  for (int r = 0; r < 5; ++r) {
    cudaMemset(mem, 0, 256 * 1024);
    cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
    cudaEventRecord(a);
    red_kernel<<<sms, 256, 150 * 1024>>>(mem, iters, mode, contributors);
    cudaEventRecord(z);
    cudaEventSynchronize(z);
    float ms; cudaEventElapsedTime(&ms, a, z);
    if (ms < best) best = ms;
  }
  printf("%-40s contributors %3d: %.3f us an iteration %s\n", name, contributors, best * 1000 / iters,
         cudaGetErrorString(cudaGetLastError()));
}

// LL exchange (NCCL's low-latency protocol): 8-byte {data, epoch} words,
// no fences. Each block writes `per_block` words; every block polls all
// G * per_block words (16 B a load) until their epochs are this iteration's.
__device__ __forceinline__ void st_ll(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ uint4 ld_ll(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__global__ void __launch_bounds__(256, 1) ll_kernel(uint4* buf, int iters, int per_block, int* bad) {
  extern __shared__ char smem[];
  const int G = gridDim.x, b = blockIdx.x, t = threadIdx.x;
  const int lines = G * per_block / 2;  // 16-byte lines of two words
  unsigned sum = 0;
  for (int it = 1; it <= iters; ++it) {
    uint4* cur = buf + (it & 1) * 65536;
    for (int i = t; i < per_block / 2; i += 256) st_ll(cur + b * (per_block / 2) + i, make_uint4(b + i, it, b + i + 1, it));
    for (int i = t; i < lines; i += 256) {
      uint4 v;
      do { v = ld_ll(cur + i); } while (v.y != unsigned(it) || v.w != unsigned(it));
      sum += v.x + v.z;
    }
    __syncthreads();
  }
  if (sum == 12345u) atomicAdd(bad, 1);
}

// The same exchange with a grid barrier: plain stores, red.release +
// ld.acquire barrier, then ld.cg reads.
__global__ void __launch_bounds__(256, 1) barrier_exchange_kernel(unsigned long long* mem, uint4* buf, int iters, int per_block, int* bad) {
  extern __shared__ char smem[];
  const int G = gridDim.x, b = blockIdx.x, t = threadIdx.x;
  const int lines = G * per_block / 2;
  unsigned sum = 0;
  for (int it = 1; it <= iters; ++it) {
    uint4* cur = buf + (it & 1) * 65536;
    for (int i = t; i < per_block / 2; i += 256) cur[b * (per_block / 2) + i] = make_uint4(b + i, it, b + i + 1, it);
    __syncthreads();
    if (t == 0) {
      red_release(mem);
      while (ld_acquire(mem) < (unsigned long long)it * G) {}
    }
    __syncthreads();
    for (int i = t; i < lines; i += 256) {
      const uint4 v = __ldcg(cur + i);
      if (v.y != unsigned(it)) atomicAdd(bad, 1);
      sum += v.x + v.z;
    }
  }
  if (sum == 12345u) atomicAdd(bad, 1);
}

void run_ll(int sms, int per_block, uint4* buf, unsigned long long* mem, int* bad) {
  const int iters = 2000;
  cudaFuncSetAttribute(ll_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 150 * 1024);
  cudaFuncSetAttribute(barrier_exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 150 * 1024);
  for (int v = 0; v < 2; ++v) {
    float best = 1e9;
    for (int r = 0; r < 5; ++r) {
      cudaMemset(buf, 0, 2 * 65536 * 16);
      cudaMemset(mem, 0, 256 * 1024);
      cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
      cudaEventRecord(a);
      if (v == 0) ll_kernel<<<sms, 256, 150 * 1024>>>(buf, iters, per_block, bad);
      else barrier_exchange_kernel<<<sms, 256, 150 * 1024>>>(mem, buf, iters, per_block, bad);
      cudaEventRecord(z);
      cudaEventSynchronize(z);
      float ms; cudaEventElapsedTime(&ms, a, z);
      if (ms < best) best = ms;
    }
    int h_bad = 0; cudaMemcpy(&h_bad, bad, 4, cudaMemcpyDeviceToHost);
    printf("%-22s grid %3d, %4d words a block (%6d B read a block): %.3f us an exchange (bad %d) %s\n",
           v == 0 ? "LL words" : "barrier + ld.cg", sms, per_block, sms * per_block * 8, best * 1000 / iters, h_bad,
           cudaGetErrorString(cudaGetLastError()));
  }
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp p; cudaGetDeviceProperties(&p, 0); printf("%s, %d SMs\n", p.name, sms);
  unsigned long long* mem; int* bad;
  cudaMalloc(&mem, 256 * 1024); cudaMalloc(&bad, 4); cudaMemset(bad, 0, 4);
  uint4* buf; cudaMalloc(&buf, 2 * 65536 * 16);
  for (int pb : {2, 8, 16, 64}) run_ll(sms, pb, buf, mem, bad);
  run_ll(128, 8, buf, mem, bad);
  run_ll(20, 64, buf, mem, bad);
  run_red("barrier only", sms, mem, 0, sms);
  run_red("u64 red x8 (2048 outputs)", sms, mem, 1, 128);
  run_red("u64 red x8 (2048 outputs)", sms, mem, 1, 64);
  run_red("f32x4 atomicAdd x2 (2048 outputs)", sms, mem, 2, 128);
  run_red("f32 atomicAdd x8 (2048 outputs)", sms, mem, 3, 128);
  run_red("u64 red x2 onto a head's 512 (W_UK)", sms, mem, 4, sms);
  for (int ex = 0; ex < 2; ++ex) {
    for (int g : {sms, 64, 20}) {
      run<0>("red.release + ld.acquire", g, mem, bad, ex);
      run<1>("red.release + ld.relaxed", g, mem, bad, ex);
      run<2>("atom last -> flag", g, mem, bad, ex);
      run<3>("2-level -> flag", g, mem, bad, ex);
      run<4>("acquire + nanosleep", g, mem, bad, ex);
      run<5>("atom last -> 8 flags", g, mem, bad, ex);
    }
  }
}
