#pragma once
// Per-request decoding parameters, with SGLang's names and defaults. The
// server maps OpenAI fields onto these (max_tokens -> max_new_tokens, ...).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlaserve::runtime {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (exact argmax)
  float top_p = 1.0f;
  int top_k = -1;            // <= 0: all tokens
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // HF style, over prompt and output tokens
  float frequency_penalty = 0.0f;   // OpenAI style, over output tokens
  float presence_penalty = 0.0f;
  int max_new_tokens = 128;
  std::vector<std::string> stop;        // never part of the returned text
  std::vector<int32_t> stop_token_ids;  // finish when sampled (not part of the text)
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  std::optional<uint64_t> seed;  // same seed, same prompt -> same tokens
  bool logprobs = false;
  int top_logprobs = 0;  // alternatives reported per token (0..20)

  bool greedy() const { return temperature < 1e-5f || top_k == 1; }
  // Throws mlaserve::Error naming the offending field.
  void validate() const;
};

}  // namespace mlaserve::runtime
