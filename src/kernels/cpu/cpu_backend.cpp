// The CPU reference backend: f32 activations, f32 accumulation, all cores
// (the project's thread pool; OpenBLAS itself runs single-threaded inside
// each task so the two never oversubscribe the cores).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_fp8_kv_cache.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_sampling.h"

namespace mlaserve {
namespace {

void check_f32(const Tensor& t, const char* op, const char* what) {
  MLA_CHECK(t.defined() && t.dtype() == DType::F32 && t.device() == Device::CPU, "{}: {} must be a CPU F32 tensor",
            op, what);
}

void check_i32(const Tensor& t, const char* op, const char* what) {
  MLA_CHECK(t.defined() && t.dtype() == DType::I32, "{}: {} must be an I32 tensor", op, what);
}

// {rows, last dim} of a tensor viewed as a matrix.
int64_t row_count(const Tensor& t) { return t.ndim() == 0 || t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::I32);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() { openblas_set_num_threads(1); }

  Device device() const override { return Device::CPU; }
  std::string name() const override { return fmt::format("cpu ({} threads)", cpu_threads()); }
  DType act_dtype() const override { return DType::F32; }

  Tensor alloc(const Shape& shape, DType dtype) override { return Tensor::empty(shape, dtype); }

  Weight load_weight(const Tensor& w, const Tensor& scale_inv) override {
    MLA_CHECK(w.ndim() == 2, "linear weight must be 2-D, got {}", shape_str(w.shape()));
    if (w.dtype() == DType::F8_E4M3) {
      const int64_t n_blocks = (w.dim(0) + 127) / 128, k_blocks = (w.dim(1) + 127) / 128;
      MLA_CHECK(scale_inv.defined() && scale_inv.dtype() == DType::F32 &&
                    scale_inv.shape() == Shape({n_blocks, k_blocks}),
                "FP8 weight {} needs F32 weight_scale_inv [{}, {}]", shape_str(w.shape()), n_blocks, k_blocks);
    } else {
      MLA_CHECK(w.dtype() == DType::BF16 || w.dtype() == DType::F16 || w.dtype() == DType::F32,
                "linear weight dtype {} not supported", dtype_name(w.dtype()));
    }
    return Weight{w, scale_inv};  // the mmapped view itself: no copy
  }

  Tensor load_tensor(const Tensor& host) override { return host; }

  ExpertWeights load_experts(std::vector<Weight> gate, std::vector<Weight> up, std::vector<Weight> down,
                             std::optional<SharedExpertWeights> shared) override {
    MLA_CHECK(!gate.empty() && gate.size() == up.size() && up.size() == down.size(),
              "experts: {} gate, {} up, {} down weights", gate.size(), up.size(), down.size());
    ExpertWeights out;
    for (size_t e = 0; e < gate.size(); ++e) {
      out.gate.push_back(load_weight(gate[e].w, gate[e].scale_inv));
      out.up.push_back(load_weight(up[e].w, up[e].scale_inv));
      out.down.push_back(load_weight(down[e].w, down[e].scale_inv));
    }
    if (shared) {
      // Run whole (one MLP), the reference for backends that fold it into experts.
      const int64_t I = out.gate[0].out_features(), D = out.gate[0].in_features();
      SharedExpertWeights s{load_weight(shared->gate.w, shared->gate.scale_inv),
                            load_weight(shared->up.w, shared->up.scale_inv),
                            load_weight(shared->down.w, shared->down.scale_inv)};
      const int64_t Is = s.gate.out_features();
      MLA_CHECK(Is > 0 && Is % I == 0 && s.gate.in_features() == D && s.up.w.shape() == s.gate.w.shape() &&
                    s.down.w.shape() == Shape({D, Is}),
                "shared experts: gate {}, up {}, down {} are not one MLP of a multiple of the routed width {} over {}",
                shape_str(s.gate.w.shape()), shape_str(s.up.w.shape()), shape_str(s.down.w.shape()), I, D);
      out.num_shared = int(Is / I);
      out.shared = s;
    }
    return out;
  }

  Tensor to_host(const Tensor& t) override { return t; }
  std::function<Tensor()> to_host_later(const Tensor& t) override {
    Tensor copy = Tensor::empty(t.shape(), t.dtype());  // t may be overwritten before the call
    if (t.nbytes()) std::memcpy(copy.raw(), t.raw(), t.nbytes());
    return [copy] { return copy; };
  }

  DeviceBatch prepare_batch(const ForwardBatch& b) override {
    const int T = b.num_tokens(), B = b.num_seqs();
    MLA_CHECK(B >= 1 && int(b.kv_indptr.size()) == B + 1 && int(b.positions.size()) == T &&
                  int(b.out_slots.size()) == T && b.q_indptr.front() == 0 && b.q_indptr.back() == T &&
                  b.kv_indptr.front() == 0 && b.kv_indptr.back() == int(b.kv_slots.size()),
              "malformed ForwardBatch: {} tokens, {} sequences, q_indptr/kv_indptr/positions/out_slots disagree", T,
              B);
    DeviceBatch d;
    d.num_seqs = B;
    d.num_tokens = T;
    d.num_logit_rows = int(b.logit_rows.size());
    d.is_decode = b.is_decode();
    for (int s = 0; s < B; ++s) {
      int q_len = b.q_indptr[s + 1] - b.q_indptr[s], kv_len = b.kv_indptr[s + 1] - b.kv_indptr[s];
      MLA_CHECK(q_len >= 0 && kv_len >= q_len, "sequence {}: q_len {} and kv_len {} inconsistent", s, q_len, kv_len);
      d.max_q_len = std::max(d.max_q_len, q_len);
      d.max_kv_len = std::max(d.max_kv_len, kv_len);
    }
    for (int32_t r : b.logit_rows) MLA_CHECK(r >= 0 && r < T, "logit row {} outside the batch's {} tokens", r, T);
    d.input_ids = i32_tensor(b.input_ids);
    d.positions = i32_tensor(b.positions);
    d.out_slots = i32_tensor(b.out_slots);
    d.q_indptr = i32_tensor(b.q_indptr);
    d.kv_indptr = i32_tensor(b.kv_indptr);
    d.kv_slots = i32_tensor(b.kv_slots);
    d.logit_rows = i32_tensor(b.logit_rows);
    d.host = b;
    return d;
  }

  void synchronize() override {}

  void embedding(const Tensor& ids, const Tensor& table, Tensor out, const Tensor& picked = {}) override {
    check_i32(ids, "embedding", "ids");
    check_f32(out, "embedding", "out");
    if (picked.defined()) check_i32(picked, "embedding", "picked");
    const int64_t V = table.dim(0), D = table.dim(1);
    MLA_CHECK(out.dim(0) == ids.numel() && out.dim(1) == D, "embedding: out {} for {} ids of width {}",
              shape_str(out.shape()), ids.numel(), D);
    for (int64_t t = 0; t < ids.numel(); ++t) {
      int32_t id = ids.data<int32_t>()[t];
      if (id < 0) {
        MLA_CHECK(picked.defined() && -1 - int64_t(id) < picked.numel(),
                  "token id {} names no picked id ({} picked)", id, picked.defined() ? picked.numel() : 0);
        id = picked.data<int32_t>()[-1 - int64_t(id)];
      }
      MLA_CHECK(id >= 0 && id < V, "token id {} outside the vocabulary [0, {})", id, V);
      cpu::to_f32(table, id * D, D, out.data<float>() + t * D);
    }
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out, Tensor residual) override {
    check_f32(x, "rms_norm", "x");
    check_f32(out, "rms_norm", "out");
    const int64_t D = x.dim(-1), rows = row_count(x);
    MLA_CHECK(w.numel() == D && out.numel() == x.numel(), "rms_norm: x {}, w {}, out {}", shape_str(x.shape()),
              shape_str(w.shape()), shape_str(out.shape()));
    std::vector<float> wf(static_cast<size_t>(D));
    cpu::to_f32(w, 0, D, wf.data());
    if (residual.defined()) {
      check_f32(residual, "rms_norm", "residual");
      MLA_CHECK(residual.numel() == x.numel(), "rms_norm: residual {} vs x {}", shape_str(residual.shape()),
                shape_str(x.shape()));
    }
    parallel_for(rows, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float* src = x.data<float>() + r * D;
        if (residual.defined()) {
          float* res = residual.data<float>() + r * D;
          for (int64_t i = 0; i < D; ++i) res[i] += src[i];
          src = res;
        }
        float ss = 0.0f;
        for (int64_t i = 0; i < D; ++i) ss += src[i] * src[i];
        const float inv = 1.0f / std::sqrt(ss / float(D) + eps);
        float* dst = out.data<float>() + r * D;
        for (int64_t i = 0; i < D; ++i) dst[i] = wf[size_t(i)] * (src[i] * inv);
      }
    });
  }

  void linear(const Tensor& x, const Weight& w, Tensor out) override { linear_f32_out(x, w, out); }

  void linear_f32_out(const Tensor& x, const Weight& w, Tensor out) override {
    check_f32(x, "linear", "x");
    check_f32(out, "linear", "out");
    const int64_t K = w.in_features(), N = w.out_features();
    MLA_CHECK(x.dim(-1) == K && out.dim(-1) == N && row_count(x) == row_count(out),
              "linear: x {} · W{}ᵀ does not fit out {}", shape_str(x.shape()), shape_str(w.w.shape()),
              shape_str(out.shape()));
    cpu::linear(x.data<float>(), K, row_count(x), w, out.data<float>(), N);
  }

  void rope(Tensor x, int offset, const Tensor& positions, const Tensor& inv_freq, float cos_sin_scale) override {
    check_f32(x, "rope", "x");
    check_f32(inv_freq, "rope", "inv_freq");
    check_i32(positions, "rope", "positions");
    const int64_t T = x.dim(0), W = x.dim(-1), F = inv_freq.numel();
    const int64_t per_token = x.numel() / std::max<int64_t>(T, 1) / W;  // heads
    MLA_CHECK(positions.numel() == T && offset >= 0 && offset + 2 * F <= W,
              "rope: x {}, {} positions, rotating [{}, {})", shape_str(x.shape()), positions.numel(), offset,
              offset + 2 * F);
    const float* freq = inv_freq.data<float>();
    parallel_for(T, 4, [&](int64_t b, int64_t e) {
      std::vector<float> cs(size_t(2 * F));
      for (int64_t t = b; t < e; ++t) {
        const float pos = float(positions.data<int32_t>()[t]);
        for (int64_t i = 0; i < F; ++i) {
          const float angle = pos * freq[i];
          cs[size_t(2 * i)] = std::cos(angle) * cos_sin_scale;
          cs[size_t(2 * i + 1)] = std::sin(angle) * cos_sin_scale;
        }
        for (int64_t h = 0; h < per_token; ++h) {
          float* v = x.data<float>() + (t * per_token + h) * W + offset;
          for (int64_t i = 0; i < F; ++i) {
            const float c = cs[size_t(2 * i)], s = cs[size_t(2 * i + 1)];
            const float a = v[2 * i], bb = v[2 * i + 1];
            v[2 * i] = a * c - bb * s;
            v[2 * i + 1] = bb * c + a * s;
          }
        }
      }
    });
  }

  void silu_and_mul(const Tensor& gate, const Tensor& up, Tensor out) override {
    check_f32(gate, "silu_and_mul", "gate");
    check_f32(up, "silu_and_mul", "up");
    check_f32(out, "silu_and_mul", "out");
    MLA_CHECK(gate.shape() == up.shape() && up.numel() == out.numel(), "silu_and_mul: gate {}, up {}, out {}",
              shape_str(gate.shape()), shape_str(up.shape()), shape_str(out.shape()));
    const float* g = gate.data<float>();
    const float* u = up.data<float>();
    float* o = out.data<float>();
    parallel_for(out.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    });
  }

  void silu_and_mul_gate_up(const Tensor& gate_up, Tensor out) override {
    check_f32(gate_up, "silu_and_mul_gate_up", "gate_up");
    check_f32(out, "silu_and_mul_gate_up", "out");
    const int64_t I = out.dim(-1), rows = row_count(out);
    MLA_CHECK(gate_up.dim(-1) == 2 * I && row_count(gate_up) == rows, "silu_and_mul_gate_up: gate_up {} for out {}",
              shape_str(gate_up.shape()), shape_str(out.shape()));
    const float* gu = gate_up.data<float>();
    float* o = out.data<float>();
    parallel_for(rows * I, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float g = gu[(i / I) * 2 * I + i % I], u = gu[(i / I) * 2 * I + I + i % I];
        o[i] = g / (1.0f + std::exp(-g)) * u;
      }
    });
  }

  void add(Tensor y, const Tensor& x) override {
    check_f32(y, "add", "y");
    check_f32(x, "add", "x");
    MLA_CHECK(x.numel() == y.numel(), "add: {} vs {}", shape_str(y.shape()), shape_str(x.shape()));
    float* yp = y.data<float>();
    const float* xp = x.data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) yp[i] += xp[i];
  }

  void copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t n) override {
    MLA_CHECK(src.dtype() == dst.dtype(), "copy_columns: dtype {} to {}", dtype_name(src.dtype()),
              dtype_name(dst.dtype()));
    const int64_t rows = row_count(src), sw = src.dim(-1), dw = dst.dim(-1);
    MLA_CHECK(rows == row_count(dst) && src_col >= 0 && dst_col >= 0 && src_col + n <= sw && dst_col + n <= dw,
              "copy_columns: {} columns from {} at {} into {} at {}", n, shape_str(src.shape()), src_col,
              shape_str(dst.shape()), dst_col);
    const size_t es = dtype_size(src.dtype());
    const char* s = static_cast<const char*>(src.raw());
    char* d = static_cast<char*>(dst.raw());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(d + size_t(r * dw + dst_col) * es, s + size_t(r * sw + src_col) * es, size_t(n) * es);
  }

  void scatter_rows(Tensor cache, const Tensor& rows, const Tensor& slots) override {
    check_i32(slots, "scatter_rows", "slots");
    if (cache.dtype() == DType::U8) return scatter_fp8_rows(cache, rows, slots);
    const int64_t W = cache.dim(1), S = cache.dim(0);
    MLA_CHECK(rows.dtype() == cache.dtype() && rows.dim(-1) == W && row_count(rows) == slots.numel(),
              "scatter_rows: rows {} into cache {} at {} slots", shape_str(rows.shape()), shape_str(cache.shape()),
              slots.numel());
    const size_t row_bytes = size_t(W) * dtype_size(cache.dtype());
    for (int64_t i = 0; i < slots.numel(); ++i) {
      int32_t s = slots.data<int32_t>()[i];
      MLA_CHECK(s >= 0 && s < S, "scatter_rows: slot {} outside the cache's {} slots", s, S);
      std::memcpy(static_cast<char*>(cache.raw()) + size_t(s) * row_bytes,
                  static_cast<const char*>(rows.raw()) + size_t(i) * row_bytes, row_bytes);
    }
  }

  void gather_rows(const Tensor& cache, const Tensor& slots, Tensor out) override {
    check_i32(slots, "gather_rows", "slots");
    if (cache.dtype() == DType::U8) return gather_fp8_rows(cache, slots, out);
    const int64_t W = cache.dim(-1), S = row_count(cache);
    MLA_CHECK(out.dtype() == cache.dtype() && out.dim(-1) == W && row_count(out) == slots.numel(),
              "gather_rows: {} slots of {} into {}", slots.numel(), shape_str(cache.shape()), shape_str(out.shape()));
    const size_t row_bytes = size_t(W) * dtype_size(cache.dtype());
    for (int64_t i = 0; i < slots.numel(); ++i) {
      int32_t s = slots.data<int32_t>()[i];
      MLA_CHECK(s >= 0 && s < S, "gather_rows: slot {} outside the {} rows", s, S);
      std::memcpy(static_cast<char*>(out.raw()) + size_t(i) * row_bytes,
                  static_cast<const char*>(cache.raw()) + size_t(s) * row_bytes, row_bytes);
    }
  }

  void head_bmm(const Tensor& x, const Weight& weight, bool transpose_w, Tensor out) override {
    const Tensor& w = weight.w;
    check_f32(x, "head_bmm", "x");
    check_f32(out, "head_bmm", "out");
    const int64_t T = x.dim(0), H = x.dim(1), Kx = x.dim(2);
    const int64_t K = transpose_w ? w.dim(2) : w.dim(1), N = transpose_w ? w.dim(1) : w.dim(2);
    MLA_CHECK(w.ndim() == 3 && w.dim(0) == H && K <= Kx && out.ndim() == 3 && out.dim(0) == T && out.dim(1) == H &&
                  out.dim(2) >= N,
              "head_bmm: x {} · w {} (transposed: {}) into {}", shape_str(x.shape()), shape_str(w.shape()),
              transpose_w, shape_str(out.shape()));
    const bool fp8 = weight.is_fp8();
    if (fp8) {
      MLA_CHECK(transpose_w && weight.scale_inv.dtype() == DType::F32 &&
                    weight.scale_inv.shape() == Shape({(H * N + 127) / 128, (K + 127) / 128}),
                "head_bmm: FP8 w {} needs the transposed form and F32 scales [{}, {}]", shape_str(w.shape()),
                (H * N + 127) / 128, (K + 127) / 128);
    } else {
      check_f32(w, "head_bmm", "w");
    }
    const int64_t No = out.dim(2);
    parallel_for(H, 1, [&](int64_t b, int64_t e) {
      std::vector<float> dequantized(fp8 ? size_t(N * K) : 0);
      for (int64_t h = b; h < e; ++h) {
        const float* wh = fp8 ? dequantized.data() : w.data<float>() + h * K * N;
        if (fp8) {  // rows h * N .. of {H * N, K}, each value times its 128x128 block's scale
          const float* scale = weight.scale_inv.data<float>();
          const int64_t kb = weight.scale_inv.dim(1);
          for (int64_t n = 0; n < N; ++n) {
            const int64_t row = h * N + n;
            for (int64_t k = 0; k < K; ++k)
              dequantized[size_t(n * K + k)] =
                  fp8e4m3_to_f32(w.data<uint8_t>()[row * K + k]) * scale[(row / 128) * kb + k / 128];
          }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_w ? CblasTrans : CblasNoTrans, int(T), int(N), int(K),
                    1.0f, x.data<float>() + h * Kx, int(H * Kx), wh, transpose_w ? int(K) : int(N), 0.0f,
                    out.data<float>() + h * No, int(H * No));
      }
    });
  }

  void mla_prepare(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                   float cos_sin_scale) override {
    cpu::mla_prepare(p, positions, out_slots, inv_freq, cos_sin_scale);
  }

  void mla_attention_absorbed(const Tensor& q, const Tensor& cache, const DeviceBatch& batch, float scale,
                              Tensor out) override {
    check_f32(q, "mla_attention_absorbed", "q");
    check_f32(out, "mla_attention_absorbed", "out");
    if (cache.dtype() == DType::U8) {
      // FP8 cache: the batch's kv rows dequantized in kv_slots order, then
      // the same attention over slots 0 .. Lk - 1.
      const int64_t Lk = int64_t(batch.host.kv_slots.size());
      Tensor rows = alloc({Lk, q.dim(2)}, DType::F32);
      Tensor slots = Tensor::wrap(const_cast<int32_t*>(batch.host.kv_slots.data()), {Lk}, DType::I32, Device::CPU);
      gather_fp8_rows(cache, slots, rows);
      ForwardBatch dense = batch.host;
      std::iota(dense.kv_slots.begin(), dense.kv_slots.end(), 0);
      cpu::mla_attention_absorbed(q, rows, dense, scale, out);
      return;
    }
    check_f32(cache, "mla_attention_absorbed", "cache");
    cpu::mla_attention_absorbed(q, cache, batch.host, scale, out);
  }

  void mla_attention_expanded(const Tensor& q, const Tensor& kv, const Tensor& k_pe, const DeviceBatch& batch,
                              float scale, Tensor out) override {
    check_f32(q, "mla_attention_expanded", "q");
    check_f32(kv, "mla_attention_expanded", "kv");
    check_f32(k_pe, "mla_attention_expanded", "k_pe");
    check_f32(out, "mla_attention_expanded", "out");
    cpu::mla_attention_expanded(q, kv, k_pe, batch.host, scale, out);
  }

  void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor topk_ids,
                 Tensor topk_weights) override {
    check_i32(topk_ids, "moe_route", "topk_ids");
    check_f32(topk_weights, "moe_route", "topk_weights");
    cpu::moe_route(logits, bias, p, topk_ids, topk_weights);
  }

  void moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids, const Tensor& topk_weights,
                   Tensor out) override {
    check_f32(x, "moe_experts", "x");
    check_f32(out, "moe_experts", "out");
    cpu::moe_experts(x, experts, topk_ids, topk_weights, out);
  }

  // The fused ops run as the compositions they stand for: the reference.
  void rms_norm_linears(const Tensor& x, const Tensor& norm_w, float eps, Tensor residual,
                        const std::vector<LinearTarget>& targets) override {
    Backend::rms_norm_linears(x, norm_w, eps, residual, targets);
  }
  void silu_and_mul_linear(const Tensor& gate_up, const Weight& w, Tensor out) override {
    Backend::silu_and_mul_linear(gate_up, w, out);
  }
  void head_bmm_linear(const Tensor& x, const Weight& w, bool transpose_w, const Weight& proj, Tensor out) override {
    Backend::head_bmm_linear(x, w, transpose_w, proj, out);
  }
  void mla_prepare_q_b(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                       float cos_sin_scale, const Weight& q_b, Tensor q) override {
    Backend::mla_prepare_q_b(p, positions, out_slots, inv_freq, cos_sin_scale, q_b, q);
  }
  void rms_norm_linear_mla_prepare_q_b(const ResidualNorm& in, const Weight& w, const MlaPrepare& p,
                                       const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                                       float cos_sin_scale, const Weight& q_b, Tensor q) override {
    Backend::rms_norm_linear_mla_prepare_q_b(in, w, p, positions, out_slots, inv_freq, cos_sin_scale, q_b, q);
  }
  void mla_prepare_head_bmm(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                            const Tensor& inv_freq, float cos_sin_scale, const Tensor& x, const Weight& w,
                            bool transpose_w, Tensor out) override {
    Backend::mla_prepare_head_bmm(p, positions, out_slots, inv_freq, cos_sin_scale, x, w, transpose_w, out);
  }
  bool mla_decode_chain(const MlaDecodeChain& chain, const DeviceBatch& batch, Tensor out) override {
    return Backend::mla_decode_chain(chain, batch, out);
  }
  Tensor mla_chain_router_fold(const Weight& router, const Tensor& norm_weight, const Weight& o_proj) override {
    return Backend::mla_chain_router_fold(router, norm_weight, o_proj);
  }
  void mla_attention_expanded_linear(const Tensor& q, const Tensor& kv, const Tensor& k_pe, const DeviceBatch& batch,
                                     float scale, const Weight& w, Tensor out) override {
    Backend::mla_attention_expanded_linear(q, kv, k_pe, batch, scale, w, out);
  }
  void moe_select(const Tensor& h, const Weight& router, const Tensor& bias, const RouterParams& p, Tensor topk_ids,
                  Tensor topk_weights) override {
    Backend::moe_select(h, router, bias, p, topk_ids, topk_weights);
  }
  void rms_norm_moe_select(const ResidualNorm& in, Tensor normed, const Weight& router, const Tensor& bias,
                           const RouterParams& p, Tensor topk_ids, Tensor topk_weights) override {
    Backend::rms_norm_moe_select(in, normed, router, bias, p, topk_ids, topk_weights);
  }
  void moe_route_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits, const Tensor& bias,
                         const RouterParams& p, Tensor topk_ids, Tensor topk_weights, Tensor out,
                         const PendingNorm* pending) override {
    Backend::moe_route_experts(x, experts, logits, bias, p, topk_ids, topk_weights, out, pending);
  }

  void argmax_rows(const Tensor& logits, Tensor ids) override {
    check_f32(logits, "argmax_rows", "logits");
    check_i32(ids, "argmax_rows", "ids");
    MLA_CHECK(logits.ndim() == 2 && logits.dim(1) > 0 && ids.numel() == logits.dim(0),
              "argmax_rows: {} ids for logits {}", ids.numel(), shape_str(logits.shape()));
    const int64_t V = logits.dim(1);
    for (int64_t r = 0; r < logits.dim(0); ++r) {
      const float* row = logits.data<float>() + r * V;
      ids.data<int32_t>()[r] = int32_t(std::max_element(row, row + V) - row);  // first of equal maxima
    }
  }

  void sample_rows(const Tensor& logits, const std::vector<RowSampling>& rows, Tensor ids) override {
    check_f32(logits, "sample_rows", "logits");
    check_i32(ids, "sample_rows", "ids");
    MLA_CHECK(logits.ndim() == 2 && logits.dim(1) > 0 && ids.numel() == logits.dim(0) &&
                  int64_t(rows.size()) == logits.dim(0),
              "sample_rows: {} ids and {} settings for logits {}", ids.numel(), rows.size(), shape_str(logits.shape()));
    const int64_t V = logits.dim(1);
    parallel_for(logits.dim(0), 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        ids.data<int32_t>()[r] = cpu::sample_row(logits.data<float>() + r * V, V, rows[size_t(r)]);
    });
  }

 private:
  // FP8 cache (U8 {S, slot_bytes}) <-> f32 rows {n, L + R}: the layout follows
  // from the row width and the slot size.
  static Fp8KvLayout fp8_layout_of(const Tensor& cache, const Tensor& rows, const char* op) {
    MLA_CHECK(cache.ndim() == 2 && rows.dtype() == DType::F32 && rows.device() == Device::CPU,
              "{}: an FP8 cache {} needs CPU F32 rows, got {} {}", op, shape_str(cache.shape()),
              dtype_name(rows.dtype()), shape_str(rows.shape()));
    return fp8_kv_layout_for(rows.dim(-1), cache.dim(1));
  }
  static void scatter_fp8_rows(Tensor cache, const Tensor& rows, const Tensor& slots) {
    const Fp8KvLayout l = fp8_layout_of(cache, rows, "scatter_rows");
    MLA_CHECK(row_count(rows) == slots.numel(), "scatter_rows: {} rows at {} slots", row_count(rows), slots.numel());
    for (int64_t i = 0; i < slots.numel(); ++i) {
      const int32_t s = slots.data<int32_t>()[i];
      MLA_CHECK(s >= 0 && s < cache.dim(0), "scatter_rows: slot {} outside the cache's {} slots", s, cache.dim(0));
      cpu::fp8_kv_store_row(rows.data<float>() + i * l.row_width(), l, cache.data<uint8_t>() + s * l.slot_bytes());
    }
  }
  static void gather_fp8_rows(const Tensor& cache, const Tensor& slots, Tensor out) {
    const Fp8KvLayout l = fp8_layout_of(cache, out, "gather_rows");
    MLA_CHECK(row_count(out) == slots.numel(), "gather_rows: {} slots into {}", slots.numel(), shape_str(out.shape()));
    for (int64_t i = 0; i < slots.numel(); ++i) {
      const int32_t s = slots.data<int32_t>()[i];
      MLA_CHECK(s >= 0 && s < cache.dim(0), "gather_rows: slot {} outside the {} rows", s, cache.dim(0));
      cpu::fp8_kv_load_row(cache.data<uint8_t>() + s * l.slot_bytes(), l, out.data<float>() + i * l.row_width());
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace mlaserve
