// MLA attention on the CPU, both forms, one (token, head) pair per task:
// scores in f32 against the token's causal window of kv rows, a max-shifted
// softmax, then the weighted sum of values.
#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace mlaserve::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// For new token row t: its sequence's kv range start (index into kv_slots)
// and how many kv tokens it may see (its prefix plus itself).
struct CausalWindow {
  int64_t kv_begin;
  int64_t count;
};

std::vector<CausalWindow> causal_windows(const ForwardBatch& b) {
  std::vector<CausalWindow> w(size_t(b.num_tokens()));
  for (int s = 0; s < b.num_seqs(); ++s) {
    int64_t q_len = b.q_indptr[s + 1] - b.q_indptr[s];
    int64_t kv_len = b.kv_indptr[s + 1] - b.kv_indptr[s];
    MLA_CHECK(kv_len >= q_len, "sequence {}: kv_len {} < q_len {}", s, kv_len, q_len);
    for (int64_t i = 0; i < q_len; ++i) w[size_t(b.q_indptr[s] + i)] = {b.kv_indptr[s], kv_len - q_len + i + 1};
  }
  return w;
}

// probs[j] = softmax(scores)[j], in place.
void softmax_inplace(float* scores, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, scores[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - m);
    sum += scores[j];
  }
  for (int64_t j = 0; j < n; ++j) scores[j] /= sum;
}

}  // namespace

void mla_attention_absorbed(const Tensor& q, const Tensor& cache, const ForwardBatch& batch, float scale,
                            Tensor out) {
  const int64_t T = q.dim(0), H = q.dim(1), W = q.dim(2), L = out.dim(2);
  MLA_CHECK(cache.dim(1) == W && W > L, "mla_attention_absorbed: q width {} vs cache width {}, latent {}", W,
            cache.dim(1), L);
  const auto windows = causal_windows(batch);
  const float* qp = q.data<float>();
  const float* cp = cache.data<float>();
  float* op = out.data<float>();
  parallel_for(T * H, 1, [&](int64_t b, int64_t e) {
    std::vector<float> probs;
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / H;
      const CausalWindow win = windows[size_t(t)];
      const float* qrow = qp + th * W;
      probs.resize(size_t(win.count));
      for (int64_t j = 0; j < win.count; ++j)
        probs[size_t(j)] = dot(qrow, cp + int64_t(batch.kv_slots[size_t(win.kv_begin + j)]) * W, W) * scale;
      softmax_inplace(probs.data(), win.count);
      float* o = op + th * L;
      std::fill(o, o + L, 0.0f);
      for (int64_t j = 0; j < win.count; ++j) {
        const float* c_kv = cp + int64_t(batch.kv_slots[size_t(win.kv_begin + j)]) * W;
        const float p = probs[size_t(j)];
        for (int64_t l = 0; l < L; ++l) o[l] += p * c_kv[l];
      }
    }
  });
}

void mla_attention_expanded(const Tensor& q, const Tensor& kv, const Tensor& k_pe, const ForwardBatch& batch,
                            float scale, Tensor out) {
  const int64_t T = q.dim(0), H = q.dim(1), Dq = q.dim(2), R = k_pe.dim(1), Dn = Dq - R;
  const int64_t Dkv = kv.dim(2), Dv = out.dim(2);
  MLA_CHECK(Dkv == Dn + Dv && kv.dim(1) == H, "mla_attention_expanded: kv {} does not match q {} and out {}",
            shape_str(kv.shape()), shape_str(q.shape()), shape_str(out.shape()));
  const auto windows = causal_windows(batch);
  const float* qp = q.data<float>();
  const float* kvp = kv.data<float>();
  const float* pep = k_pe.data<float>();
  float* op = out.data<float>();
  parallel_for(T * H, 1, [&](int64_t b, int64_t e) {
    std::vector<float> probs;
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / H, h = th % H;
      const CausalWindow win = windows[size_t(t)];
      const float* qrow = qp + th * Dq;
      probs.resize(size_t(win.count));
      for (int64_t j = 0; j < win.count; ++j) {
        const int64_t r = win.kv_begin + j;  // kv row, in kv_slots order
        probs[size_t(j)] = (dot(qrow, kvp + (r * H + h) * Dkv, Dn) + dot(qrow + Dn, pep + r * R, R)) * scale;
      }
      softmax_inplace(probs.data(), win.count);
      float* o = op + th * Dv;
      std::fill(o, o + Dv, 0.0f);
      for (int64_t j = 0; j < win.count; ++j) {
        const float* v = kvp + ((win.kv_begin + j) * H + h) * Dkv + Dn;
        const float p = probs[size_t(j)];
        for (int64_t d = 0; d < Dv; ++d) o[d] += p * v[d];
      }
    }
  });
}

}  // namespace mlaserve::cpu
