#pragma once
// Shared by the model tests: random checkpoints made on the fly by the io
// layer (deterministic from preset, dtype and seed, so CI needs no committed
// weights), and helpers to run a model over one sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/make_model.h"
#include "kernels/backend.h"
#include "model/deepseek_model.h"
#include "model/kv_cache.h"

namespace mlaserve::testing {

// A checkpoint in a fresh temporary directory, removed with the object.
class TempCheckpoint {
 public:
  TempCheckpoint(const std::string& preset, const std::string& dtype, uint64_t seed)
      : TempCheckpoint(config_of(preset, dtype), fmt::format("{}_{}", preset, dtype), seed) {}
  // Any config (a preset's with other widths, say); `name` tells the directories apart.
  TempCheckpoint(const ModelConfig& config, const std::string& name, uint64_t seed) {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("mlaserve_model_test_{}_{}_{}", name, seed, ::getpid());
    std::filesystem::remove_all(dir_);
    write_random_checkpoint(config, dir_, seed);
    ckpt_ = std::make_unique<Checkpoint>(Checkpoint::open(dir_));
  }
  static ModelConfig config_of(const std::string& preset, const std::string& dtype) {
    MakeModelOptions o;
    o.preset = preset;
    o.dtype = dtype;
    return make_model_config(o);
  }
  ~TempCheckpoint() {
    ckpt_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const Checkpoint& get() const { return *ckpt_; }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<Checkpoint> ckpt_;
};

// Logits rows as host floats {rows, vocab}.
struct Logits {
  int64_t rows = 0, vocab = 0;
  std::vector<float> v;
  std::span<const float> row(int64_t r) const { return {v.data() + r * vocab, size_t(vocab)}; }
};

// tiny in block-FP8 with V2/V3's per-head widths (Dn = Dv = 128, rope 64,
// kv_lora 128, q_lora 128) and hidden 256, 2 layers: every projection's K
// is a multiple of 128, so FP8 kernels run everywhere, and kv_b_proj's
// per-head parts are whole 128x128 blocks.
inline ModelConfig fp8_v3_head_widths_config() {
  ModelConfig c = TempCheckpoint::config_of("tiny", "fp8");
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 128;
  c.n_shared_experts = 2;
  c.num_hidden_layers = 2;
  c.num_nextn_predict_layers = 0;
  c.num_attention_heads = c.num_key_value_heads = 2;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 128;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  return c;
}

inline Logits to_logits(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  Logits l{h.dim(0), h.dim(1), std::vector<float>(h.data<float>(), h.data<float>() + h.numel())};
  return l;
}

// One forward of the whole sequence from an empty cache, logits for every position.
inline Logits full_sequence_logits(DeepseekModel& model, std::span<const int32_t> ids) {
  auto cache = allocate_kv_cache(model.backend(), model.config(), int(ids.size()));
  return to_logits(model.backend(), model.forward(contiguous_sequence_batch(ids, 0, true), cache));
}

inline double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// ||a - ref|| / ||ref|| of one row, in double.
inline double row_rel_l2(std::span<const float> a, std::span<const float> ref) {
  double n = 0, d = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    n += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    d += double(ref[i]) * ref[i];
  }
  return std::sqrt(n / d);
}

inline int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace mlaserve::testing
