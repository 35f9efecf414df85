#include "io/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/fp8_block_quant.h"
#include "io/progress.h"
#include "io/safetensors.h"

namespace mlaserve {

struct Checkpoint::Shard {
  std::shared_ptr<SafetensorsFile> file;
};

namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

// Shard names come from a file we do not control: keep them inside the
// checkpoint directory.
void check_shard_name(const std::string& shard, const std::string& tensor, const std::string& index) {
  MLA_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
            "{}: tensor '{}' maps to shard '{}', which is not a plain file name", index, tensor, shard);
}

bool is_float_dtype(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

}  // namespace

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  ck.config_ = load_model_config(dir);

  auto open_shard = [&](const std::string& file) -> Shard& {
    auto it = ck.shards_.find(file);
    if (it == ck.shards_.end()) {
      auto shard = std::make_shared<Shard>();
      shard->file = SafetensorsFile::open(dir / file);
      it = ck.shards_.emplace(file, std::move(shard)).first;
    }
    return *it->second;
  };
  auto add_tensor = [&](const std::string& file, const SafetensorsEntry& e) {
    ck.tensors_[e.name] = TensorInfo{e.name, file, e.dtype, e.shape};
  };

  const std::filesystem::path index_path = dir / kIndexFile;
  if (std::filesystem::exists(index_path)) {
    const std::string index = index_path.string();
    nlohmann::json j;
    {
      std::ifstream in(index_path);
      MLA_CHECK(in.good(), "cannot read {}", index);
      try {
        j = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        fail("{}: invalid JSON: {}", index, e.what());
      }
    }
    MLA_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
              "{}: missing 'weight_map' object", index);
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string& name = it.key();
      MLA_CHECK(it.value().is_string(), "{}: weight_map entry for tensor '{}' must be a file name", index, name);
      const std::string file = it.value().get<std::string>();
      check_shard_name(file, name, index);
      MLA_CHECK(std::filesystem::exists(dir / file), "{}: tensor '{}' maps to shard '{}', which does not exist",
                index, name, file);
      Shard& shard = open_shard(file);
      auto e = shard.file->tensors().find(name);
      MLA_CHECK(e != shard.file->tensors().end(), "{}: tensor '{}' maps to shard '{}', which does not contain it",
                index, name, file);
      add_tensor(file, e->second);
    }
    // Every tensor a shard holds must be the one the index points at.
    for (auto& [file, shard] : ck.shards_) {
      for (auto& [name, e] : shard->file->tensors()) {
        auto it = ck.tensors_.find(name);
        MLA_CHECK(it != ck.tensors_.end(), "{}: tensor '{}' is not listed in {}", (dir / file).string(), name,
                  kIndexFile);
        MLA_CHECK(it->second.file == file, "{}: tensor '{}' is also in shard '{}', but {} maps it to '{}'",
                  (dir / file).string(), name, file, kIndexFile, it->second.file);
      }
    }
    if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("total_size") &&
        j["metadata"]["total_size"].is_number_unsigned()) {
      uint64_t declared = j["metadata"]["total_size"].get<uint64_t>();
      if (declared != ck.total_bytes()) {
        spdlog::warn("{}: metadata.total_size is {} but the tensors hold {} bytes", index, declared, ck.total_bytes());
      }
    }
  } else if (std::filesystem::exists(dir / kSingleFile)) {
    Shard& shard = open_shard(kSingleFile);
    for (auto& [name, e] : shard.file->tensors()) add_tensor(kSingleFile, e);
  } else {
    fail("{}: no {} or {} (not a safetensors checkpoint directory)", dir.string(), kIndexFile, kSingleFile);
  }
  return ck;
}

bool Checkpoint::has(const std::string& name) const { return tensors_.count(name) > 0; }

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = tensors_.find(name);
  MLA_CHECK(it != tensors_.end(), "{}: tensor '{}' is not in the checkpoint", dir_.string(), name);
  return it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  r.reserve(tensors_.size());
  for (auto& [name, _] : tensors_) r.push_back(name);
  return r;
}

Tensor Checkpoint::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const std::shared_ptr<SafetensorsFile>& f = shards_.at(ti.file)->file;
  const SafetensorsEntry& e = f->tensors().at(name);
  // The mapping is read-only (PROT_READ): views must not be written to.
  return Tensor::wrap(const_cast<uint8_t*>(f->data(e)), e.shape, e.dtype, Device::CPU, f);
}

Tensor Checkpoint::get(const std::string& name, DType expected_dtype, const Shape& expected_shape) const {
  const TensorInfo& ti = info(name);
  MLA_CHECK(ti.dtype == expected_dtype, "{}: tensor '{}' has dtype {}, expected {}", (dir_ / ti.file).string(), name,
            dtype_name(ti.dtype), dtype_name(expected_dtype));
  MLA_CHECK(ti.shape == expected_shape, "{}: tensor '{}' has shape {}, expected {}", (dir_ / ti.file).string(), name,
            shape_str(ti.shape), shape_str(expected_shape));
  return get(name);
}

void Checkpoint::validate_against_config() const {
  std::set<std::string> accounted;
  const std::string cfg = (dir_ / "config.json").string();
  for (const ExpectedTensor& x : expected_tensors(config_)) {
    MLA_CHECK(has(x.name), "{}: tensor '{}' (shape {}) implied by {} is missing", dir_.string(), x.name,
              shape_str(x.shape), cfg);
    const TensorInfo& ti = info(x.name);
    const std::string file = (dir_ / ti.file).string();
    MLA_CHECK(ti.shape == x.shape, "{}: tensor '{}' has shape {}, but {} implies {}", file, x.name,
              shape_str(ti.shape), cfg, shape_str(x.shape));
    accounted.insert(x.name);
    if (ti.dtype == DType::F8_E4M3) {
      MLA_CHECK(x.fp8_quantized, "{}: tensor '{}' is F8_E4M3, but DeepSeek checkpoints keep it in {}", file, x.name,
                dtype_name(x.dtype));
      MLA_CHECK(config_.quantization_config.has_value(),
                "{}: tensor '{}' is F8_E4M3, but {} has no quantization_config", file, x.name, cfg);
      const QuantizationConfig& q = *config_.quantization_config;
      const std::string scale = scale_inv_name(x.name);
      MLA_CHECK(has(scale), "{}: FP8 tensor '{}' has no '{}' (its block scales)", file, x.name, scale);
      const TensorInfo& si = info(scale);
      Shape want = fp8_scale_shape(x.shape[0], x.shape[1], q.weight_block_n, q.weight_block_k);
      MLA_CHECK(si.dtype == DType::F32, "{}: tensor '{}' has dtype {}, expected F32", (dir_ / si.file).string(), scale,
                dtype_name(si.dtype));
      MLA_CHECK(si.shape == want, "{}: tensor '{}' has shape {}, but a {} weight in {}x{} blocks needs {}",
                (dir_ / si.file).string(), scale, shape_str(si.shape), shape_str(x.shape), q.weight_block_n,
                q.weight_block_k, shape_str(want));
      accounted.insert(scale);
    } else {
      MLA_CHECK(is_float_dtype(ti.dtype), "{}: tensor '{}' has dtype {}, expected BF16, F16 or F32{}", file, x.name,
                dtype_name(ti.dtype), x.fp8_quantized && config_.quantization_config ? " or F8_E4M3" : "");
    }
  }
  for (auto& [name, ti] : tensors_) {
    if (accounted.count(name)) continue;
    bool orphan_scale = name.size() > 10 && name.ends_with("_scale_inv");
    fail("{}: tensor '{}' is not part of the model {} describes{}", (dir_ / ti.file).string(), name, cfg,
         orphan_scale ? " (a scale whose weight is missing or not FP8)" : " (extra tensor)");
  }
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (auto& [name, ti] : tensors_) total += size_t(shape_numel(ti.shape)) * dtype_size(ti.dtype);
  return total;
}

std::vector<std::filesystem::path> Checkpoint::shard_paths() const {
  std::vector<std::filesystem::path> r;
  for (auto& [file, _] : shards_) r.push_back(dir_ / file);
  return r;
}

void Checkpoint::prefetch() const {
  // Work items of 64 MB keep all cores faulting pages in without making the
  // progress line jumpy.
  constexpr uint64_t kChunk = 64ull << 20;
  struct Chunk {
    const uint8_t* p;
    uint64_t n;
  };
  std::vector<Chunk> chunks;
  uint64_t total = 0;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  for (auto& [file, shard] : shards_) {
    const uint8_t* base = shard->file->data_buffer();
    uint64_t size = shard->file->data_size();
    if (size == 0) continue;
    uintptr_t aligned = uintptr_t(base) & ~(page - 1);
    // Advice only: a failure costs speed, not correctness.
    ::madvise(reinterpret_cast<void*>(aligned), size + (uintptr_t(base) - aligned), MADV_WILLNEED);
    for (uint64_t off = 0; off < size; off += kChunk) chunks.push_back({base + off, std::min(kChunk, size - off)});
    total += size;
  }
  ByteProgress progress("loading " + dir_.string(), total);
  parallel_for(int64_t(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint8_t sink = 0;
      for (uint64_t off = 0; off < chunks[i].n; off += page) sink ^= *(volatile const uint8_t*)(chunks[i].p + off);
      (void)sink;
      progress.add(chunks[i].n);
    }
  });
  progress.finish();
}

}  // namespace mlaserve
