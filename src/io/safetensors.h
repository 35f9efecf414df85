#pragma once
// One .safetensors file, read through a read-only mmap. Layout: an 8-byte
// little-endian header length N, N bytes of JSON header
// {"__metadata__": {str: str}, name: {dtype, shape, data_offsets}}, then the
// data buffer; data_offsets are relative to the buffer's start, and the
// tensors must tile the buffer exactly (no overlaps, no holes), as the
// safetensors format requires.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"

namespace mlaserve {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
  uint64_t nbytes() const { return end - begin; }
};

// The parsed, validated header. Throws mlaserve::Error naming `file` (and the
// tensor) when the JSON is invalid, a dtype is unknown, offsets are out of
// range, overlap, leave holes, or do not match dtype x shape.
struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                           const std::string& file);

class SafetensorsFile {
 public:
  // Maps the file and validates its header (see parse_safetensors_header);
  // also rejects files too short for their header.
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t file_size() const { return size_; }
  uint64_t data_size() const { return size_ - data_start_; }

  // Start of a tensor's bytes inside the mapping (read-only memory).
  const uint8_t* data(const SafetensorsEntry& e) const { return base_ + data_start_ + e.begin; }
  const uint8_t* data_buffer() const { return base_ + data_start_; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  SafetensorsHeader header_;
};

}  // namespace mlaserve
