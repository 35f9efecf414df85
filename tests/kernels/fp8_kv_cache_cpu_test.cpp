// The FP8 latent cache on the CPU reference backend: its layout, the
// quantization bound, and that every op touching the cache sees the same
// values through an fp8 cache as through an f32 cache holding the
// dequantized rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_fp8_kv_cache.h"
#include "kernels/fp8_kv_layout.h"

namespace mlaserve {
namespace {

Tensor random_f32(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::I32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

TEST(Fp8KvLayout, SlotSizesAndTheirInverse) {
  EXPECT_EQ((Fp8KvLayout{512, 64}.slot_bytes()), 656);
  EXPECT_EQ((Fp8KvLayout{512, 64}.rope_offset()), 528);
  EXPECT_EQ((Fp8KvLayout{32, 16}.slot_bytes()), 32 + 4 + 32);  // tiny: one narrow group
  EXPECT_EQ((Fp8KvLayout{136, 8}.num_groups()), 2);
  for (int L = 8; L <= 1024; L += 8)
    for (int R : {0, 2, 16, 64}) {
      const Fp8KvLayout l = fp8_kv_layout_for(L + R, Fp8KvLayout{L, R}.slot_bytes());
      EXPECT_EQ(l.kv_lora_rank, L) << "R " << R;
      EXPECT_EQ(l.rope_dim, R);
    }
  EXPECT_THROW(fp8_kv_layout_for(576, 1152), Error);
  EXPECT_THROW(check_fp8_kv_layout({36, 16}), Error);
}

// One e4m3 rounding: 3 mantissa bits give at most 2^-4 relative error for
// values in the normal range, and subnormals (below 2^-6 of the scale unit)
// at most half their spacing, 2^-10 scale units. k_pe is bf16-rounded.
TEST(Fp8KvCacheCpu, RoundTripWithinOneRounding) {
  std::mt19937 rng(3);
  for (const Fp8KvLayout l : {Fp8KvLayout{512, 64}, Fp8KvLayout{32, 16}, Fp8KvLayout{200, 8}}) {
    const Tensor rows = random_f32({5, l.row_width()}, rng, 3.0f);
    auto be = make_cpu_backend();
    Tensor cache = be->alloc({9, l.slot_bytes()}, DType::U8);
    const Tensor slots = i32_tensor({8, 0, 3, 5, 1});
    be->scatter_rows(cache, rows, slots);
    Tensor back = be->alloc({5, l.row_width()}, DType::F32);
    be->gather_rows(cache, slots, back);
    for (int64_t r = 0; r < 5; ++r) {
      const float* in = rows.data<float>() + r * l.row_width();
      const float* out = back.data<float>() + r * l.row_width();
      for (int64_t g = 0; g < l.num_groups(); ++g) {
        const int64_t c0 = g * 128, c1 = std::min<int64_t>(c0 + 128, l.kv_lora_rank);
        float amax = 0;
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(in[c]));
        const float unit = amax / 448.0f;
        for (int64_t c = c0; c < c1; ++c)
          ASSERT_LE(std::fabs(out[c] - in[c]), std::max(std::fabs(in[c]) * 0.0625f, unit * 0x1p-10f) * 1.0001f)
              << "L " << l.kv_lora_rank << " row " << r << " channel " << c;
      }
      for (int64_t c = l.kv_lora_rank; c < l.row_width(); ++c)
        ASSERT_EQ(out[c], bf16_to_f32(f32_to_bf16(in[c]))) << "k_pe channel " << c;
    }
  }
}

TEST(Fp8KvCacheCpu, RejectsRowsThatFitNoLayout) {
  auto be = make_cpu_backend();
  Tensor cache = be->alloc({4, 656}, DType::U8);
  Tensor rows = be->alloc({1, 500}, DType::F32);
  EXPECT_THROW(be->scatter_rows(cache, rows, i32_tensor({0})), Error);
  Tensor bad_slot_rows = be->alloc({1, 576}, DType::F32);
  EXPECT_THROW(be->scatter_rows(cache, bad_slot_rows, i32_tensor({4})), Error);
}

// The latent write into an fp8 cache stores exactly the f32 cache's row,
// quantized; the absorbed attention over the fp8 cache equals the one over an
// f32 cache holding the dequantized rows.
TEST(Fp8KvCacheCpu, LatentWriteAndAbsorbedAttentionSeeTheQuantizedRows) {
  const int64_t T = 6, L = 512, R = 64, H = 3, S = 10;
  const Fp8KvLayout l{int(L), int(R)};
  std::mt19937 rng(7);
  auto be = make_cpu_backend();
  const Tensor kv = random_f32({T, L + R}, rng), kv_norm = random_f32({L}, rng, 0.5f);
  Tensor inv_freq = Tensor::empty({R / 2}, DType::F32);
  for (int64_t i = 0; i < R / 2; ++i) inv_freq.data<float>()[i] = std::pow(10000.0f, -2.0f * float(i) / float(R));
  const Tensor positions = i32_tensor({0, 1, 2, 0, 1, 2});
  const Tensor out_slots = i32_tensor({4, 7, 1, 9, 0, 2});

  MlaPrepare p;
  p.kv = kv;
  p.kv_norm = kv_norm;
  p.cache = be->alloc({S, L + R}, DType::F32);
  be->mla_prepare(p, positions, out_slots, inv_freq, 1.0f);
  const Tensor f32_cache = p.cache;
  p.cache = be->alloc({S, l.slot_bytes()}, DType::U8);
  std::memset(p.cache.raw(), 0, size_t(p.cache.numel()));
  be->mla_prepare(p, positions, out_slots, inv_freq, 1.0f);
  const Tensor fp8_cache = p.cache;
  std::vector<uint8_t> want(size_t(l.slot_bytes()));
  Tensor dequant = be->alloc({S, L + R}, DType::F32);
  std::memset(dequant.raw(), 0, size_t(dequant.numel()) * 4);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = out_slots.data<int32_t>()[t];
    cpu::fp8_kv_store_row(f32_cache.data<float>() + s * (L + R), l, want.data());
    EXPECT_EQ(std::memcmp(want.data(), fp8_cache.data<uint8_t>() + s * l.slot_bytes(), want.size()), 0)
        << "slot " << s;
    cpu::fp8_kv_load_row(want.data(), l, dequant.data<float>() + s * (L + R));
  }

  // Two sequences of 3 tokens, all new: causal absorbed attention.
  ForwardBatch fb;
  fb.input_ids = {0, 0, 0, 0, 0, 0};
  fb.positions = {0, 1, 2, 0, 1, 2};
  fb.out_slots = {4, 7, 1, 9, 0, 2};
  fb.q_indptr = {0, 3, 6};
  fb.kv_indptr = {0, 3, 6};
  fb.kv_slots = {4, 7, 1, 9, 0, 2};
  fb.logit_rows = {2, 5};
  const DeviceBatch db = be->prepare_batch(fb);
  const Tensor q = random_f32({T, H, L + R}, rng, 0.05f);
  Tensor out_fp8 = be->alloc({T, H, L}, DType::F32), out_ref = be->alloc({T, H, L}, DType::F32);
  be->mla_attention_absorbed(q, fp8_cache, db, 0.07f, out_fp8);
  be->mla_attention_absorbed(q, dequant, db, 0.07f, out_ref);
  EXPECT_EQ(std::memcmp(out_fp8.raw(), out_ref.raw(), size_t(out_ref.numel()) * 4), 0);
}

}  // namespace
}  // namespace mlaserve
