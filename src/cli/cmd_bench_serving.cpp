// mlaserve bench-serving: SGLang's bench_serving against any OpenAI-compatible
// server: random or ShareGPT prompts, Poisson arrivals, a concurrency cap,
// and the same result table and JSON line.
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "cli/command.h"
#include "core/error.h"
#include "server/benchmark_client.h"
#include "server/benchmark_dataset.h"
#include "server/benchmark_report.h"
#include "tokenizer/tokenizer.h"

namespace mlaserve::cli {
namespace {

struct BenchServingOptions {
  server::LoadOptions load;
  std::string backend = "mlaserve";
  std::string base_url;
  std::string tokenizer = "models/tiny";
  std::string dataset_name = "random";
  std::string dataset_path;
  int num_prompts = 1000;
  int sharegpt_output_len = 0;
  int random_input_len = 1024;
  int random_output_len = 1024;
  double random_range_ratio = 0.0;
  std::string request_rate = "inf";
  int warmup_requests = 1;
  std::string output_file;
  bool disable_ignore_eos = false;
};

// http://host:port -> host, port (no TLS here).
void apply_base_url(const std::string& url, server::LoadOptions& load) {
  std::string rest = url;
  MLA_CHECK(rest.rfind("http://", 0) == 0, "--base-url must start with http:// (got '{}')", url);
  rest = rest.substr(7);
  rest = rest.substr(0, rest.find('/'));
  size_t colon = rest.rfind(':');
  load.host = rest.substr(0, colon);
  load.port = colon == std::string::npos ? 80 : std::stoi(rest.substr(colon + 1));
}

int run_bench_serving(BenchServingOptions o) {
  auto& load = o.load;
  if (!o.base_url.empty()) apply_base_url(o.base_url, load);
  load.endpoint = o.backend.find("chat") != std::string::npos ? "/v1/chat/completions" : "/v1/completions";
  load.ignore_eos = !o.disable_ignore_eos;
  if (o.request_rate == "inf") {
    load.request_rate = 0;
  } else {
    try {
      load.request_rate = std::stod(o.request_rate);
    } catch (const std::exception&) {
      fail("--request-rate must be a number or 'inf', got '{}'", o.request_rate);
    }
    MLA_CHECK(load.request_rate > 0, "--request-rate must be > 0 (or inf)");
  }
  if (load.model.empty()) load.model = server::first_served_model(load);

  const auto tok = tokenizer::Tokenizer::load(o.tokenizer);
  std::vector<server::BenchPrompt> prompts;
  if (o.dataset_name == "random") {
    prompts = server::random_prompts(tok, o.num_prompts, o.random_input_len, o.random_output_len,
                                     o.random_range_ratio, load.seed);
  } else {
    MLA_CHECK(o.dataset_name == "sharegpt", "--dataset-name must be random or sharegpt, got '{}'", o.dataset_name);
    MLA_CHECK(!o.dataset_path.empty(), "--dataset-name sharegpt needs --dataset-path FILE (ShareGPT JSON)");
    prompts = server::sharegpt_prompts(tok, o.dataset_path, o.num_prompts,
                                       o.sharegpt_output_len > 0 ? std::optional<int>(o.sharegpt_output_len)
                                                                 : std::nullopt,
                                       load.seed);
  }
  fmt::print("#Input tokens: {}\n#Output tokens: {}\n", [&] {
    int64_t n = 0;
    for (auto& p : prompts) n += p.prompt_len;
    return n;
  }(), [&] {
    int64_t n = 0;
    for (auto& p : prompts) n += p.output_len;
    return n;
  }());

  if (o.warmup_requests > 0) {
    std::vector<server::BenchPrompt> warm(size_t(o.warmup_requests), prompts.front());
    for (auto& w : warm) w.output_len = std::min(w.output_len, 16);
    server::LoadOptions wl = load;
    wl.request_rate = 0;
    double d;
    auto r = server::run_load(warm, wl, &d);
    MLA_CHECK(r[0].success, "warmup request failed: {}", r[0].error);
  }
  fmt::print("Starting benchmark: {} prompts to {}:{}{} (model '{}')\n", prompts.size(), load.host, load.port,
             load.endpoint, load.model);
  double duration = 0;
  auto results = server::run_load(prompts, load, &duration);
  std::vector<int> retokenized;
  for (auto& r : results) retokenized.push_back(int(tok.encode(r.generated_text, false).size()));
  auto report = server::summarize(results, retokenized, duration);

  server::BenchmarkSettings s;
  s.backend = o.backend;
  s.dataset_name = o.dataset_name;
  s.request_rate = load.request_rate;
  s.max_concurrency = load.max_concurrency;
  s.random_input_len = o.random_input_len;
  s.random_output_len = o.random_output_len;
  s.random_range_ratio = o.random_range_ratio;
  fmt::print("{}", server::format_report(report, s));
  for (auto& e : report.first_errors) fmt::print("error: {}\n", e);
  if (!o.output_file.empty()) {
    std::ofstream f(o.output_file, std::ios::app);
    MLA_CHECK(f.good(), "cannot open --output-file {}", o.output_file);
    f << server::report_json(report, s).dump() << "\n";
  }
  return report.failed == 0 ? 0 : 1;
}

CommandRegistration bench_serving_command(
    "bench-serving", "load-test an OpenAI-compatible server (SGLang's bench_serving)", [](CLI::App& app) {
      auto o = std::make_shared<BenchServingOptions>();
      app.add_option("--backend", o->backend,
                     "label in the report; a name containing 'chat' (e.g. sglang-oai-chat) uses /v1/chat/completions")
          ->capture_default_str();
      app.add_option("--host", o->load.host)->capture_default_str();
      app.add_option("--port", o->load.port)->capture_default_str();
      app.add_option("--base-url", o->base_url, "http://HOST:PORT (instead of --host/--port)");
      app.add_option("--model", o->load.model, "model name to send (default: the first of GET /v1/models)");
      app.add_option("--api-key", o->load.api_key);
      app.add_option("--tokenizer", o->tokenizer, "directory with tokenizer.json (prompts, retokenized counts)")
          ->capture_default_str();
      app.add_option("--dataset-name", o->dataset_name, "random or sharegpt")
          ->capture_default_str()
          ->check(CLI::IsMember({"random", "sharegpt"}));
      app.add_option("--dataset-path", o->dataset_path, "ShareGPT-format JSON file");
      app.add_option("--num-prompts", o->num_prompts)->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--sharegpt-output-len", o->sharegpt_output_len, "fixed output length (default: the reply's)");
      app.add_option("--random-input-len", o->random_input_len)->capture_default_str();
      app.add_option("--random-output-len", o->random_output_len)->capture_default_str();
      app.add_option("--random-range-ratio", o->random_range_ratio, "lengths uniform in [len * ratio, len]")
          ->capture_default_str();
      app.add_option("--request-rate", o->request_rate, "requests/s (Poisson arrivals) or inf")
          ->capture_default_str();
      app.add_option("--max-concurrency", o->load.max_concurrency, "requests in flight at most (0: no limit)")
          ->capture_default_str();
      app.add_option("--seed", o->load.seed)->capture_default_str();
      app.add_option("--warmup-requests", o->warmup_requests)->capture_default_str();
      app.add_option("--output-file", o->output_file, "append the results as one JSON line");
      app.add_flag("--disable-ignore-eos", o->disable_ignore_eos,
                   "do not send ignore_eos (for servers that reject the extension)");
      return [=]() { return run_bench_serving(*o); };
    });

}  // namespace
}  // namespace mlaserve::cli
