#include "runtime/sampling_params.h"

#include <cmath>

#include "core/error.h"

namespace mlaserve::runtime {

void SamplingParams::validate() const {
  MLA_CHECK(std::isfinite(temperature) && temperature >= 0.0f && temperature <= 100.0f,
            "temperature must be in [0, 100], got {}", temperature);
  MLA_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got {}", top_p);
  MLA_CHECK(top_k == -1 || top_k >= 1, "top_k must be -1 (disabled) or >= 1, got {}", top_k);
  MLA_CHECK(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got {}", min_p);
  MLA_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f && repetition_penalty <= 2.0f,
            "repetition_penalty must be in (0, 2], got {}", repetition_penalty);
  MLA_CHECK(std::isfinite(frequency_penalty) && std::fabs(frequency_penalty) <= 2.0f,
            "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  MLA_CHECK(std::isfinite(presence_penalty) && std::fabs(presence_penalty) <= 2.0f,
            "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  MLA_CHECK(max_new_tokens >= 0, "max_tokens must be >= 0, got {}", max_new_tokens);
  MLA_CHECK(stop.size() <= 16, "at most 16 stop strings, got {}", stop.size());
  for (auto& s : stop) MLA_CHECK(!s.empty() && s.size() <= 1024, "stop strings must be 1..1024 bytes long");
  MLA_CHECK(top_logprobs >= 0 && top_logprobs <= 20, "top_logprobs must be in [0, 20], got {}", top_logprobs);
}

}  // namespace mlaserve::runtime
