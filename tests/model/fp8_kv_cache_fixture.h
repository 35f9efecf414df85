#pragma once
// FP8 latent cache against the activation-dtype cache on one backend, over
// the golden tiny checkpoints (tests/data/model/*.json): the logits of every
// decode step (teacher-forced with transformers' greedy tokens) with each
// cache, and each cache's own greedy continuation against transformers'.
// Prompt prefill runs the expanded MLA form (its cached rows come back
// through gather_rows), decode steps the absorbed form over the cache.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "model_fixture.h"

namespace mlaserve::testing {

inline nlohmann::json load_model_golden(const std::string& name) {
  const auto path = std::filesystem::path(MLASERVE_SOURCE_DIR) / "tests/data/model" / (name + ".json");
  std::ifstream f(path);
  if (!f) throw std::runtime_error("missing golden file " + path.string());
  return nlohmann::json::parse(f);
}

// Logits rows predicting greedy[0 ..] after the prompt, feeding transformers'
// greedy tokens one step at a time.
inline Logits teacher_forced_decode_logits(DeepseekModel& model, const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& greedy, KvCacheDtype kv) {
  Backend& be = model.backend();
  auto cache = allocate_kv_cache(be, model.config(), int(prompt.size() + greedy.size()), kv);
  Logits out = to_logits(be, model.forward(contiguous_sequence_batch(prompt, 0, false), cache));
  for (size_t i = 0; i + 1 < greedy.size(); ++i) {
    const Logits step = to_logits(
        be, model.forward(contiguous_sequence_batch({&greedy[i], 1}, int32_t(prompt.size() + i), false), cache));
    out.rows += 1;
    out.v.insert(out.v.end(), step.v.begin(), step.v.end());
  }
  return out;
}

// The model's own greedy continuation of n tokens.
inline std::vector<int32_t> greedy_continuation(DeepseekModel& model, const std::vector<int32_t>& prompt, size_t n,
                                                KvCacheDtype kv) {
  Backend& be = model.backend();
  auto cache = allocate_kv_cache(be, model.config(), int(prompt.size() + n), kv);
  Logits l = to_logits(be, model.forward(contiguous_sequence_batch(prompt, 0, false), cache));
  std::vector<int32_t> out = {argmax(l.row(0))};
  while (out.size() < n) {
    l = to_logits(be, model.forward(contiguous_sequence_batch({&out.back(), 1},
                                                              int32_t(prompt.size() + out.size() - 1), false),
                                    cache));
    out.push_back(argmax(l.row(0)));
  }
  return out;
}

inline size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

struct KvDtypeComparison {
  double max_abs = 0, worst_rel_l2 = 0, total_rel_l2 = 0;
  int decisive = 0, decisive_agree = 0;    // teacher-forced steps where the reference cache's top-2 gap is decisive
  size_t tokens = 0, base_prefix = 0, fp8_prefix = 0;  // greedy tokens agreeing with transformers from the start
};

inline double top2_gap(std::span<const float> row) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : row) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return double(a) - b;
}

// Every golden sequence of `golden_name` with the fp8 cache against `base`
// (auto) on model's backend. decisive_gap: the top-2 logit gap of the
// base-cache row above which the fp8 cache must pick the same token.
inline KvDtypeComparison compare_fp8_kv_cache(DeepseekModel& model, const std::string& golden_name,
                                              double decisive_gap) {
  const auto golden = load_model_golden(golden_name);
  KvDtypeComparison c;
  double diff2 = 0, ref2 = 0;
  for (const auto& seq : golden["sequences"]) {
    const auto prompt = seq["input_ids"].get<std::vector<int32_t>>();
    const auto greedy = seq["greedy"].get<std::vector<int32_t>>();
    const Logits base = teacher_forced_decode_logits(model, prompt, greedy, KvCacheDtype::Auto);
    const Logits fp8 = teacher_forced_decode_logits(model, prompt, greedy, KvCacheDtype::Fp8E4M3);
    for (int64_t r = 0; r < base.rows; ++r) {
      double d2 = 0, b2 = 0;
      for (int64_t i = 0; i < base.vocab; ++i) {
        const double b = base.row(r)[size_t(i)], f = fp8.row(r)[size_t(i)];
        c.max_abs = std::max(c.max_abs, std::fabs(f - b));
        d2 += (f - b) * (f - b);
        b2 += b * b;
      }
      c.worst_rel_l2 = std::max(c.worst_rel_l2, std::sqrt(d2 / b2));
      diff2 += d2;
      ref2 += b2;
      if (top2_gap(base.row(r)) > decisive_gap) {
        ++c.decisive;
        c.decisive_agree += argmax(base.row(r)) == argmax(fp8.row(r));
      }
    }
    c.tokens += greedy.size();
    c.base_prefix += common_prefix(greedy_continuation(model, prompt, greedy.size(), KvCacheDtype::Auto), greedy);
    c.fp8_prefix += common_prefix(greedy_continuation(model, prompt, greedy.size(), KvCacheDtype::Fp8E4M3), greedy);
  }
  c.total_rel_l2 = std::sqrt(diff2 / ref2);
  std::printf("[fp8-kv] %s on %s: logits fp8 vs %s cache: max |diff| %.3g, rel L2 %.3g (worst row %.3g); "
              "argmax agrees on %d of %d decisive steps; greedy tokens matching transformers from the start: "
              "%zu of %zu (fp8 cache), %zu (%s cache)\n",
              golden_name.c_str(), model.backend().name().c_str(), std::string(dtype_name(model.backend().act_dtype())).c_str(),
              c.max_abs, c.total_rel_l2, c.worst_rel_l2, c.decisive_agree, c.decisive, c.fp8_prefix, c.tokens,
              c.base_prefix, std::string(dtype_name(model.backend().act_dtype())).c_str());
  return c;
}

}  // namespace mlaserve::testing
