// Which MLA projections load as one stacked GEMM weight, and that the stack
// holds the checkpoint's rows in order.
#include <cstring>

#include "model/layer_weights.h"
#include "model_fixture.h"

namespace mlaserve::testing {
namespace {

// Row r of a host weight equals row r0 of another, byte for byte.
bool same_row(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb) {
  const size_t bytes = size_t(a.dim(1)) * dtype_size(a.dtype());
  return a.dim(1) == b.dim(1) && a.dtype() == b.dtype() &&
         std::memcmp(static_cast<const char*>(a.raw()) + ra * bytes, static_cast<const char*>(b.raw()) + rb * bytes,
                     bytes) == 0;
}

void expect_stacked(const char* preset, const char* q_name, int64_t q_rows) {
  TempCheckpoint ckpt(preset, "bf16", 3);
  auto be = make_cpu_backend();
  const DecoderLayerWeights layer = load_decoder_layer(ckpt.get(), *be, 1);
  const MlaWeights& w = layer.attn;
  const ModelConfig& c = ckpt.get().config();
  const int64_t kv_rows = c.kv_lora_rank + c.qk_rope_head_dim;
  ASSERT_TRUE(w.fused_qkv_a_proj.has_value()) << preset;
  EXPECT_FALSE(w.q_proj || w.q_a_proj || w.kv_a_proj_with_mqa) << "separate weights kept beside the stack";
  const Tensor& stacked = w.fused_qkv_a_proj->w;
  ASSERT_EQ(stacked.shape(), Shape({q_rows + kv_rows, c.hidden_size}));
  const Tensor q = ckpt.get().get(fmt::format("model.layers.1.self_attn.{}.weight", q_name));
  const Tensor kv = ckpt.get().get("model.layers.1.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_TRUE(same_row(stacked, 0, q, 0) && same_row(stacked, q_rows - 1, q, q_rows - 1));
  EXPECT_TRUE(same_row(stacked, q_rows, kv, 0) && same_row(stacked, q_rows + kv_rows - 1, kv, kv_rows - 1));
}

TEST(MlaWeights, QLoraAndKvAStackIntoOneWeight) { expect_stacked("tiny", "q_a_proj", 48); }

TEST(MlaWeights, QProjAndKvAStackIntoOneWeight) { expect_stacked("tiny-v2", "q_proj", 4 * (16 + 16)); }

TEST(MlaWeights, Fp8QPartEndingInsideAScaleBlockStaysSeparate) {
  // tiny's q_a_proj has 48 rows: a stacked kv_a would start inside the first
  // 128-row scale block, so the two keep their own weights and GEMMs.
  TempCheckpoint ckpt("tiny", "fp8", 3);
  auto be = make_cpu_backend();
  const MlaWeights w = load_decoder_layer(ckpt.get(), *be, 1).attn;
  EXPECT_FALSE(w.fused_qkv_a_proj.has_value());
  ASSERT_TRUE(w.q_a_proj && w.kv_a_proj_with_mqa);
  EXPECT_TRUE(w.q_a_proj->is_fp8());
  EXPECT_EQ(w.kv_a_proj_with_mqa->out_features(), 32 + 16);
}

}  // namespace
}  // namespace mlaserve::testing
