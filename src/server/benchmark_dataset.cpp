#include "server/benchmark_dataset.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "runtime/sampler.h"

namespace mlaserve::server {

namespace {

int uniform_int(runtime::Rng& rng, int lo, int hi) {
  return lo + int(rng.next_u64() % uint64_t(hi - lo + 1));
}

}  // namespace

std::vector<BenchPrompt> random_prompts(const tokenizer::Tokenizer& tok, int num_prompts, int input_len,
                                        int output_len, double range_ratio, uint64_t seed) {
  MLA_CHECK(num_prompts >= 1 && input_len >= 1 && output_len >= 1,
            "--num-prompts, --random-input-len and --random-output-len must be >= 1");
  MLA_CHECK(range_ratio >= 0 && range_ratio <= 1, "--random-range-ratio must be in [0, 1], got {}", range_ratio);
  runtime::Rng rng(seed);
  std::vector<BenchPrompt> out;
  for (int i = 0; i < num_prompts; ++i) {
    BenchPrompt p;
    p.prompt_len = uniform_int(rng, std::max(1, int(input_len * range_ratio)), input_len);
    p.output_len = uniform_int(rng, std::max(1, int(output_len * range_ratio)), output_len);
    std::vector<int32_t> ids;
    while (int(ids.size()) < p.prompt_len) {
      int32_t id = int32_t(rng.next_u64() % uint64_t(tok.vocab_size()));
      if (!tok.is_special(id) && !tok.token_bytes(id).empty()) ids.push_back(id);
    }
    p.text = tok.decode(ids, true);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<BenchPrompt> sharegpt_prompts(const tokenizer::Tokenizer& tok, const std::string& path, int num_prompts,
                                          std::optional<int> fixed_output_len, uint64_t seed) {
  std::ifstream f(path);
  MLA_CHECK(f.good(), "cannot open the ShareGPT dataset {}", path);
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", path, e.what());
  }
  MLA_CHECK(data.is_array(), "{}: expected a JSON array of conversations", path);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (auto& item : data) {
    if (!item.is_object()) continue;
    auto it = item.find("conversations");
    if (it == item.end()) it = item.find("conversation");
    if (it == item.end() || !it->is_array() || it->size() < 2) continue;
    const auto& a = (*it)[0];
    const auto& b = (*it)[1];
    if (!a.is_object() || !b.is_object() || !a.contains("value") || !b.contains("value") || !a["value"].is_string() ||
        !b["value"].is_string())
      continue;
    pairs.emplace_back(a["value"].get<std::string>(), b["value"].get<std::string>());
  }
  runtime::Rng rng(seed);
  for (size_t i = pairs.size(); i > 1; --i) std::swap(pairs[i - 1], pairs[rng.next_u64() % i]);
  std::vector<BenchPrompt> out;
  for (auto& [prompt, reply] : pairs) {
    if (int(out.size()) == num_prompts) break;
    BenchPrompt p;
    p.text = prompt;
    p.prompt_len = int(tok.encode(prompt, false).size());
    p.output_len = fixed_output_len ? *fixed_output_len : int(tok.encode(reply, false).size());
    if (p.prompt_len < 2 || p.output_len < 2) continue;
    if (!fixed_output_len && (p.prompt_len > 1024 || p.prompt_len + p.output_len > 2048)) continue;
    out.push_back(std::move(p));
  }
  MLA_CHECK(!out.empty(), "{}: no usable conversations (need a human turn and a reply)", path);
  return out;
}

}  // namespace mlaserve::server
