#pragma once
// Picks the next token from one row of logits: penalties, then greedy argmax
// or temperature / top-k / top-p / min-p sampling with a per-request RNG.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/portable_random.h"
#include "runtime/sampling_params.h"

namespace mlaserve::runtime {

// xoshiro256** seeded through splitmix64: the same seed gives the same
// stream on every platform (std:: distributions do not promise that).
// Seeded sampling draws: the same portable xoshiro256** the checkpoint
// writer uses, so a seed means the same tokens on every machine.
using Rng = PortableRng;

// What penalties need to know about a sequence so far.
struct TokenHistory {
  std::unordered_map<int32_t, int> output_counts;  // frequency / presence
  std::unordered_map<int32_t, int> all_counts;     // repetition (prompt + output)
  void add_prompt(std::span<const int32_t> ids);
  void add_output(int32_t id);
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;                            // of `id` under the model's distribution
  std::vector<std::pair<int32_t, float>> top;      // top_logprobs alternatives, best first
};

// Logprobs are reported from the model's raw distribution (log_softmax of the
// logits before penalties and temperature), as OpenAI documents them.
SampledToken sample_token(std::span<const float> logits, const SamplingParams& params,
                          const TokenHistory& history, Rng& rng);

// True when sample_token would return just the row's argmax and nothing else
// (greedy, no penalties, no logprobs): the row itself is then not needed,
// only its argmax, which the device can compute.
bool needs_only_argmax(const SamplingParams& params);
// True when Backend::sample_rows can pick the token (no penalties, no
// logprobs): the row then never leaves the device.
bool can_sample_on_device(const SamplingParams& params);

}  // namespace mlaserve::runtime
