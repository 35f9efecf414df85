// cuBLASLt's block-scaled FP8 GEMM (the heuristic's first algorithm, as
// Fp8CublasLtGemm runs it) at M = 4096, back to back for a few seconds, on
// four kinds of operand data: what the sustained rate, SM clock and power
// depend on (docs/perf.md session 22; not part of the build).
// Build here, run on the GPU machine (carry the folder it is built into):
//   nvcc -O3 -arch=sm_90a -o .device-x/fp8_gemm_power scripts/device/fp8_gemm_power.cu -lcublasLt
//   .device-x/fp8_gemm_power <data> <n> <k> <seconds>
// with data 0: zeros, 1: bytes & 0x77 (sign and lowest exponent bit clear),
// 2: uniform bytes (NaN codes nudged), 3: N(0, 1) x 112 rounded to e4m3
// (4 sigma at 448, as make-model's block-quantized weights). Sample
// `nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv -lms 100` beside it.
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace {

// 32 bits of splitmix64 of (seed, i): a counter-based draw.
__device__ unsigned hash(size_t i, unsigned seed) {
  unsigned long long z = (static_cast<unsigned long long>(seed) << 40) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<unsigned>((z ^ (z >> 31)) >> 32);
}

__global__ void fill_e4m3(unsigned char* p, size_t n, int data, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const unsigned v = hash(i, seed);
    unsigned char b = 0;
    if (data == 1) {
      b = (unsigned char)(v & 0x77);
    } else if (data == 2) {
      b = (unsigned char)v;
      if ((b & 0x7f) == 0x7f) b ^= 1;
    } else if (data == 3) {
      const float u1 = float((v >> 8) + 1) / 16777217.0f, u2 = float(hash(i, seed + 7) >> 8) / 16777216.0f;
      const __nv_fp8_e4m3 q(sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2) * 112.0f);
      b = *reinterpret_cast<const unsigned char*>(&q);
    }
    p[i] = b;
  }
}

__global__ void fill_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

void check(int status, const char* what) {
  if (status != 0) {
    std::fprintf(stderr, "%s failed: %d\n", what, status);
    std::exit(1);
  }
}

template <typename T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  check(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), "set attribute");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <data 0-3> <n> <k> <seconds>\n", argv[0]);
    return 2;
  }
  const int data = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]), m = 4096;
  const double seconds = std::atof(argv[4]);
  const size_t ws_bytes = size_t(64) << 20, w_scales = size_t(n / 128 + 1) * (k / 128), x_scales = size_t(m) * (k / 128);
  void *ws, *w, *x, *out;
  float *w_scale, *x_scale;
  check(cudaMalloc(&ws, ws_bytes), "malloc");
  check(cudaMalloc(&w, size_t(n) * k), "malloc");
  check(cudaMalloc(&x, size_t(m) * k), "malloc");
  check(cudaMalloc(&out, size_t(m) * n * 2), "malloc");
  check(cudaMalloc(&w_scale, w_scales * 4), "malloc");
  check(cudaMalloc(&x_scale, x_scales * 4), "malloc");
  fill_e4m3<<<1024, 256>>>(static_cast<unsigned char*>(w), size_t(n) * k, data, 1);
  fill_e4m3<<<1024, 256>>>(static_cast<unsigned char*>(x), size_t(m) * k, data, 2);
  fill_f32<<<256, 256>>>(w_scale, w_scales, 1e-2f);
  fill_f32<<<256, 256>>>(x_scale, x_scales, 1e-2f);

  // As Fp8CublasLtGemm: out^T{N, M} = w{N, K} . x^T{K, M}, 128x128 weight blocks, 1x128 token groups.
  cublasLtHandle_t handle;
  check(cublasLtCreate(&handle), "create");
  cublasLtMatmulDesc_t desc;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  set(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
  set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
  set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scale));
  set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x_scale));
  cublasLtMatrixLayout_t la, lb, ld;
  check(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k), "layout");
  check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k), "layout");
  check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n), "layout");
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                             sizeof(ws_bytes)),
        "preference");
  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, &algo, &found), "heuristic");
  if (found == 0) check(1, "heuristic (no algorithm)");

  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    check(cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, out, ld, out, ld, &algo.algo, ws, ws_bytes, 0),
          "matmul");
  };
  gemm();
  check(cudaDeviceSynchronize(), "sync");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  int iters = 0;
  float total_ms = 0.0f;
  while (total_ms < seconds * 1000.0) {
    cudaEventRecord(start);
    for (int i = 0; i < 20; ++i) gemm();
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    total_ms += ms;
    iters += 20;
  }
  const double us = total_ms * 1000.0 / iters;
  std::printf("data %d n=%d k=%d: %.1f us a GEMM over %d, %.0f TFLOP/s\n", data, n, k, us, iters,
              2.0 * m * n * k / us * 1e-6);
  return 0;
}
