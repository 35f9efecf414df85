// Tokenizer subcommands: `tokenize` and `detokenize` (JSON lines in, JSON
// lines out, for users checking what the model sees) and `bench-tokenizer`
// (single-thread encoding throughput on a corpus).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace mlaserve::cli {
namespace {

using tokenizer::Tokenizer;

constexpr const char* kModelPathHelp =
    "model directory (or any directory) holding tokenizer.json and optionally tokenizer_config.json";

void print_line(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);  // one answer per question, also when driven interactively
}

// Runs `handle` on each stdin line; stops at the first bad line with an error
// naming it, so the output stays a line-by-line prefix of the input.
template <typename Handler>
int for_each_input_line(const char* command, Handler handle) {
  std::string line;
  for (size_t number = 1; std::getline(std::cin, line); ++number) {
    try {
      print_line(handle(nlohmann::json::parse(line)));
    } catch (const nlohmann::json::parse_error& e) {
      std::fprintf(stderr, "%s: line %zu is not valid JSON: %s\n", command, number, e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: line %zu: %s\n", command, number, e.what());
      return 1;
    }
  }
  return 0;
}

const CommandRegistration tokenize_command{
    "tokenize", "Encode JSON strings (one per stdin line) into JSON arrays of token ids",
    [](CLI::App& app) {
      auto model_path = std::make_shared<std::string>("models/tiny");
      auto add_special = std::make_shared<bool>(false);
      app.add_option("--model-path", *model_path, kModelPathHelp)->capture_default_str();
      app.add_flag("--add-special-tokens", *add_special, "add BOS/EOS as tokenizer_config.json says");
      return [=]() {
        const Tokenizer tok = Tokenizer::load(*model_path);
        return for_each_input_line("tokenize", [&](const nlohmann::json& value) {
          MLA_CHECK(value.is_string(), "expected a JSON string, got {}", value.type_name());
          return nlohmann::json(tok.encode(value.get_ref<const std::string&>(), *add_special)).dump();
        });
      };
    }};

const CommandRegistration detokenize_command{
    "detokenize", "Decode JSON arrays of token ids (one per stdin line) into JSON strings",
    [](CLI::App& app) {
      auto model_path = std::make_shared<std::string>("models/tiny");
      auto skip_special = std::make_shared<bool>(false);
      app.add_option("--model-path", *model_path, kModelPathHelp)->capture_default_str();
      app.add_flag("--skip-special-tokens", *skip_special, "leave special tokens out of the text");
      return [=]() {
        const Tokenizer tok = Tokenizer::load(*model_path);
        return for_each_input_line("detokenize", [&](const nlohmann::json& value) {
          MLA_CHECK(value.is_array(), "expected a JSON array of token ids, got {}", value.type_name());
          std::vector<int32_t> ids;
          ids.reserve(value.size());
          for (size_t i = 0; i < value.size(); ++i) {
            const auto& element = value[i];
            MLA_CHECK(element.is_number_integer(), "element {} is not an integer token id: {}", i, element.dump());
            const auto id = element.get<int64_t>();
            // Hugging Face silently drops unknown ids; a user asking here wants
            // to know. Only unknown ids stand for no bytes at all.
            MLA_CHECK(id >= 0 && id < tok.vocab_size() && !tok.token_bytes(static_cast<int32_t>(id)).empty(),
                      "element {}: token id {} is not in the vocabulary (size {})", i, id, tok.vocab_size());
            ids.push_back(static_cast<int32_t>(id));
          }
          return nlohmann::json(tok.decode(ids, *skip_special)).dump();
        });
      };
    }};

std::vector<std::string> read_corpus(const std::string& path) {
  std::ifstream in(path);
  MLA_CHECK(in.good(), "cannot open corpus {}", path);
  std::vector<std::string> docs;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    try {
      docs.push_back(nlohmann::json::parse(line).get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      fail("{} line {}: expected a JSON string: {}", path, number, e.what());
    }
  }
  return docs;
}

const CommandRegistration bench_tokenizer_command{
    "bench-tokenizer", "Measure single-thread encoding throughput on a corpus (JSON string per line)",
    [](CLI::App& app) {
      auto model_path = std::make_shared<std::string>("models/tiny");
      auto corpus_path = std::make_shared<std::string>();
      auto repeats = std::make_shared<int>(3);
      app.add_option("--model-path", *model_path, kModelPathHelp)->capture_default_str();
      app.add_option("--corpus", *corpus_path, "JSON lines file, one document (a JSON string) per line")->required();
      app.add_option("--repeat", *repeats, "passes over the corpus; the first runs with a cold BPE cache")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      return [=]() {
        using Clock = std::chrono::steady_clock;
        const auto load_start = Clock::now();
        const Tokenizer tok = Tokenizer::load(*model_path);
        const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
        const std::vector<std::string> docs = read_corpus(*corpus_path);
        size_t bytes = 0;
        for (const auto& d : docs) bytes += d.size();

        std::vector<double> seconds;
        size_t tokens = 0;
        for (int pass = 0; pass < *repeats; ++pass) {
          tokens = 0;
          const auto start = Clock::now();
          for (const auto& d : docs) tokens += tok.encode(d, /*add_special_tokens=*/false).size();
          seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
          std::printf("pass %d: %.3f s, %.2f MB/s, %.0f tokens/s\n", pass, seconds.back(), bytes / 1e6 / seconds.back(),
                      tokens / seconds.back());
        }
        const double best = *std::min_element(seconds.begin(), seconds.end());
        const nlohmann::json summary = {
            {"docs", docs.size()},         {"bytes", bytes},
            {"tokens", tokens},            {"load_s", load_s},
            {"cold_s", seconds.front()},   {"best_s", best},
            {"cold_mb_per_s", bytes / 1e6 / seconds.front()},
            {"best_mb_per_s", bytes / 1e6 / best},
            {"best_tokens_per_s", tokens / best}};
        std::printf("%s\n", summary.dump().c_str());
        return 0;
      };
    }};

}  // namespace
}  // namespace mlaserve::cli
