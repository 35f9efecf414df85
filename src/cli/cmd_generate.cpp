// mlaserve generate: one prompt through the offline Engine (the same runtime
// `serve` uses: paged latent cache, scheduler, sampler), greedy unless
// sampling options are given; the continuation is streamed to stdout.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>

#include "cli/command.h"
#include "runtime/engine_loader.h"

namespace mlaserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct GenerateOptions {
  runtime::EngineArgs engine;
  std::string prompt;
  std::string input_ids;
  int max_new_tokens = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = -1;
  std::optional<uint64_t> seed;
  bool json = false;
  bool ignore_eos = false;
  std::string mla_mode = "auto";
  std::string kv_cache_dtype = "auto";
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      MLA_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "bad token id");
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("--input-ids: '{}' is not a non-negative token id (expected e.g. 1,2,3)", item);
    }
  }
  MLA_CHECK(!ids.empty(), "--input-ids is empty");
  return ids;
}

MlaMode parse_mla_mode(const std::string& s) {
  if (s == "absorbed") return MlaMode::Absorbed;
  if (s == "expanded") return MlaMode::Expanded;
  return MlaMode::Auto;
}

int run_generate(GenerateOptions o) {
  MLA_CHECK(o.prompt.empty() != o.input_ids.empty(), "give exactly one of --prompt and --input-ids");
  o.engine.mla_mode = parse_mla_mode(o.mla_mode);
  o.engine.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  o.engine.max_running_requests = 1;
  runtime::LoadedEngine loaded(o.engine);
  const ModelConfig& c = loaded.config();
  const std::vector<int32_t> prompt_ids =
      o.prompt.empty() ? parse_ids(o.input_ids) : loaded.tokenizer().encode(o.prompt, true);
  MLA_CHECK(!prompt_ids.empty(), "the prompt encodes to no tokens");
  for (int32_t id : prompt_ids)
    MLA_CHECK(id < c.vocab_size, "token id {} is outside the model's vocabulary of {}", id, c.vocab_size);

  runtime::GenerateRequest req;
  req.input_ids = prompt_ids;
  runtime::SamplingParams& sp = req.params;
  sp.temperature = o.temperature;
  sp.top_p = o.top_p;
  sp.top_k = o.top_k;
  sp.seed = o.seed;
  sp.max_new_tokens = o.max_new_tokens;
  sp.ignore_eos = o.ignore_eos;

  // Timestamps of the first and the last token: the first comes from the
  // prefill, the rest from decode steps.
  std::optional<Clock::time_point> t_first;
  Clock::time_point t_last;
  if (!o.json && !o.prompt.empty()) fmt::print("{}", o.prompt);
  req.on_output = [&](runtime::RequestOutput&& out) {
    if (!out.token_ids.empty()) {
      t_last = Clock::now();
      if (!t_first) t_first = t_last;
    }
    if (!o.json) {
      fmt::print("{}", out.text);
      std::fflush(stdout);
    }
  };
  const auto t0 = Clock::now();
  runtime::GenerateResult result = std::move(loaded.engine().generate({std::move(req)}).at(0));
  const runtime::RequestOutput& fin = result.final_output;
  MLA_CHECK(fin.finish != runtime::FinishReason::Abort, "generation aborted: {}", fin.abort_message);

  const size_t n = result.output_ids.size();
  const double prefill_s = t_first ? std::chrono::duration<double>(*t_first - t0).count() : 0.0;
  const double decode_s = t_first ? std::chrono::duration<double>(t_last - *t_first).count() : 0.0;
  const double tokens_per_s = n > 1 && decode_s > 0 ? double(n - 1) / decode_s : 0.0;
  if (o.json) {
    nlohmann::json j = {{"input_ids", prompt_ids},
                        {"output_ids", result.output_ids},
                        {"text", result.text},
                        {"finish_reason", runtime::finish_reason_name(fin.finish)},
                        {"tokens_per_s", tokens_per_s},
                        {"prefill_s", prefill_s}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("\n");
    fmt::print(stderr, "[{}] prompt {} tokens, first token after {:.1f} ms; decode {} tokens, {:.2f} tok/s\n",
               loaded.backend().name(), prompt_ids.size(), prefill_s * 1e3, n, tokens_per_s);
  }
  return 0;
}

CommandRegistration generate_command(
    "generate", "generate a continuation of one prompt through the offline engine", [](CLI::App& app) {
      auto o = std::make_shared<GenerateOptions>();
      auto seed = std::make_shared<uint64_t>(0);
      app.add_option("--model-path", o->engine.model_path, "checkpoint directory")->capture_default_str();
      app.add_option("--prompt", o->prompt, "prompt text (tokenized with the model's tokenizer, BOS added)");
      app.add_option("--input-ids", o->input_ids, "prompt as comma-separated token ids, e.g. 0,1,2");
      app.add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
      app.add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
      app.add_option("--top-p", o->top_p)->capture_default_str();
      app.add_option("--top-k", o->top_k, "<= 0: all tokens")->capture_default_str();
      auto* seed_opt = app.add_option("--seed", *seed, "sampling seed");
      app.add_flag("--ignore-eos", o->ignore_eos, "keep generating past the end-of-sequence token");
      app.add_flag("--json", o->json,
                   "print one JSON object {input_ids, output_ids, text, finish_reason, tokens_per_s}");
      app.add_option("--device", o->engine.device, "cpu, cuda or auto")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      app.add_flag("--disable-cuda-graph", o->engine.disable_cuda_graph, "run decode steps eagerly on CUDA");
      app.add_flag("--disable-overlap-schedule", o->engine.disable_overlap_schedule,
                   "build each decode step after the previous one's tokens reach the host");
      app.add_option("--kv-cache-dtype", o->kv_cache_dtype, "latent cache dtype: auto (= activations), bf16 or fp8_e4m3")
          ->capture_default_str()
          ->check(CLI::IsMember({"auto", "bf16", "fp8_e4m3"}));
      app.add_option("--mla-mode", o->mla_mode, "auto (absorbed for decode and short extensions of a cached prefix, expanded otherwise), absorbed or expanded")
          ->capture_default_str()
          ->check(CLI::IsMember({"auto", "absorbed", "expanded"}));
      return [=]() {
        if (seed_opt->count()) o->seed = *seed;
        return run_generate(*o);
      };
    });

}  // namespace
}  // namespace mlaserve::cli
