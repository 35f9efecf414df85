#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace mlaserve::runtime {

namespace {

int32_t argmax(std::span<const float> v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

void apply_penalties(std::vector<float>& logits, const SamplingParams& p, const TokenHistory& h) {
  for (auto [id, _] : h.all_counts)
    MLA_CHECK(id >= 0 && size_t(id) < logits.size(), "token id {} outside the vocabulary of {}", id, logits.size());
  if (p.repetition_penalty != 1.0f) {
    for (auto [id, _] : h.all_counts) {
      float& l = logits[size_t(id)];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (auto [id, n] : h.output_counts) logits[size_t(id)] -= p.frequency_penalty * float(n) + p.presence_penalty;
  }
}

}  // namespace


void TokenHistory::add_prompt(std::span<const int32_t> ids) {
  for (int32_t id : ids) all_counts[id]++;
}

void TokenHistory::add_output(int32_t id) {
  output_counts[id]++;
  all_counts[id]++;
}

SampledToken sample_token(std::span<const float> logits, const SamplingParams& p, const TokenHistory& history,
                          Rng& rng) {
  const size_t vocab = logits.size();
  MLA_CHECK(vocab > 0, "sampling from an empty logits row");

  SampledToken out;
  // NOTES: a row is the whole vocabulary (129k floats); copy it only when
  // penalties change it, so a greedy decode step costs one pass per row.
  const bool penalized = has_penalties(p);
  std::vector<float> penalized_logits;
  if (penalized) {
    penalized_logits.assign(logits.begin(), logits.end());
    apply_penalties(penalized_logits, p, history);
  }
  std::span<const float> work = penalized ? std::span<const float>(penalized_logits) : logits;

  if (p.greedy()) {
    out.id = argmax(work);
  } else {
    const float inv_t = 1.0f / p.temperature;
    const float max_l = *std::max_element(work.begin(), work.end());
    // Candidates as (prob, id), unnormalized exp((l - max) / T).
    std::vector<std::pair<float, int32_t>> cand;
    cand.reserve(vocab);
    for (size_t i = 0; i < vocab; ++i) {
      float e = std::exp((work[i] - max_l) * inv_t);
      if (e > 0.0f) cand.emplace_back(e, int32_t(i));
    }
    auto by_prob = [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    if (p.top_k > 0 && size_t(p.top_k) < cand.size()) {
      std::nth_element(cand.begin(), cand.begin() + p.top_k - 1, cand.end(), by_prob);
      cand.resize(size_t(p.top_k));
    }
    if (p.min_p > 0.0f) {
      // The max survives: its probability is exactly 1 before normalization.
      float threshold = p.min_p * std::max_element(cand.begin(), cand.end())->first;
      std::erase_if(cand, [&](auto& c) { return c.first < threshold; });
    }
    if (p.top_p < 1.0f) {
      std::sort(cand.begin(), cand.end(), by_prob);
      double total = 0;
      for (auto& c : cand) total += c.first;
      double cum = 0;
      size_t keep = 0;
      while (keep < cand.size()) {
        cum += cand[keep++].first;
        if (cum >= p.top_p * total) break;
      }
      cand.resize(keep);
    }
    double total = 0;
    for (auto& c : cand) total += c.first;
    double u = rng.uniform() * total;
    out.id = cand.back().second;
    for (auto& c : cand) {
      u -= c.first;
      if (u < 0) {
        out.id = c.second;
        break;
      }
    }
  }

  if (p.logprobs || p.top_logprobs > 0) {
    const float max_l = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp(double(l - max_l));
    const float lse = max_l + float(std::log(sum));
    out.logprob = logits[size_t(out.id)] - lse;
    if (p.top_logprobs > 0) {
      std::vector<int32_t> ids(vocab);
      std::iota(ids.begin(), ids.end(), 0);
      size_t k = std::min(vocab, size_t(p.top_logprobs));
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], logits[size_t(ids[i])] - lse);
    }
  }
  return out;
}

bool needs_only_argmax(const SamplingParams& p) { return p.greedy() && can_sample_on_device(p); }

bool can_sample_on_device(const SamplingParams& p) {
  return !has_penalties(p) && !p.logprobs && p.top_logprobs == 0;
}

}  // namespace mlaserve::runtime
