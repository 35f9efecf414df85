// KV capacity planning and the cache format behind --kv-cache-dtype: an fp8
// cache's slots are 656 bytes at V3 widths against 1152 in bf16, so the same
// memory holds 1152/656 = 1.76x the tokens.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/model_presets.h"
#include "model/kv_cache.h"
#include "runtime/kv_capacity.h"

namespace mlaserve::runtime {
namespace {

const ModelConfig& v3_slice() { return find_model_preset("v3-slice").config; }

TEST(KvCacheFormat, FollowsTheFlagAndTheActivations) {
  const ModelConfig& c = v3_slice();
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::Auto);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), KvCacheDtype::BF16);
  EXPECT_THROW(parse_kv_cache_dtype("fp8"), Error);

  const KvCacheFormat fp8 = kv_cache_format(c, DType::BF16, KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(fp8.dtype, DType::U8);
  EXPECT_EQ(fp8.slot_bytes(), 656u);
  const KvCacheFormat bf16 = kv_cache_format(c, DType::BF16, KvCacheDtype::Auto);
  EXPECT_EQ(bf16.dtype, DType::BF16);
  EXPECT_EQ(bf16.slot_bytes(), 1152u);
  EXPECT_EQ(kv_cache_format(c, DType::F32, KvCacheDtype::Auto).slot_bytes(), 2304u);  // the CPU backend's f32 cache
  EXPECT_THROW(kv_cache_format(c, DType::F32, KvCacheDtype::BF16), Error);
  EXPECT_EQ(kv_cache_format(c, DType::F32, KvCacheDtype::Fp8E4M3).slot_bytes(), 656u);
}

TEST(KvCapacity, Fp8CacheHoldsMoreTokensInTheSameMemory) {
  const ModelConfig& c = v3_slice();
  KvCapacityRequest r;
  r.device = Device::CPU;
  r.act_dtype = DType::BF16;
  r.max_total_tokens = 1000;
  EXPECT_EQ(plan_kv_capacity(c, r).bytes_per_token, size_t(c.num_hidden_layers) * 1152);
  r.kv_cache_dtype = KvCacheDtype::Fp8E4M3;
  EXPECT_EQ(plan_kv_capacity(c, r).bytes_per_token, size_t(c.num_hidden_layers) * 656);

  // From --mem-fraction-static: the budget left after the weights, in slots.
  // At V3's 61 layers a token takes 70 KB, so host RAM up to ~140 GB stays
  // below the CPU pool's cap of 2^20 tokens.
  ModelConfig full = c;
  full.num_hidden_layers = 61;
  r.max_total_tokens.reset();
  r.mem_fraction_static = 0.5;
  r.weight_bytes = 0;
  r.kv_cache_dtype = KvCacheDtype::Auto;
  const KvCapacity bf16 = plan_kv_capacity(full, r);
  r.kv_cache_dtype = KvCacheDtype::Fp8E4M3;
  const KvCapacity fp8 = plan_kv_capacity(full, r);
  // The CPU pool is capped at 2^20 tokens; compare below the cap.
  if (bf16.tokens < (int64_t(1) << 20) && fp8.tokens < (int64_t(1) << 20)) {
    EXPECT_NEAR(double(fp8.tokens) / double(bf16.tokens), 1152.0 / 656.0, 1e-3);
  } else {
    EXPECT_GE(fp8.tokens, bf16.tokens);
  }
}

}  // namespace
}  // namespace mlaserve::runtime
