// mlaserve generate: one prompt, prefill then incremental decode with the
// latent cache, greedy unless sampling options are given.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <sstream>

#include "cli/command.h"
#include "io/checkpoint.h"
#include "model/deepseek_model.h"
#include "model/kv_cache.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace mlaserve::cli {
namespace {

struct GenerateOptions {
  std::string model_path = "models/tiny";
  std::string prompt;
  std::string input_ids;
  int max_new_tokens = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = -1;
  std::optional<uint64_t> seed;
  bool json = false;
  bool ignore_eos = false;
  std::string device = "auto";
  std::string mla_mode = "auto";
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

std::unique_ptr<Backend> choose_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  std::unique_ptr<Backend> cuda = make_cuda_backend(size_t(1) << 30);
  if (cuda) return cuda;
  MLA_CHECK(device != "cuda", "--device cuda: no CUDA backend (built without CUDA, or no GPU present)");
  return make_cpu_backend();
}

MlaMode parse_mla_mode(const std::string& s) {
  if (s == "absorbed") return MlaMode::Absorbed;
  if (s == "expanded") return MlaMode::Expanded;
  return MlaMode::Auto;
}

int run_generate(const GenerateOptions& o) {
  using Clock = std::chrono::steady_clock;
  MLA_CHECK(o.prompt.empty() != o.input_ids.empty(), "give exactly one of --prompt and --input-ids");
  const Checkpoint ckpt = Checkpoint::open(o.model_path);
  std::optional<tokenizer::Tokenizer> tok;
  if (!o.prompt.empty() || std::filesystem::exists(std::filesystem::path(o.model_path) / "tokenizer.json"))
    tok = tokenizer::Tokenizer::load(o.model_path);
  const std::vector<int32_t> prompt_ids = o.prompt.empty() ? parse_ids(o.input_ids) : tok->encode(o.prompt, true);
  MLA_CHECK(!prompt_ids.empty(), "the prompt encodes to no tokens");

  std::unique_ptr<Backend> backend = choose_backend(o.device);
  ModelOptions mo;
  mo.mla_mode = parse_mla_mode(o.mla_mode);
  mo.load_mtp = false;
  DeepseekModel model(ckpt, *backend, mo);
  const ModelConfig& c = model.config();
  for (int32_t id : prompt_ids)
    MLA_CHECK(id < c.vocab_size, "token id {} is outside the model's vocabulary of {}", id, c.vocab_size);

  const int total = int(prompt_ids.size()) + o.max_new_tokens;
  std::vector<Tensor> cache = allocate_kv_cache(*backend, c, total);
  runtime::SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_p = o.top_p;
  sp.top_k = o.top_k;
  sp.seed = o.seed;
  sp.max_new_tokens = o.max_new_tokens;
  sp.validate();
  runtime::Rng rng(o.seed.value_or(uint64_t(Clock::now().time_since_epoch().count())));
  runtime::TokenHistory history;
  history.add_prompt(prompt_ids);
  int32_t eos = tok && tok->eos_id() >= 0 ? tok->eos_id() : c.eos_token_id.value_or(-1);

  auto next_token = [&](const ForwardBatch& batch) {
    Tensor logits = backend->to_host(model.forward(batch, cache));
    return runtime::sample_token({logits.data<float>(), size_t(logits.numel())}, sp, history, rng).id;
  };

  std::vector<int32_t> output;
  const auto t0 = Clock::now();
  int32_t token = next_token(contiguous_sequence_batch(prompt_ids, 0, false));
  const auto t_prefill = Clock::now();
  while (o.max_new_tokens > 0) {
    output.push_back(token);
    history.add_output(token);
    if ((token == eos && !o.ignore_eos) || int(output.size()) == o.max_new_tokens) break;
    const int32_t pos = int32_t(prompt_ids.size() + output.size() - 1);
    token = next_token(contiguous_sequence_batch(std::span<const int32_t>(&token, 1), pos, false));
  }
  const auto t_end = Clock::now();
  const double prefill_s = std::chrono::duration<double>(t_prefill - t0).count();
  const double decode_s = std::chrono::duration<double>(t_end - t_prefill).count();
  // Decode rate: tokens produced by decode steps over their time (the first
  // token comes from the prefill).
  const double tokens_per_s = output.size() > 1 ? double(output.size() - 1) / decode_s : 0.0;
  const std::string text = tok ? tok->decode(output, true) : "";

  if (o.json) {
    nlohmann::json j = {{"input_ids", prompt_ids},
                        {"output_ids", output},
                        {"text", text},
                        {"tokens_per_s", tokens_per_s},
                        {"prefill_s", prefill_s}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    if (tok) {
      fmt::print("{}{}\n", o.prompt.empty() ? "" : o.prompt, text);
    } else {
      fmt::print("{}\n", nlohmann::json(output).dump());
    }
    fmt::print(stderr, "[{}] prompt {} tokens, prefill {:.1f} ms ({:.1f} tok/s); decode {} tokens, {:.2f} tok/s\n",
               backend->name(), prompt_ids.size(), prefill_s * 1e3, double(prompt_ids.size()) / prefill_s,
               output.size(), tokens_per_s);
  }
  return 0;
}

CommandRegistration generate_command(
    "generate", "generate a continuation of one prompt (prefill + incremental decode)", [](CLI::App& app) {
      auto o = std::make_shared<GenerateOptions>();
      auto seed = std::make_shared<uint64_t>(0);
      app.add_option("--model-path", o->model_path, "checkpoint directory")->capture_default_str();
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
      app.add_flag("--json", o->json, "print one JSON object {input_ids, output_ids, text, tokens_per_s}");
      app.add_option("--device", o->device, "cpu, cuda or auto")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      app.add_option("--mla-mode", o->mla_mode, "auto (expanded prefill, absorbed decode), absorbed or expanded")
          ->capture_default_str()
          ->check(CLI::IsMember({"auto", "absorbed", "expanded"}));
      return [=]() {
        if (seed_opt->count()) o->seed = *seed;
        return run_generate(*o);
      };
    });

}  // namespace
}  // namespace mlaserve::cli
