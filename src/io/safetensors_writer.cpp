#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mlaserve {

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  std::vector<const TensorSpec*> order;
  for (const TensorSpec& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](auto* a, auto* b) { return dtype_size(a->dtype) > dtype_size(b->dtype); });

  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec* t : order) {
    MLA_CHECK(!slots_.count(t->name), "{}: tensor '{}' declared twice", path.string(), t->name);
    slots_[t->name] = Slot{offset, t->nbytes()};
    header[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->nbytes()}}};
    offset += t->nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  data_start_ = 8 + text.size();

  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MLA_CHECK(fd_ >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  MLA_CHECK(::pwrite(fd_, len, 8, 0) == 8 && ::pwrite(fd_, text.data(), text.size(), 8) == ssize_t(text.size()),
            "cannot write header of {}: {}", path.string(), std::strerror(errno));
  MLA_CHECK(::ftruncate(fd_, off_t(data_start_ + offset)) == 0, "cannot size {}: {}", path.string(),
            std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(const std::string& name, uint64_t offset, const void* data, uint64_t n) {
  if (n == 0) return;
  auto it = slots_.find(name);
  MLA_CHECK(it != slots_.end(), "{}: writing undeclared tensor '{}'", path_.string(), name);
  Slot& s = it->second;
  MLA_CHECK(offset + n <= s.nbytes, "{}: write of {} bytes at {} overruns tensor '{}' ({} bytes)", path_.string(), n,
            offset, name, s.nbytes);
  const char* p = static_cast<const char*>(data);
  uint64_t pos = data_start_ + s.begin + offset;
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, n, off_t(pos));
    if (w < 0 && errno == EINTR) continue;
    MLA_CHECK(w > 0, "cannot write tensor '{}' to {}: {}", name, path_.string(), std::strerror(errno));
    p += w;
    pos += uint64_t(w);
    n -= uint64_t(w);
    std::atomic_ref<uint64_t>(s.written).fetch_add(uint64_t(w));
  }
}

void SafetensorsWriter::finish() {
  for (auto& [name, s] : slots_) {
    MLA_CHECK(s.written == s.nbytes, "{}: tensor '{}' got {} of its {} bytes", path_.string(), name, s.written,
              s.nbytes);
  }
  int rc = ::close(fd_);
  fd_ = -1;
  MLA_CHECK(rc == 0, "cannot close {}: {}", path_.string(), std::strerror(errno));
}

}  // namespace mlaserve
