#pragma once
// One generation request as the scheduler tracks it, and what it reports
// back to whoever submitted it.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/radix_cache.h"
#include "runtime/sampler.h"
#include "runtime/sampling_params.h"
#include "runtime/stop_matcher.h"
#include "runtime/text_stream.h"

namespace mlaserve::runtime {

enum class FinishReason { None, Stop, Length, Abort };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort"

// A streaming update: what is new since the previous one.
struct RequestOutput {
  uint64_t id = 0;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<SampledToken> logprobs;  // one per new token when logprobs were asked for
  FinishReason finish = FinishReason::None;
  std::optional<int32_t> matched_stop_token;
  std::optional<std::string> matched_stop_string;
  std::string abort_message;  // why, when finish == Abort
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
  bool finished() const { return finish != FinishReason::None; }
};

// Runs on the engine thread: keep it short (hand the data to another thread).
using OutputCallback = std::function<void(RequestOutput&&)>;

struct Request {
  uint64_t id = 0;
  uint64_t arrival = 0;          // admission order; retraction picks the youngest
  std::vector<int32_t> tokens;   // prompt, then generated tokens
  int prompt_len = 0;
  SamplingParams params;
  OutputCallback on_output;

  std::unique_ptr<TextStream> detokenizer;
  std::optional<StopMatcher> stop_matcher;
  TokenHistory history;
  std::optional<Rng> rng;

  // KV state: pages cover tokens [0, kv_len) (and maybe more, allocated ahead).
  std::vector<int32_t> pages;
  int kv_len = 0;
  RadixCache::Node* locked_node = nullptr;  // end of the reused prefix
  int locked_pages = 0;                     // leading pages owned by the radix tree
  int cached_tokens = -1;                   // prefix reused at first admission (usage)

  bool aborted = false;
  std::string abort_message;
  // Overlapped steps: a sampled token waits for postprocessing (detokenize,
  // stop strings, report) while the next step already runs.
  bool awaiting_postprocess = false;
  FinishReason finish_after_postprocess = FinishReason::None;  // decided while its token waited
  bool final_reported = false;  // its last output went out; the scheduler only has to drop it
  int num_output() const { return int(tokens.size()) - prompt_len; }
  // Tokens still to run through the model before the next sample.
  int pending_tokens() const { return int(tokens.size()) - kv_len; }
};

}  // namespace mlaserve::runtime
