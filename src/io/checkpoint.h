#pragma once
// A model checkpoint directory as DeepSeek ships it: config.json plus one
// safetensors file or shards with model.safetensors.index.json. Files are
// mmapped; tensors are views into the mapping (no copy).
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"

namespace mlaserve {

struct TensorInfo {
  std::string name;
  std::string file;  // shard file name
  DType dtype;
  Shape shape;
};

class Checkpoint {
 public:
  // Opens and validates every shard header (offsets within the file, no
  // overlaps, sizes match dtype x shape, index consistent with shards).
  // Throws mlaserve::Error naming the file and tensor on any problem.
  static Checkpoint open(const std::filesystem::path& dir);

  const ModelConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws if missing
  std::vector<std::string> names() const;

  // A host view into the mapped file. Throws (naming file and tensor) if the
  // tensor is missing or its dtype/shape differ from what is expected.
  Tensor get(const std::string& name) const;
  Tensor get(const std::string& name, DType expected_dtype, const Shape& expected_shape) const;

  // Checks that the checkpoint holds exactly the tensors the config implies
  // (no missing, no extra), with the right shapes and dtypes, bf16/f32/f16 or
  // block-FP8 with matching weight_scale_inv.
  void validate_against_config() const;

  size_t total_bytes() const;

  // Reads every page of every shard once (in parallel), showing progress,
  // so later accesses (uploads, first forward) do not stall on disk. The
  // pages stay in the page cache: no second copy is made.
  void prefetch() const;
  std::vector<std::filesystem::path> shard_paths() const;

 private:
  struct Shard;
  std::filesystem::path dir_;
  ModelConfig config_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::shared_ptr<Shard>> shards_;
};

// The tensor names and shapes the config implies (the HF DeepSeek layout),
// with the dtype each has in a bf16 or block-FP8 checkpoint.
struct ExpectedTensor {
  std::string name;
  Shape shape;
  bool fp8_quantized;  // a linear weight that is FP8 in DeepSeek's release
  // Its dtype when not FP8, as released: BF16, except F32 for
  // e_score_correction_bias.
  DType dtype = DType::BF16;
};
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c);

// "x.weight" -> "x.weight_scale_inv", the block scales of an FP8 weight.
std::string scale_inv_name(const std::string& weight_name);

}  // namespace mlaserve
