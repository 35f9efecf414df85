#pragma once
// Prompts for bench-serving, as SGLang's bench_serving makes them: `random`
// (random token ids of random lengths, decoded to text) and ShareGPT-format
// JSON (first human turn as the prompt, the reply's length as the output).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace mlaserve::server {

struct BenchPrompt {
  std::string text;
  int prompt_len = 0;  // tokens
  int output_len = 0;  // max_tokens to ask for
};

// Lengths uniform in [max(1, len * range_ratio), len].
std::vector<BenchPrompt> random_prompts(const tokenizer::Tokenizer& tok, int num_prompts, int input_len,
                                        int output_len, double range_ratio, uint64_t seed);

// A JSON array of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}, ...]}.
// Conversations are shuffled with `seed`; those with a prompt or reply under
// 2 tokens, a prompt over 1024 or a total over 2048 tokens are skipped
// (SGLang's filter). Throws mlaserve::Error naming the file on bad input.
std::vector<BenchPrompt> sharegpt_prompts(const tokenizer::Tokenizer& tok, const std::string& path, int num_prompts,
                                          std::optional<int> fixed_output_len, uint64_t seed);

}  // namespace mlaserve::server
