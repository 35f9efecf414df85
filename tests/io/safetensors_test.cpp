#include "io/safetensors.h"

#include <fstream>
#include <iterator>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/safetensors_writer.h"

namespace mlaserve {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mlaserve_safetensors_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes a file byte by byte as the format describes, independently of
  // SafetensorsWriter: u64 LE header length (or `declared_len`), header, data.
  std::filesystem::path write_raw(const std::string& header, size_t data_bytes,
                                  std::optional<uint64_t> declared_len = std::nullopt) {
    auto p = dir_ / "t.safetensors";
    std::ofstream f(p, std::ios::binary);
    uint64_t n = declared_len.value_or(header.size());
    for (int i = 0; i < 8; ++i) f.put(char(n >> (8 * i)));
    f << header;
    for (size_t i = 0; i < data_bytes; ++i) f.put(char(i));
    return p;
  }

  std::string open_error(const std::filesystem::path& p) {
    try {
      SafetensorsFile::open(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  std::filesystem::path dir_;
};

TEST_F(SafetensorsTest, ReadsWhatTheFormatDescribes) {
  // A: 2x3 BF16 (12 bytes) at [0, 12), B: 4 F32 at [12, 28), C: empty.
  auto p = write_raw(R"({"__metadata__":{"format":"pt"},)"
                     R"("A":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                     R"("B":{"dtype":"F32","shape":[4],"data_offsets":[12,28]},)"
                     R"("C":{"dtype":"F8_E4M3","shape":[0,5],"data_offsets":[28,28]}})",
                     28);
  auto f = SafetensorsFile::open(p);
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const SafetensorsEntry& a = f->tensors().at("A");
  EXPECT_EQ(a.dtype, DType::BF16);
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  const SafetensorsEntry& b = f->tensors().at("B");
  EXPECT_EQ(b.dtype, DType::F32);
  EXPECT_EQ(f->data(b)[0], 12);  // byte i of the data buffer holds i
  EXPECT_EQ(f->data(a)[11], 11);
  EXPECT_EQ(f->tensors().at("C").shape, (Shape{0, 5}));
}

TEST_F(SafetensorsTest, WriterRoundTrip) {
  auto p = dir_ / "w.safetensors";
  std::vector<TensorSpec> specs = {{"q", DType::F8_E4M3, {3, 5}},
                                   {"s", DType::F32, {1, 1}},
                                   {"w", DType::BF16, {2, 7}},
                                   {"i", DType::I64, {2}}};
  {
    SafetensorsWriter w(p, specs, {{"format", "pt"}});
    std::vector<uint8_t> q(15);
    for (int i = 0; i < 15; ++i) q[i] = uint8_t(i * 3);
    // Out of order and in pieces, as make-model streams them.
    w.write("q", 5, q.data() + 5, 10);
    w.write("q", 0, q.data(), 5);
    float s = 0.25f;
    w.write("s", 0, &s, 4);
    std::vector<uint16_t> bw(14);
    for (int i = 0; i < 14; ++i) bw[i] = f32_to_bf16(float(i) - 3.5f);
    w.write("w", 0, bw.data(), 28);
    int64_t iv[2] = {-1, 1ll << 40};
    w.write("i", 0, iv, 16);
    w.finish();
  }
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  for (const TensorSpec& s : specs) {
    const SafetensorsEntry& e = f->tensors().at(s.name);
    EXPECT_EQ(e.dtype, s.dtype) << s.name;
    EXPECT_EQ(e.shape, s.shape) << s.name;
    // Each tensor sits aligned to its element size.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data(e)) % dtype_size(s.dtype), 0u) << s.name;
  }
  EXPECT_EQ(f->data(f->tensors().at("q"))[14], 42);
  float s;
  std::memcpy(&s, f->data(f->tensors().at("s")), 4);
  EXPECT_EQ(s, 0.25f);
  uint16_t w6;
  std::memcpy(&w6, f->data(f->tensors().at("w")) + 12, 2);
  EXPECT_EQ(bf16_to_f32(w6), 2.5f);
  int64_t iv[2];
  std::memcpy(iv, f->data(f->tensors().at("i")), 16);
  EXPECT_EQ(iv[0], -1);
  EXPECT_EQ(iv[1], 1ll << 40);
}

TEST_F(SafetensorsTest, WriterRejectsIncompleteTensor) {
  auto p = dir_ / "w.safetensors";
  SafetensorsWriter w(p, {{"a", DType::F32, {4}}});
  float x[2] = {1, 2};
  w.write("a", 0, x, 8);
  try {
    w.finish();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'a'"), HasSubstr("8 of its 16 bytes")));
  }
  EXPECT_THROW(w.write("a", 12, x, 8), Error);  // overruns the tensor
}

TEST_F(SafetensorsTest, TruncatedBeforeHeaderLength) {
  auto p = dir_ / "short.safetensors";
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("short.safetensors"), HasSubstr("too short")));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  auto p = write_raw(R"({"A":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 1000);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("t.safetensors"), HasSubstr("header length 1000 runs past the end")));
  p = write_raw("{}", 0, uint64_t(1) << 62);
  EXPECT_THAT(open_error(p), HasSubstr("exceeds"));
}

TEST_F(SafetensorsTest, InvalidHeaderJson) {
  auto p = write_raw(R"({"A":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("t.safetensors"), HasSubstr("not valid JSON")));
  p = write_raw(R"([1,2])", 0);
  EXPECT_THAT(open_error(p), HasSubstr("header must be a JSON object"));
}

TEST_F(SafetensorsTest, BadEntries) {
  auto p = write_raw(R"({"A":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'A'"), HasSubstr("unsupported dtype 'Q4'")));
  p = write_raw(R"({"A":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'A'"), HasSubstr("shape")));
  p = write_raw(R"({"A":{"dtype":"F32","shape":[1]}})", 4);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'A'"), HasSubstr("data_offsets")));
  p = write_raw(R"({"A":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'A'"), HasSubstr("overflows")));
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  // The header promises 8 bytes of data; the file holds 4 (truncated data).
  auto p = write_raw(R"({"A":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("t.safetensors"), HasSubstr("'A'"), HasSubstr("beyond the data buffer")));
  p = write_raw(R"({"A":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'A'"), HasSubstr("begin after end")));
}

TEST_F(SafetensorsTest, OffsetsDisagreeWithDtypeTimesShape) {
  auto p = write_raw(R"({"A":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'A'"), HasSubstr("spanning 8 bytes"), HasSubstr("needs 6 bytes")));
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  auto p = write_raw(R"({"A":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("B":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     12);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'B'"), HasSubstr("overlaps tensor 'A'")));
}

TEST_F(SafetensorsTest, HoleBetweenTensors) {
  auto p = write_raw(R"({"A":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("B":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                     12);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'B'"), HasSubstr("hole")));
}

TEST_F(SafetensorsTest, TrailingBytes) {
  auto p = write_raw(R"({"A":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("t.safetensors"), HasSubstr("trailing")));
}

// Whatever the damage, opening either succeeds with a consistent header or
// throws mlaserve::Error: never a crash, never another exception type.
TEST_F(SafetensorsTest, CorruptedFilesNeverCrash) {
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("A":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                             R"("B":{"dtype":"F32","shape":[4],"data_offsets":[12,28]}})";
  auto good = write_raw(header, 28);
  std::string bytes;
  {
    std::ifstream f(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto p = dir_ / "bad.safetensors";
  auto try_open = [&](const std::string& content) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
    try {
      auto f = SafetensorsFile::open(p);
      uint64_t covered = 0;
      for (auto& [name, e] : f->tensors()) covered += e.nbytes();
      EXPECT_EQ(covered, f->data_size());
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("bad.safetensors"));
    }
  };
  for (size_t len = 0; len < bytes.size(); ++len) try_open(bytes.substr(0, len));  // every truncation
  uint64_t state = 12345;
  for (int i = 0; i < 300; ++i) {  // random byte overwrites in the length and header
    std::string b = bytes;
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    size_t pos = size_t(state >> 33) % (8 + header.size());
    b[pos] = char(state >> 17);
    try_open(b);
  }
}

TEST_F(SafetensorsTest, MissingFile) {
  EXPECT_THAT(open_error(dir_ / "nope.safetensors"), AllOf(HasSubstr("nope.safetensors"), HasSubstr("cannot open")));
}

}  // namespace
}  // namespace mlaserve
