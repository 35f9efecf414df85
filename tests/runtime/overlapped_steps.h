#pragma once
// Greedy decode on a ModelRunner two ways, for the runner tests of each
// backend: each step built from the previous step's ids on the host, or
// started before the previous step is finished, its input ids naming that
// step's picks (-1 - row), as the engine's overlapped decode runs.
#include <cstdint>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/static_batch.h"

namespace mlaserve::runtime::testing {

// The ids of the prefill of `prompts` and of `steps` decode steps after it.
inline std::vector<std::vector<int32_t>> greedy_steps(ModelRunner& runner,
                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                      int slots_per_seq, int steps, bool overlapped) {
  std::vector<int32_t> lens;
  for (const auto& p : prompts) lens.push_back(int32_t(p.size()));
  std::vector<int32_t> placeholders;
  for (size_t b = 0; b < prompts.size(); ++b) placeholders.push_back(-1 - int32_t(b));
  std::vector<std::vector<int32_t>> out;
  if (!overlapped) {
    out.push_back(runner.forward_greedy(static_prefill_batch(prompts, slots_per_seq)));
    for (int s = 0; s < steps; ++s) {
      out.push_back(runner.forward_greedy(static_decode_batch(out.back(), lens, slots_per_seq)));
      for (auto& l : lens) ++l;
    }
    return out;
  }
  runner.start_step(static_prefill_batch(prompts, slots_per_seq), nullptr);
  for (int s = 0; s < steps; ++s) {
    runner.start_step(static_decode_batch(placeholders, lens, slots_per_seq), nullptr);
    out.push_back(runner.finish_step());
    for (auto& l : lens) ++l;
  }
  out.push_back(runner.finish_step());
  return out;
}

}  // namespace mlaserve::runtime::testing
