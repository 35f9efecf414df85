// FP8 latent KV cache: store rows into scattered slots, read them back.
//
// Bounds: c_kv goes through one 1x128 e4m3 rounding (at most 2^-4 relative
// per element, ~2.5% RMS on these data): 4.5e-2; its bytes and scales must
// equal the host scheme's exactly. k_pe is stored in bf16 and must come
// back bit for bit; slots not written must keep their contents.
#include "kernels/cuda/fp8_kv_cache.h"

#include <cstring>

#include "fp8_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kOneRoundingTol = 4.5e-2;

TEST(Fp8KvCache, V3SlotIs656Bytes) {
  const Fp8KvLayout layout;
  EXPECT_EQ(layout.slot_bytes(), 656);
  EXPECT_EQ(layout.rope_offset(), 528);
}

TEST(Fp8KvCache, StoreThenLoadRoundTripsThroughTheScheme) {
  MLA_SKIP_WITHOUT_GPU();
  const Fp8KvLayout layout;
  const int width = layout.kv_lora_rank + layout.rope_dim, rows = 11, slots_total = 32;
  std::mt19937 rng(41);
  const auto x = random_activations(rows, width, rng);
  std::vector<int32_t> slots = {30, 2, 7, 19, 0, 31, 12, 5, 25, 9, 16};
  auto dx = upload(x), dslots = upload(slots);
  auto cache = poisoned(slots_total * layout.slot_bytes());
  fp8_kv_store(layout, dx.get<__nv_bfloat16>(), dslots.get<int32_t>(), rows, cache.get<uint8_t>(), nullptr);
  auto dout = poisoned(size_t(rows) * width * 2);
  fp8_kv_load(layout, cache.get<uint8_t>(), dslots.get<int32_t>(), rows, dout.get<__nv_bfloat16>(), nullptr);
  const auto out = download<uint16_t>(dout, size_t(rows) * width);
  const auto raw = download<uint8_t>(cache, slots_total * layout.slot_bytes());

  std::vector<float> latent_out, latent_in;
  std::vector<double> latent_exact;
  int64_t byte_mismatch = 0, rope_mismatch = 0;
  for (int r = 0; r < rows; ++r) {
    std::vector<float> in(layout.kv_lora_rank);
    for (int c = 0; c < layout.kv_lora_rank; ++c) in[c] = bf16_to_f32(x[r * width + c]);
    const HostQuantizedRow h = quantize_row_host(in.data(), layout.kv_lora_rank);
    const uint8_t* slot = &raw[slots[r] * layout.slot_bytes()];
    for (int c = 0; c < layout.kv_lora_rank; ++c) byte_mismatch += slot[c] != h.q[c];
    for (int g = 0; g < layout.kv_lora_rank / 128; ++g) {
      float s;
      std::memcpy(&s, slot + layout.scale_offset() + 4 * g, 4);
      EXPECT_EQ(s, h.scale[g]) << "scale of group " << g << " in slot " << slots[r];
    }
    for (int c = 0; c < layout.kv_lora_rank; ++c) {
      latent_out.push_back(bf16_to_f32(out[r * width + c]));
      latent_exact.push_back(in[c]);
    }
    for (int c = layout.kv_lora_rank; c < width; ++c) rope_mismatch += out[r * width + c] != x[r * width + c];
  }
  EXPECT_EQ(byte_mismatch, 0) << "e4m3 bytes differing from the host scheme";
  EXPECT_EQ(rope_mismatch, 0) << "k_pe must round-trip exactly";
  const std::vector<int> untouched = {1, 3, 4};
  for (int s : untouched)
    for (int64_t b = 0; b < layout.slot_bytes(); ++b) ASSERT_EQ(raw[s * layout.slot_bytes() + b], 0xff) << "slot " << s;
  const double err = rel_l2(latent_out, latent_exact);
  report_fp8("fp8 kv c_kv round trip", "11 rows, 512 + 64", err, kOneRoundingTol);
  EXPECT_LT(err, kOneRoundingTol);
}

}  // namespace
}  // namespace mlaserve::cuda::testing
