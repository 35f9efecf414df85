// Backend::mla_prepare on host f32 activations: each part as a plain loop
// with rms_norm's and rope's arithmetic.
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_fp8_kv_cache.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/mla_prepare_dims.h"

namespace mlaserve::cpu {
namespace {

const float* f32_row(const Tensor& t, int64_t row) { return t.data<float>() + row * t.dim(-1); }

void check_f32_act(const Tensor& t, const char* what) {
  MLA_CHECK(t.dtype() == DType::F32 && t.device() == Device::CPU, "mla_prepare: {} must be a CPU F32 tensor", what);
}

// out[i] = w[i] * (x[i] / sqrt(mean(x²) + eps)), as CpuBackend::rms_norm.
void rms_norm_row(const float* x, const std::vector<float>& w, float eps, float* out) {
  const int64_t n = int64_t(w.size());
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[size_t(i)] * (x[i] * inv);
}

// out pairs = src pairs rotated by cs = {cos, sin} per frequency (may alias).
void rope_pairs(const float* src, const std::vector<float>& cs, float* out) {
  for (size_t i = 0; i < cs.size() / 2; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1], a = src[2 * i], b = src[2 * i + 1];
    out[2 * i] = a * c - b * s;
    out[2 * i + 1] = b * c + a * s;
  }
}

}  // namespace

void mla_prepare(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                 float cos_sin_scale) {
  const MlaPrepareDims d = check_mla_prepare(p, positions, out_slots, inv_freq);
  MLA_CHECK(inv_freq.device() == Device::CPU && positions.device() == Device::CPU,
            "mla_prepare: positions and inv_freq must be on the CPU");
  std::vector<float> kv_norm, q_a_norm;
  if (d.latent_write) {
    check_f32_act(p.kv, "kv");
    if (p.cache.dtype() != DType::U8) check_f32_act(p.cache, "cache");  // U8: an FP8 cache (shape checked)
    kv_norm.resize(size_t(d.latent));
    to_f32(p.kv_norm, 0, d.latent, kv_norm.data());
    for (int64_t t = 0; t < d.tokens; ++t) {
      const int32_t s = out_slots.data<int32_t>()[t];
      MLA_CHECK(s >= 0 && s < p.cache.dim(0), "mla_prepare: slot {} outside the cache's {} slots", s,
                p.cache.dim(0));
    }
  }
  if (d.q_a_norm) {
    check_f32_act(p.q_a, "q_a");
    check_f32_act(p.q_a_out, "q_a_out");
    q_a_norm.resize(size_t(d.q_a));
    to_f32(p.q_a_norm, 0, d.q_a, q_a_norm.data());
  }
  if (d.q_split) {
    check_f32_act(p.q, "q");
    check_f32_act(p.q_pe_out, "q_pe_out");
    if (p.q_nope_out.defined()) check_f32_act(p.q_nope_out, "q_nope_out");
  }
  const int64_t R = d.rope, F = R / 2, Dn = d.nope;
  const bool fp8_cache = d.latent_write && p.cache.dtype() == DType::U8;
  const Fp8KvLayout fp8_layout{int(d.latent), int(R)};
  const float* freq = inv_freq.data<float>();
  parallel_for(d.tokens, 4, [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(R));
    std::vector<float> fp8_row(fp8_cache ? size_t(d.latent + R) : 0);  // the row before quantization
    for (int64_t t = b; t < e; ++t) {
      const float pos = float(positions.data<int32_t>()[t]);
      for (int64_t i = 0; i < F; ++i) {
        const float angle = pos * freq[i];
        cs[size_t(2 * i)] = std::cos(angle) * cos_sin_scale;
        cs[size_t(2 * i + 1)] = std::sin(angle) * cos_sin_scale;
      }
      if (d.latent_write) {
        const float* src = f32_row(p.kv, t) + p.kv_col;
        const int64_t slot = out_slots.data<int32_t>()[t];
        float* row = fp8_cache ? fp8_row.data() : p.cache.data<float>() + slot * (d.latent + R);
        rms_norm_row(src, kv_norm, p.eps, row);
        rope_pairs(src + d.latent, cs, row + d.latent);
        if (fp8_cache) fp8_kv_store_row(row, fp8_layout, p.cache.data<uint8_t>() + slot * fp8_layout.slot_bytes());
      }
      if (d.q_a_norm)
        rms_norm_row(f32_row(p.q_a, t) + p.q_a_col, q_a_norm, p.eps, p.q_a_out.data<float>() + t * d.q_a);
      if (d.q_split) {
        for (int64_t h = 0; h < d.heads; ++h) {
          const float* head = f32_row(p.q, t) + p.q_col + h * (Dn + R);
          if (p.q_nope_out.defined()) {
            float* nope = p.q_nope_out.data<float>() + (t * d.heads + h) * p.q_nope_out.dim(2);
            if (nope != head)
              for (int64_t i = 0; i < Dn; ++i) nope[i] = head[i];
          }
          rope_pairs(head + Dn, cs, p.q_pe_out.data<float>() + (t * d.heads + h) * p.q_pe_out.dim(2) + p.q_pe_col);
        }
      }
    }
  });
}

}  // namespace mlaserve::cpu
