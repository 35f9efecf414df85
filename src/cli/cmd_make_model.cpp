// mlaserve make-model: a random-weight checkpoint in DeepSeek's layout.
#include <fmt/format.h>

#include "cli/command.h"
#include "io/checkpoint.h"
#include "io/make_model.h"
#include "io/model_presets.h"
#include "io/progress.h"

namespace mlaserve::cli {
namespace {

std::string preset_help() {
  std::string h = "model shape:";
  for (const ModelPreset& p : model_presets()) h += fmt::format("\n  {:9} {}", p.name, p.description);
  return h;
}

CommandRegistration make_model_command(
    "make-model", "write a random-weight checkpoint in DeepSeek's Hugging Face layout", [](CLI::App& app) {
      auto o = std::make_shared<MakeModelOptions>();
      auto dtype = std::make_shared<std::string>();
      auto layers = std::make_shared<int>(0);
      auto mtp_layers = std::make_shared<int>(0);
      auto max_shard_mb = std::make_shared<uint64_t>(5000);
      app.add_option("--preset", o->preset, preset_help())->required();
      app.add_option("--out", o->out_dir, "output directory")->required();
      app.add_option("--seed", o->seed, "random seed; the same seed gives the same bytes")->capture_default_str();
      auto* dtype_opt = app.add_option("--dtype", *dtype, "bf16 or fp8 (block FP8 as DeepSeek-V3); default: the "
                                                          "preset's")
                            ->check(CLI::IsMember({"bf16", "fp8"}));
      auto* layers_opt = app.add_option("--layers", *layers, "override num_hidden_layers")->check(CLI::PositiveNumber);
      auto* mtp_opt = app.add_option("--mtp-layers", *mtp_layers, "override num_nextn_predict_layers")
                          ->check(CLI::NonNegativeNumber);
      app.add_option("--tokenizer-dir", o->tokenizer_dir,
                     "where tokenizer.json and tokenizer_config.json are (default: assets/tokenizer)");
      app.add_option("--max-shard-mb", *max_shard_mb, "largest shard in MB (1 MB = 10^6 bytes)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      return [=]() {
        if (dtype_opt->count()) o->dtype = *dtype;
        if (layers_opt->count()) o->layers = *layers;
        if (mtp_opt->count()) o->mtp_layers = *mtp_layers;
        o->max_shard_bytes = *max_shard_mb * 1'000'000ull;
        make_model(*o);
        Checkpoint ck = Checkpoint::open(o->out_dir);
        ck.validate_against_config();
        fmt::print("wrote {}: {} tensors, {} in {} shard(s)\n", o->out_dir.string(), ck.names().size(),
                   format_bytes(double(ck.total_bytes())), ck.shard_paths().size());
        return 0;
      };
    });

}  // namespace
}  // namespace mlaserve::cli
