#pragma once
// Writes one .safetensors file whose tensors are all declared up front, so
// the header goes first and tensor bytes can then be streamed in any order
// (pwrite at planned offsets) without holding the tensors in memory.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace mlaserve {

struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes() const { return uint64_t(shape_numel(shape)) * dtype_size(dtype); }
};

class SafetensorsWriter {
 public:
  // Creates (truncates) `path` and writes the header. Tensors are laid out by
  // element size, largest first (then in the given order), so every tensor
  // is aligned to its element size in the data buffer, and the header is
  // padded with spaces to a multiple of 8 bytes as the reference writer does.
  SafetensorsWriter(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes `n` bytes of tensor `name` starting `offset` bytes into it.
  // Thread-safe for disjoint ranges.
  void write(const std::string& name, uint64_t offset, const void* data, uint64_t n);
  // Checks every byte of every tensor was written, then closes the file.
  void finish();

 private:
  struct Slot {
    uint64_t begin, nbytes, written = 0;
  };
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, Slot> slots_;
};

}  // namespace mlaserve
