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

float dequantized(const Weight& w, int64_t row, int64_t col) {
  const int64_t K = w.w.dim(-1), kb = w.scale_inv.dim(1);
  return fp8e4m3_to_f32(w.w.data<uint8_t>()[row * K + col]) * w.scale_inv.data<float>()[(row / 128) * kb + col / 128];
}

TEST(MlaWeights, Fp8KvBProjOfWholeBlocksKeepsE4m3HeadWeightsWithTheirScales) {
  TempCheckpoint ckpt(fp8_v3_head_widths_config(), "fp8_heads", 3);
  auto be = make_cpu_backend();
  const MlaWeights w = load_decoder_layer(ckpt.get(), *be, 1).attn;
  const ModelConfig& c = ckpt.get().config();
  const int64_t H = c.num_attention_heads, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim, L = c.kv_lora_rank;
  ASSERT_TRUE(w.w_uk.is_fp8() && w.w_uv.is_fp8());
  EXPECT_TRUE(w.w_uk_transposed());
  ASSERT_EQ(w.w_uk.w.shape(), Shape({H, L, Dn}));
  ASSERT_EQ(w.w_uv.w.shape(), Shape({H, Dv, L}));
  const Weight kv_b{ckpt.get().get("model.layers.1.self_attn.kv_b_proj.weight"),
                    ckpt.get().get("model.layers.1.self_attn.kv_b_proj.weight_scale_inv")};
  int64_t wrong = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c_ = 0; c_ < L; ++c_) {
      for (int64_t d = 0; d < Dn; ++d)
        wrong += dequantized(w.w_uk, h * L + c_, d) != dequantized(kv_b, h * (Dn + Dv) + d, c_);
      for (int64_t d = 0; d < Dv; ++d)
        wrong += dequantized(w.w_uv, h * Dv + d, c_) != dequantized(kv_b, h * (Dn + Dv) + Dn + d, c_);
    }
  EXPECT_EQ(wrong, 0) << "values differ from kv_b_proj's";
}

TEST(MlaWeights, Fp8HeadWeightsGiveTheExpandedFormsLogits) {
  // f32 on both sides with the same dequantized weights: the forms differ
  // only in summation order (mla_forms_test's bound).
  TempCheckpoint ckpt(fp8_v3_head_widths_config(), "fp8_heads", 5);
  auto be = make_cpu_backend();
  DeepseekModel absorbed(ckpt.get(), *be, {MlaMode::Absorbed, false});
  DeepseekModel expanded(ckpt.get(), *be, {MlaMode::Expanded, false});
  const std::vector<int32_t> ids = {0, 17, 4242, 99, 1000, 5, 77, 31337};
  const Logits a = full_sequence_logits(absorbed, ids), e = full_sequence_logits(expanded, ids);
  double worst = 0;
  for (int64_t r = 0; r < a.rows; ++r) worst = std::max(worst, max_abs_diff(a.row(r), e.row(r)));
  std::printf("[mla-forms] fp8 heads: absorbed vs expanded max |diff| %.3g over %lld rows\n", worst,
              (long long)a.rows);
  EXPECT_LE(worst, 1e-4);
}

}  // namespace
}  // namespace mlaserve::testing
