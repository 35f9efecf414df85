#include "io/make_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/fp8_block_quant.h"
#include "io/model_presets.h"
#include "io/portable_random.h"
#include "io/progress.h"
#include "io/safetensors_writer.h"

namespace mlaserve {
namespace {

// Rows are generated in blocks of this many, each from its own random
// stream, so blocks can be made in parallel and the bytes never depend on
// the thread count. 128 is also DeepSeek's FP8 block height.
constexpr int64_t kRowsPerStream = 128;

// One tensor to write, with its FP8 block scales when quantized.
struct PlannedTensor {
  ExpectedTensor expected;
  TensorSpec spec;
  std::optional<TensorSpec> scale;  // weight_scale_inv
  uint64_t nbytes() const { return spec.nbytes() + (scale ? scale->nbytes() : 0); }
};

struct PlannedShard {
  std::string file;
  std::vector<PlannedTensor> tensors;
};

std::vector<PlannedShard> plan_shards(const ModelConfig& c, uint64_t max_shard_bytes) {
  std::vector<PlannedShard> shards(1);
  uint64_t bytes = 0;
  for (ExpectedTensor& x : expected_tensors(c)) {
    PlannedTensor t;
    if (x.fp8_quantized && c.quantization_config) {
      const QuantizationConfig& q = *c.quantization_config;
      t.spec = {x.name, DType::F8_E4M3, x.shape};
      t.scale = TensorSpec{scale_inv_name(x.name), DType::F32,
                           fp8_scale_shape(x.shape[0], x.shape[1], q.weight_block_n, q.weight_block_k)};
    } else {
      t.spec = {x.name, x.dtype, x.shape};
    }
    t.expected = std::move(x);
    // A weight and its scales stay in one shard, as in DeepSeek's release.
    if (bytes > 0 && bytes + t.nbytes() > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    bytes += t.nbytes();
    shards.back().tensors.push_back(std::move(t));
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    shards[i].file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
  }
  return shards;
}

// model.safetensors or model-NNNNN-of-NNNNN.safetensors
bool is_checkpoint_shard_name(const std::string& f) {
  if (f == "model.safetensors") return true;
  if (f.size() != 32 || !f.starts_with("model-") || f.substr(11, 4) != "-of-" || !f.ends_with(".safetensors")) {
    return false;
  }
  auto digits = [&](size_t at) {
    return std::all_of(f.begin() + long(at), f.begin() + long(at) + 5, [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  return digits(6) && digits(15);
}

uint64_t stream_seed(uint64_t tensor_seed, int64_t block) {
  uint64_t st = tensor_seed ^ (uint64_t(block) * 0xd1b54a32d192ed03ull);
  return splitmix64(st);
}

// Generates, converts and writes one tensor in slabs of row blocks.
void write_tensor(SafetensorsWriter& w, const PlannedTensor& t, const ModelConfig& c, uint64_t seed,
                  ByteProgress& progress) {
  const Shape& shape = t.spec.shape;
  const int64_t rows = shape.size() >= 2 ? shape[0] : 1;
  const int64_t cols = rows ? shape_numel(shape) / rows : 0;
  const bool fp8 = t.spec.dtype == DType::F8_E4M3;
  const int block_n = fp8 ? c.quantization_config->weight_block_n : int(kRowsPerStream);
  const int block_k = fp8 ? c.quantization_config->weight_block_k : 1;
  MLA_CHECK(!fp8 || block_n == kRowsPerStream, "make-model writes FP8 with 128-row blocks only, config asks {}",
            block_n);
  const size_t elem = dtype_size(t.spec.dtype);
  const WeightInit init = weight_init(t.spec.name, c.hidden_size);
  uint64_t name_state = seed ^ hash_name(t.spec.name);
  const uint64_t tensor_seed = splitmix64(name_state);

  const int64_t nblocks = (rows + kRowsPerStream - 1) / kRowsPerStream;
  const int64_t block_floats = kRowsPerStream * cols;
  // Slabs of about 64 MB of f32, and at least one block per thread.
  const int64_t slab_blocks =
      std::clamp<int64_t>(std::max<int64_t>((64ll << 20) / std::max<int64_t>(block_floats * 4, 1), cpu_threads()),
                          1, std::max<int64_t>(nblocks, 1));
  std::vector<uint8_t> out(size_t(slab_blocks * block_floats) * elem);
  const Shape scale_shape = fp8 ? fp8_scale_shape(rows, cols, block_n, block_k) : Shape{0, 0};
  std::vector<float> scales(size_t(shape_numel(scale_shape)));

  for (int64_t s0 = 0; s0 < nblocks; s0 += slab_blocks) {
    const int64_t s1 = std::min(nblocks, s0 + slab_blocks);
    parallel_for(s1 - s0, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> buf(static_cast<size_t>(block_floats));
      for (int64_t b = s0 + b0; b < s0 + b1; ++b) {
        const int64_t r0 = b * kRowsPerStream, nr = std::min(rows, r0 + kRowsPerStream) - r0;
        PortableRng rng(stream_seed(tensor_seed, b));
        for (int64_t i = 0; i < nr * cols; ++i) buf[size_t(i)] = float(init.mean + init.stddev * rng.normal());
        uint8_t* dst = out.data() + size_t((b - s0) * block_floats) * elem;
        if (fp8) {
          quantize_fp8_blocks(buf.data(), nr, cols, block_n, block_k, dst, scales.data() + b * scale_shape[1]);
        } else if (t.spec.dtype == DType::BF16) {
          auto* d = reinterpret_cast<uint16_t*>(dst);
          for (int64_t i = 0; i < nr * cols; ++i) d[i] = f32_to_bf16(buf[size_t(i)]);
        } else {
          MLA_CHECK(t.spec.dtype == DType::F32, "make-model cannot write tensor '{}' as {}", t.spec.name,
                    dtype_name(t.spec.dtype));
          std::copy(buf.begin(), buf.begin() + nr * cols, reinterpret_cast<float*>(dst));
        }
      }
    });
    const int64_t slab_rows = std::min(rows, s1 * kRowsPerStream) - s0 * kRowsPerStream;
    const uint64_t nbytes = uint64_t(slab_rows * cols) * elem;
    w.write(t.spec.name, uint64_t(s0 * block_floats) * elem, out.data(), nbytes);
    progress.add(nbytes);
  }
  if (fp8) {
    w.write(t.scale->name, 0, scales.data(), scales.size() * sizeof(float));
    progress.add(scales.size() * sizeof(float));
  }
}

void write_json(const std::filesystem::path& p, const nlohmann::json& j) {
  std::ofstream f(p);
  f << j.dump(2) << "\n";
  f.close();
  MLA_CHECK(f.good(), "cannot write {}", p.string());
}

}  // namespace

WeightInit weight_init(const std::string& name, int hidden_size) {
  if (name.ends_with("norm.weight")) return {1.0, 0.1};
  if (name.ends_with("norm.bias")) return {0.0, 0.1};
  if (name.ends_with("e_score_correction_bias")) return {0.0, 0.05};
  // Logits of unit scale keep greedy decoding robust to rounding differences
  // between implementations (std 0.02 gives near-ties at small widths).
  if (name == "lm_head.weight" || name.ends_with("shared_head.head.weight")) {
    return {0.0, 1.0 / std::sqrt(double(hidden_size))};
  }
  return {0.0, 0.02};
}

ModelConfig make_model_config(const MakeModelOptions& o) {
  const ModelPreset& preset = find_model_preset(o.preset);
  ModelConfig c = preset.config;
  if (o.layers) {
    MLA_CHECK(*o.layers >= 1, "--layers must be at least 1, got {}", *o.layers);
    c.num_hidden_layers = *o.layers;
  }
  if (o.mtp_layers) {
    MLA_CHECK(*o.mtp_layers >= 0, "--mtp-layers must be at least 0, got {}", *o.mtp_layers);
    c.num_nextn_predict_layers = *o.mtp_layers;
  }
  std::string dtype = o.dtype.value_or(preset.fp8_by_default ? "fp8" : "bf16");
  MLA_CHECK(dtype == "bf16" || dtype == "fp8", "--dtype must be bf16 or fp8, got '{}'", dtype);
  if (dtype == "fp8") c.quantization_config = deepseek_fp8_quantization();
  // Round-trip through the parser: the config we write is one we accept.
  return parse_model_config(model_config_to_json(c), "preset " + o.preset);
}

void write_random_checkpoint(const ModelConfig& c, const std::filesystem::path& out_dir, uint64_t seed,
                             uint64_t max_shard_bytes) {
  std::filesystem::create_directories(out_dir);
  // A stale config.json would make a half-written directory look complete,
  // and shards of an earlier, differently sharded model would linger.
  std::filesystem::remove(out_dir / "config.json");
  for (const auto& entry : std::filesystem::directory_iterator(out_dir)) {
    if (is_checkpoint_shard_name(entry.path().filename().string())) std::filesystem::remove(entry.path());
  }

  std::vector<PlannedShard> shards = plan_shards(c, max_shard_bytes);
  uint64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const PlannedShard& s : shards) {
    for (const PlannedTensor& t : s.tensors) {
      total += t.nbytes();
      weight_map[t.spec.name] = s.file;
      if (t.scale) weight_map[t.scale->name] = s.file;
    }
  }
  {
    ByteProgress progress("writing " + out_dir.string(), total);
    for (const PlannedShard& s : shards) {
      std::vector<TensorSpec> specs;
      for (const PlannedTensor& t : s.tensors) {
        specs.push_back(t.spec);
        if (t.scale) specs.push_back(*t.scale);
      }
      SafetensorsWriter w(out_dir / s.file, specs, {{"format", "pt"}});
      for (const PlannedTensor& t : s.tensors) write_tensor(w, t, c, seed, progress);
      w.finish();
    }
  }
  // DeepSeek writes the index even for a single shard.
  write_json(out_dir / "model.safetensors.index.json",
             {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  nlohmann::json gen = {{"_from_model_config", true}, {"do_sample", true}, {"temperature", 0.6}, {"top_p", 0.95}};
  gen["bos_token_id"] = c.bos_token_id ? nlohmann::json(*c.bos_token_id) : nlohmann::json(nullptr);
  gen["eos_token_id"] = c.eos_token_id ? nlohmann::json(*c.eos_token_id) : nlohmann::json(nullptr);
  write_json(out_dir / "generation_config.json", gen);
  write_json(out_dir / "config.json", model_config_to_json(c));
}

std::filesystem::path default_tokenizer_dir() {
  std::filesystem::path local = std::filesystem::current_path() / "assets" / "tokenizer";
  if (std::filesystem::exists(local / "tokenizer.json")) return local;
  return std::filesystem::path(MLASERVE_SOURCE_DIR) / "assets" / "tokenizer";
}

void make_model(const MakeModelOptions& o) {
  MLA_CHECK(!o.out_dir.empty(), "make-model needs an output directory (--out)");
  ModelConfig c = make_model_config(o);
  std::filesystem::path tok = o.tokenizer_dir.empty() ? default_tokenizer_dir() : o.tokenizer_dir;
  // Check the tokenizer before spending minutes on weights.
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    MLA_CHECK(std::filesystem::exists(tok / f),
              "tokenizer file {} not found: run scripts/setup.sh (or `make setup`) to fetch the DeepSeek-V3 "
              "tokenizer, or pass --tokenizer-dir",
              (tok / f).string());
  }
  std::filesystem::create_directories(o.out_dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(tok / f, o.out_dir / f, std::filesystem::copy_options::overwrite_existing);
  }
  write_random_checkpoint(c, o.out_dir, o.seed, o.max_shard_bytes);
}

}  // namespace mlaserve
