#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mlaserve {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; real DeepSeek
// shards have headers of a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool read_u64(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return false;
  *out = v.get<uint64_t>();
  return true;
}

SafetensorsEntry parse_entry(const std::string& name, const json& v, const std::string& file) {
  MLA_CHECK(v.is_object(), "{}: header entry for tensor '{}' must be an object", file, name);
  SafetensorsEntry e;
  e.name = name;
  MLA_CHECK(v.contains("dtype") && v["dtype"].is_string(), "{}: tensor '{}' has no string 'dtype'", file, name);
  std::string dt = v["dtype"].get<std::string>();
  MLA_CHECK(parse_dtype(dt, &e.dtype), "{}: tensor '{}' has unsupported dtype '{}'", file, name, dt);

  MLA_CHECK(v.contains("shape") && v["shape"].is_array(), "{}: tensor '{}' has no 'shape' list", file, name);
  uint64_t numel = 1;
  for (const json& d : v["shape"]) {
    uint64_t x;
    MLA_CHECK(read_u64(d, &x), "{}: tensor '{}' has a shape entry that is not a non-negative integer", file, name);
    MLA_CHECK(x <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(numel, x, &numel),
              "{}: tensor '{}' has a shape whose element count overflows", file, name);
    e.shape.push_back(int64_t(x));
  }
  uint64_t expected_bytes;
  MLA_CHECK(!__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &expected_bytes),
            "{}: tensor '{}' is too large", file, name);

  const json* offs = v.contains("data_offsets") ? &v["data_offsets"] : nullptr;
  MLA_CHECK(offs && offs->is_array() && offs->size() == 2 && read_u64((*offs)[0], &e.begin) &&
                read_u64((*offs)[1], &e.end),
            "{}: tensor '{}' needs 'data_offsets' as two non-negative integers", file, name);
  MLA_CHECK(e.begin <= e.end, "{}: tensor '{}' has data_offsets [{}, {}] with begin after end", file, name, e.begin,
            e.end);
  MLA_CHECK(e.nbytes() == expected_bytes,
            "{}: tensor '{}' has data_offsets [{}, {}] spanning {} bytes, but {} {} needs {} bytes", file, name,
            e.begin, e.end, e.nbytes(), dt, shape_str(e.shape), expected_bytes);
  return e;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                           const std::string& file) {
  json j;
  try {
    j = json::parse(header_json.begin(), header_json.end());
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
  MLA_CHECK(j.is_object(), "{}: header must be a JSON object", file);
  SafetensorsHeader h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      MLA_CHECK(it.value().is_object(), "{}: '__metadata__' must be an object of strings", file);
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        MLA_CHECK(m.value().is_string(), "{}: '__metadata__' value for '{}' must be a string", file, m.key());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.tensors.emplace(it.key(), parse_entry(it.key(), it.value(), file));
  }

  // The tensors must tile [0, data_size): sorted by offset, each begins where
  // the previous one ended. Zero-sized tensors may sit anywhere in range.
  std::vector<const SafetensorsEntry*> order;
  for (auto& [name, e] : h.tensors) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : order) {
    MLA_CHECK(e->end <= data_size,
              "{}: tensor '{}' has data_offsets [{}, {}] beyond the data buffer of {} bytes (file truncated?)", file,
              e->name, e->begin, e->end, data_size);
    if (e->nbytes() == 0) continue;
    MLA_CHECK(e->begin >= covered, "{}: tensor '{}' at [{}, {}] overlaps tensor '{}' ending at {}", file, e->name,
              e->begin, e->end, prev ? prev->name : "", covered);
    MLA_CHECK(e->begin == covered, "{}: tensor '{}' starts at {} leaving a hole after byte {}", file, e->name,
              e->begin, covered);
    covered = e->end;
    prev = e;
  }
  MLA_CHECK(covered == data_size, "{}: the data buffer has {} bytes but its tensors cover only {} (trailing bytes)",
            file, data_size, covered);
  return h;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const std::string name = path.string();
  int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  MLA_CHECK(fd >= 0, "cannot open {}: {}", name, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat {}: {}", name, std::strerror(err));
  }
  f->size_ = uint64_t(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    MLA_CHECK(p != MAP_FAILED, "cannot mmap {}: {}", name, std::strerror(err));
    f->base_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }

  MLA_CHECK(f->size_ >= 8, "{}: file is {} bytes, too short for the 8-byte header length (truncated?)", name,
            f->size_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f->base_[i];  // little-endian
  MLA_CHECK(header_len <= kMaxHeaderBytes, "{}: header length {} exceeds the {} byte limit (corrupt file?)", name,
            header_len, kMaxHeaderBytes);
  MLA_CHECK(header_len <= f->size_ - 8, "{}: header length {} runs past the end of the {} byte file (truncated?)",
            name, header_len, f->size_);
  f->data_start_ = 8 + header_len;
  std::string_view header(reinterpret_cast<const char*>(f->base_ + 8), header_len);
  f->header_ = parse_safetensors_header(header, f->data_size(), name);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

}  // namespace mlaserve
