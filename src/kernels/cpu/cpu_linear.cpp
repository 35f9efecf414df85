// Linear layers on the CPU: weights stay in their checkpoint dtype (an mmapped
// view, never a second full copy) and are expanded to f32 on the fly:
// - a few rows of x (decode): each weight row is converted 16 values at a
//   time into registers and dotted with every x row at once, so the weights
//   stream through memory exactly once (decode is bandwidth bound);
// - many rows (prefill): each thread converts a tile of 64 weight rows
//   (block-FP8 times its 128x128 scales) into a thread-local f32 buffer and
//   multiplies it with OpenBLAS sgemm, which is compute bound and fast there.
#include <cblas.h>

#include <array>
#include <bit>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace mlaserve::cpu {
namespace {

constexpr int64_t kTileRows = 64;
constexpr int64_t kFp8Block = 128;

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table;
}

// Row n's values from k0 on as f32 (the part that does not fill a chunk).
void weight_row_tail(const Weight& w, int64_t n, int64_t k0, float* dst) {
  std::vector<float> row(static_cast<size_t>(w.in_features()));
  weight_rows_f32(w, n, n + 1, row.data());
  std::copy(row.begin() + k0, row.end(), dst);
}

// Fixed-width chunks (no epilogue) so the compiler vectorizes them at -O2.
constexpr int kChunk = 16;
static_assert(kFp8Block % kChunk == 0, "an FP8 scale block holds whole chunks");
// Up to this many rows of x take the streaming path.
constexpr int kMaxStreamingRows = 4;

// Weight row `n`, elements [k, k + kChunk), as f32.
inline void weight_chunk_f32(const Weight& w, int64_t n, int64_t k, float* dst) {
  const int64_t K = w.in_features();
  switch (w.w.dtype()) {
    case DType::BF16: {
      const uint16_t* src = w.w.data<uint16_t>() + n * K + k;
      for (int j = 0; j < kChunk; ++j) dst[j] = std::bit_cast<float>(uint32_t(src[j]) << 16);
      return;
    }
    case DType::F8_E4M3: {
      const auto& table = fp8_table();
      const uint8_t* src = w.w.data<uint8_t>() + n * K + k;
      const float scale = w.scale_inv.data<float>()[(n / kFp8Block) * w.scale_inv.dim(1) + k / kFp8Block];
      for (int j = 0; j < kChunk; ++j) dst[j] = table[src[j]] * scale;
      return;
    }
    case DType::F32: {
      const float* src = w.w.data<float>() + n * K + k;
      for (int j = 0; j < kChunk; ++j) dst[j] = src[j];
      return;
    }
    default:
      to_f32(w.w, n * K + k, kChunk, dst);
  }
}

// The bf16 case of the streaming path (every non-FP8 checkpoint, and the
// embeddings and lm_head of FP8 ones): out[t, n] = x[t] · W[n][:K_full] for
// rows [n0, n1). Cloned per ISA (resolved once at load time) so the chunk
// loops run on 16-wide AVX-512 or 8-wide AVX2+FMA where the CPU has them.
__attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
void bf16_rows_dot(const float* x, int64_t ldx, int T, const uint16_t* w, int64_t K, int64_t K_full, int64_t n0,
                   int64_t n1, float* out, int64_t ldo) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* row = w + n * K;
    float acc[kMaxStreamingRows][kChunk] = {};
    for (int64_t k = 0; k < K_full; k += kChunk) {
      float wc[kChunk];
      for (int j = 0; j < kChunk; ++j) wc[j] = std::bit_cast<float>(uint32_t(row[k + j]) << 16);
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < kChunk; ++j) acc[t][j] += x[t * ldx + k + j] * wc[j];
    }
    for (int t = 0; t < T; ++t) {
      float s = 0.0f;
      for (int j = 0; j < kChunk; ++j) s += acc[t][j];
      out[t * ldo + n] = s;
    }
  }
}

// out[t, n] = x[t] · W[n] for T <= kMaxStreamingRows rows of x, weights read once.
void linear_streaming(const float* x, int64_t ldx, int T, const Weight& w, float* out, int64_t ldo) {
  const int64_t N = w.out_features(), K = w.in_features(), K_full = K / kChunk * kChunk;
  parallel_for(N, 64, [&](int64_t n0, int64_t n1) {
    if (w.w.dtype() == DType::BF16) {
      bf16_rows_dot(x, ldx, T, w.w.data<uint16_t>(), K, K_full, n0, n1, out, ldo);
    } else {
      for (int64_t n = n0; n < n1; ++n) {
        float acc[kMaxStreamingRows][kChunk] = {};
        float wc[kChunk];
        for (int64_t k = 0; k < K_full; k += kChunk) {
          weight_chunk_f32(w, n, k, wc);
          for (int t = 0; t < T; ++t)
            for (int j = 0; j < kChunk; ++j) acc[t][j] += x[t * ldx + k + j] * wc[j];
        }
        for (int t = 0; t < T; ++t) {
          float s = 0.0f;
          for (int j = 0; j < kChunk; ++j) s += acc[t][j];
          out[t * ldo + n] = s;
        }
      }
    }
    if (K_full == K) return;
    std::vector<float> tail(static_cast<size_t>(K - K_full));
    for (int64_t n = n0; n < n1; ++n) {
      weight_row_tail(w, n, K_full, tail.data());
      for (int t = 0; t < T; ++t)
        for (int64_t k = K_full; k < K; ++k) out[t * ldo + n] += x[t * ldx + k] * tail[size_t(k - K_full)];
    }
  });
}

}  // namespace

void to_f32(const Tensor& t, int64_t offset, int64_t n, float* out) {
  MLA_CHECK(offset >= 0 && offset + n <= t.numel(), "to_f32: range [{}, {}) outside tensor of {} elements",
            offset, offset + n, t.numel());
  switch (t.dtype()) {
    case DType::F32: {
      const float* p = t.data<float>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    case DType::BF16: {
      const uint16_t* p = t.data<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* p = t.data<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      fail("to_f32: unsupported dtype {} (expected F32, BF16 or F16)", dtype_name(t.dtype()));
  }
}

void weight_rows_f32(const Weight& w, int64_t n0, int64_t n1, float* out) {
  const int64_t K = w.in_features();
  if (!w.is_fp8()) {
    to_f32(w.w, n0 * K, (n1 - n0) * K, out);
    return;
  }
  const auto& table = fp8_table();
  const uint8_t* q = w.w.data<uint8_t>();
  const float* scale = w.scale_inv.data<float>();
  const int64_t scale_cols = w.scale_inv.dim(1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * K;
    const float* row_scale = scale + (n / kFp8Block) * scale_cols;
    float* dst = out + (n - n0) * K;
    for (int64_t k = 0; k < K; ++k) dst[k] = table[row[k]] * row_scale[k / kFp8Block];
  }
}

void linear(const float* x, int64_t ldx, int64_t T, const Weight& w, float* out, int64_t ldo) {
  const int64_t N = w.out_features(), K = w.in_features();
  if (T == 0 || N == 0) return;
  if (T <= kMaxStreamingRows) return linear_streaming(x, ldx, int(T), w, out, ldo);
  if (w.w.dtype() == DType::F32) {
    // Already f32: one sgemm per row tile, no conversion.
    const float* wp = w.w.data<float>();
    parallel_for((N + kTileRows - 1) / kTileRows, 1, [&](int64_t b, int64_t e) {
      for (int64_t tile = b; tile < e; ++tile) {
        int64_t n0 = tile * kTileRows, rows = std::min(kTileRows, N - n0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(rows), int(K), 1.0f, x, int(ldx),
                    wp + n0 * K, int(K), 0.0f, out + n0, int(ldo));
      }
    });
    return;
  }
  parallel_for((N + kTileRows - 1) / kTileRows, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> tile_f32;
    tile_f32.resize(size_t(kTileRows * K));
    for (int64_t tile = b; tile < e; ++tile) {
      int64_t n0 = tile * kTileRows, rows = std::min(kTileRows, N - n0);
      weight_rows_f32(w, n0, n0 + rows, tile_f32.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(rows), int(K), 1.0f, x, int(ldx),
                  tile_f32.data(), int(K), 0.0f, out + n0, int(ldo));
    }
  });
}

}  // namespace mlaserve::cpu
