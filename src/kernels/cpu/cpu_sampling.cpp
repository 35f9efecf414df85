#include "kernels/cpu/cpu_sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace mlaserve::cpu {

int32_t sample_row(const float* row, int64_t vocab, const RowSampling& p) {
  const int32_t argmax = int32_t(std::max_element(row, row + vocab) - row);  // first of equal maxima
  if (p.temperature < 1e-5f || p.top_k == 1) return argmax;
  const double max_l = row[argmax], inv_t = 1.0 / double(p.temperature);
  std::vector<double> w(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) w[size_t(i)] = std::exp((double(row[i]) - max_l) * inv_t);

  // Kept tokens are those with w >= threshold; each filter only raises it.
  double threshold = 0.0;
  if (p.top_k > 0 && p.top_k < vocab) {
    std::vector<double> sorted = w;
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<>());
    threshold = sorted[size_t(p.top_k - 1)];
  }
  if (p.min_p > 0.0f) threshold = std::max(threshold, double(p.min_p));
  if (p.top_p < 1.0f) {
    std::vector<double> kept;
    for (double v : w)
      if (v >= threshold) kept.push_back(v);
    std::sort(kept.begin(), kept.end(), std::greater<>());
    double mass = 0.0;
    for (double v : kept) mass += v;
    double cum = 0.0;
    for (double v : kept) {
      cum += v;
      if (cum >= double(p.top_p) * mass) {
        threshold = v;
        break;
      }
    }
  }

  double total = 0.0;
  for (double v : w)
    if (v >= threshold) total += v;
  const double target = p.uniform * total;
  double run = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (w[size_t(i)] < threshold) continue;
    run += w[size_t(i)];
    if (run > target) return int32_t(i);
  }
  return argmax;  // rounding put the target past the last kept token
}

}  // namespace mlaserve::cpu
