#include "model/layer_weights.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

namespace mlaserve {
namespace {

// Rows of a linear weight as f32 (block-FP8 rows times their scale_inv).
void host_weight_rows_f32(const Tensor& w, const Tensor& scale_inv, int64_t row, float* out) {
  const int64_t K = w.dim(1);
  switch (w.dtype()) {
    case DType::F32:
      for (int64_t k = 0; k < K; ++k) out[k] = w.data<float>()[row * K + k];
      return;
    case DType::BF16:
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(w.data<uint16_t>()[row * K + k]);
      return;
    case DType::F16:
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(w.data<uint16_t>()[row * K + k]);
      return;
    case DType::F8_E4M3: {
      const float* scale_row = scale_inv.data<float>() + (row / 128) * scale_inv.dim(1);
      for (int64_t k = 0; k < K; ++k) out[k] = fp8e4m3_to_f32(w.data<uint8_t>()[row * K + k]) * scale_row[k / 128];
      return;
    }
    default:
      fail("linear weight dtype {} not supported", dtype_name(w.dtype()));
  }
}

// A host f32 tensor rounded to bf16 when `dtype` is BF16 (round to nearest
// even, as the CUDA backend's own conversion), else as it is.
Tensor host_f32_as(const Tensor& f32, DType dtype) {
  if (dtype != DType::BF16) return f32;
  Tensor out = Tensor::empty(f32.shape(), DType::BF16);
  for (int64_t i = 0; i < f32.numel(); ++i) out.data<uint16_t>()[i] = f32_to_bf16(f32.data<float>()[i]);
  return out;
}

RouterParams routing_params(const ModelConfig& c) {
  RouterParams p;
  if (c.topk_method == "greedy") p.method = TopkMethod::Greedy;
  else if (c.topk_method == "group_limited_greedy") p.method = TopkMethod::GroupLimitedGreedy;
  else if (c.topk_method == "noaux_tc") p.method = TopkMethod::NoauxTc;
  else fail("config.json: unknown topk_method '{}' (greedy, group_limited_greedy, noaux_tc)", c.topk_method);
  if (c.scoring_func == "softmax") p.scoring = ScoringFunc::Softmax;
  else if (c.scoring_func == "sigmoid") p.scoring = ScoringFunc::Sigmoid;
  else fail("config.json: unknown scoring_func '{}' (softmax, sigmoid)", c.scoring_func);
  p.top_k = c.num_experts_per_tok;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  if (c.architecture == Architecture::DeepseekV2) {
    // DeepSeek-V2's gate: renormalize (top_k > 1 and norm_topk_prob) or scale, not both.
    p.renormalize = c.norm_topk_prob && c.num_experts_per_tok > 1;
    p.scaling = p.renormalize ? 1.0f : float(c.routed_scaling_factor);
  } else {
    // DeepSeek-V3's gate: renormalize if asked, then always scale.
    p.renormalize = c.norm_topk_prob;
    p.scaling = float(c.routed_scaling_factor);
  }
  return p;
}

// The rows of two linear weights `first` and `second` stacked into one
// (scale_inv rows too), or nullopt where they cannot share a GEMM: different
// dtypes or in_features, or block-FP8 with `first` ending inside a 128-row
// scale block.
std::optional<Weight> load_stacked_linear(const Checkpoint& ckpt, Backend& backend, const std::string& first,
                                          const std::string& second) {
  const Tensor a = ckpt.get(first + ".weight"), b = ckpt.get(second + ".weight");
  if (a.ndim() != 2 || b.ndim() != 2 || a.dtype() != b.dtype() || a.dim(1) != b.dim(1)) return std::nullopt;
  const bool fp8 = a.dtype() == DType::F8_E4M3;
  Tensor a_scale, b_scale;
  if (fp8) {
    a_scale = ckpt.get(first + ".weight_scale_inv");
    b_scale = ckpt.get(second + ".weight_scale_inv");
    if (a.dim(0) % 128 != 0 || a_scale.ndim() != 2 || b_scale.ndim() != 2 || a_scale.dim(1) != b_scale.dim(1) ||
        a_scale.dtype() != b_scale.dtype())
      return std::nullopt;
  }
  auto stack = [](const Tensor& top, const Tensor& bottom) {
    Tensor out = Tensor::empty({top.dim(0) + bottom.dim(0), top.dim(1)}, top.dtype());
    std::memcpy(out.raw(), top.raw(), top.nbytes());
    std::memcpy(static_cast<char*>(out.raw()) + top.nbytes(), bottom.raw(), bottom.nbytes());
    return out;
  };
  try {
    return backend.load_weight(stack(a, b), fp8 ? stack(a_scale, b_scale) : Tensor());
  } catch (const Error& e) {
    fail("{}.weight stacked on {}.weight: {}", second, first, e.what());
  }
}

MlpWeights load_mlp(const Checkpoint& ckpt, Backend& backend, const std::string& prefix) {
  MlpWeights w;
  w.gate_up_proj = load_stacked_linear(ckpt, backend, prefix + "gate_proj", prefix + "up_proj");
  if (!w.gate_up_proj) {
    w.gate_proj = load_linear(ckpt, backend, prefix + "gate_proj");
    w.up_proj = load_linear(ckpt, backend, prefix + "up_proj");
  }
  w.down_proj = load_linear(ckpt, backend, prefix + "down_proj");
  return w;
}

// A linear weight as the checkpoint stores it, on the host (for load_experts).
Weight host_linear(const Checkpoint& ckpt, const std::string& prefix) {
  const Tensor w = ckpt.get(prefix + ".weight");
  return Weight{w, w.dtype() == DType::F8_E4M3 ? ckpt.get(prefix + ".weight_scale_inv") : Tensor()};
}

// W_UK transposed per head {H, L, Dn} and W_UV {H, Dv, L} in e4m3 with their
// 128x128 block scales, from a block-FP8 kv_b_proj {H (Dn + Dv), L} whose
// per-head parts are whole blocks: the blocks move (W_UK's transposed within
// itself) and keep their scales, so nothing is requantized. Empty where the
// shape does not allow it or the backend does not keep FP8 weights.
std::optional<std::pair<Weight, Weight>> fp8_head_weights(Backend& backend, const Tensor& kv_b, const Tensor& scale,
                                                          int64_t H, int64_t Dn, int64_t Dv, int64_t L) {
  if (kv_b.dtype() != DType::F8_E4M3 || Dn % 128 || Dv % 128 || L % 128) return std::nullopt;
  const int64_t lb = L / 128, nb = Dn / 128, vb = Dv / 128, head_blocks = nb + vb;
  MLA_CHECK(scale.shape() == Shape({H * head_blocks, lb}), "kv_b_proj.weight_scale_inv: shape {} but [{}, {}] expected",
            shape_str(scale.shape()), H * head_blocks, lb);
  Tensor uk = Tensor::empty({H * L, Dn}, DType::F8_E4M3), uk_scale = Tensor::empty({H * lb, nb}, DType::F32);
  Tensor uv = Tensor::empty({H * Dv, L}, DType::F8_E4M3), uv_scale = Tensor::empty({H * vb, lb}, DType::F32);
  const uint8_t* src = kv_b.data<uint8_t>();
  const float* src_scale = scale.data<float>();
  for (int64_t h = 0; h < H; ++h) {
    const uint8_t* head = src + h * (Dn + Dv) * L;
    for (int64_t d = 0; d < Dn; ++d)
      for (int64_t c = 0; c < L; ++c) uk.data<uint8_t>()[(h * L + c) * Dn + d] = head[d * L + c];
    std::memcpy(uv.data<uint8_t>() + h * Dv * L, head + Dn * L, size_t(Dv * L));
    for (int64_t cb = 0; cb < lb; ++cb) {
      for (int64_t db = 0; db < nb; ++db)
        uk_scale.data<float>()[(h * lb + cb) * nb + db] = src_scale[(h * head_blocks + db) * lb + cb];
      for (int64_t db = 0; db < vb; ++db)
        uv_scale.data<float>()[(h * vb + db) * lb + cb] = src_scale[(h * head_blocks + nb + db) * lb + cb];
    }
  }
  Weight w_uk = backend.load_weight(uk, uk_scale), w_uv = backend.load_weight(uv, uv_scale);
  if (!w_uk.is_fp8() || !w_uv.is_fp8()) return std::nullopt;
  w_uk.w = w_uk.w.view({H, L, Dn});
  w_uv.w = w_uv.w.view({H, Dv, L});
  return std::pair{w_uk, w_uv};
}

MlaWeights load_mla(const Checkpoint& ckpt, Backend& backend, const std::string& p) {
  const ModelConfig& c = ckpt.config();
  const int64_t H = c.num_attention_heads, L = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim;
  MlaWeights w;
  const std::string q_first = p + (c.q_lora_rank ? "q_a_proj" : "q_proj");
  w.fused_qkv_a_proj = load_stacked_linear(ckpt, backend, q_first, p + "kv_a_proj_with_mqa");
  if (!w.fused_qkv_a_proj) {
    (c.q_lora_rank ? w.q_a_proj : w.q_proj) = load_linear(ckpt, backend, q_first);
    w.kv_a_proj_with_mqa = load_linear(ckpt, backend, p + "kv_a_proj_with_mqa");
  }
  if (c.q_lora_rank) {
    w.q_a_layernorm = load_param(ckpt, backend, p + "q_a_layernorm.weight", {*c.q_lora_rank});
    w.q_b_proj = load_linear(ckpt, backend, p + "q_b_proj");
  }
  w.kv_a_layernorm = load_param(ckpt, backend, p + "kv_a_layernorm.weight", {L});
  w.kv_b_proj = load_linear(ckpt, backend, p + "kv_b_proj");
  w.o_proj = load_linear(ckpt, backend, p + "o_proj");

  // W_UK / W_UV for the absorbed form, from the host copy of kv_b_proj.
  const Tensor kv_b = ckpt.get(p + "kv_b_proj.weight");
  MLA_CHECK(kv_b.shape() == Shape({H * (Dn + Dv), L}), "{}kv_b_proj.weight: shape {} but config implies [{}, {}]", p,
            shape_str(kv_b.shape()), H * (Dn + Dv), L);
  const Tensor kv_b_scale = kv_b.dtype() == DType::F8_E4M3 ? ckpt.get(p + "kv_b_proj.weight_scale_inv") : Tensor();
  if (auto fp8 = fp8_head_weights(backend, kv_b, kv_b_scale, H, Dn, Dv, L)) {
    std::tie(w.w_uk, w.w_uv) = *fp8;
    return w;
  }
  Tensor w_uk = Tensor::empty({H, Dn, L}, DType::F32), w_uv = Tensor::empty({H, Dv, L}, DType::F32);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t d = 0; d < Dn; ++d)
      host_weight_rows_f32(kv_b, kv_b_scale, h * (Dn + Dv) + d, w_uk.data<float>() + (h * Dn + d) * L);
    for (int64_t d = 0; d < Dv; ++d)
      host_weight_rows_f32(kv_b, kv_b_scale, h * (Dn + Dv) + Dn + d, w_uv.data<float>() + (h * Dv + d) * L);
  }
  // In the activation dtype: a bf16 backend would otherwise hold the f32
  // copies beside the bf16 ones it multiplies with (8 MB a layer at V2-Lite
  // width, 64 MB at V3's).
  w.w_uk = Weight{backend.load_tensor(host_f32_as(w_uk, backend.act_dtype())), {}};
  w.w_uv = Weight{backend.load_tensor(host_f32_as(w_uv, backend.act_dtype())), {}};
  return w;
}

}  // namespace

Weight load_linear(const Checkpoint& ckpt, Backend& backend, const std::string& prefix) {
  const Tensor w = ckpt.get(prefix + ".weight");
  Tensor scale;
  if (w.dtype() == DType::F8_E4M3) scale = ckpt.get(prefix + ".weight_scale_inv");
  try {
    return backend.load_weight(w, scale);
  } catch (const Error& e) {
    fail("{}.weight: {}", prefix, e.what());
  }
}

Tensor load_param(const Checkpoint& ckpt, Backend& backend, const std::string& name, const Shape& shape) {
  const Tensor t = ckpt.get(name);
  MLA_CHECK(t.shape() == shape, "{}: shape {} but the config implies {}", name, shape_str(t.shape()),
            shape_str(shape));
  return backend.load_tensor(t);
}

DecoderLayerWeights load_decoder_layer(const Checkpoint& ckpt, Backend& backend, int index) {
  const ModelConfig& c = ckpt.config();
  const std::string p = fmt::format("model.layers.{}.", index);
  const int64_t D = c.hidden_size;
  DecoderLayerWeights w;
  w.input_layernorm = load_param(ckpt, backend, p + "input_layernorm.weight", {D});
  w.post_attention_layernorm = load_param(ckpt, backend, p + "post_attention_layernorm.weight", {D});
  w.attn = load_mla(ckpt, backend, p + "self_attn.");
  if (!c.is_moe_layer(index)) {
    w.mlp = load_mlp(ckpt, backend, p + "mlp.");
    return w;
  }
  MoeWeights moe;
  moe.routing = routing_params(c);
  moe.router = load_linear(ckpt, backend, p + "mlp.gate");
  try {
    moe.chain_router_fold = backend.mla_chain_router_fold(moe.router, w.post_attention_layernorm, w.attn.o_proj);
  } catch (const Error& e) {
    fail("{}mlp.gate through self_attn.o_proj: {}", p, e.what());
  }
  if (moe.routing.method == TopkMethod::NoauxTc)
    moe.score_correction_bias =
        load_param(ckpt, backend, p + "mlp.gate.e_score_correction_bias", {int64_t(c.n_routed_experts)});
  // Host views: the backend stacks the experts (and folds in the shared
  // ones) straight from the checkpoint, in its own format.
  std::vector<Weight> gate, up, down;
  for (int e = 0; e < c.n_routed_experts; ++e) {
    const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
    gate.push_back(host_linear(ckpt, ep + "gate_proj"));
    up.push_back(host_linear(ckpt, ep + "up_proj"));
    down.push_back(host_linear(ckpt, ep + "down_proj"));
  }
  std::optional<SharedExpertWeights> shared;
  if (c.n_shared_experts > 0) {
    const std::string sp = p + "mlp.shared_experts.";
    shared = SharedExpertWeights{host_linear(ckpt, sp + "gate_proj"), host_linear(ckpt, sp + "up_proj"),
                                 host_linear(ckpt, sp + "down_proj")};
  }
  try {
    moe.experts = backend.load_experts(std::move(gate), std::move(up), std::move(down), std::move(shared));
  } catch (const Error& e) {
    fail("{}mlp experts: {}", p, e.what());
  }
  w.moe = std::move(moe);
  return w;
}

MtpWeights load_mtp(const Checkpoint& ckpt, Backend& backend, int index) {
  const ModelConfig& c = ckpt.config();
  const std::string p = fmt::format("model.layers.{}.", index);
  const int64_t D = c.hidden_size;
  MtpWeights w;
  w.embed_tokens = load_param(ckpt, backend, p + "embed_tokens.weight", {c.vocab_size, D});
  w.enorm = load_param(ckpt, backend, p + "enorm.weight", {D});
  w.hnorm = load_param(ckpt, backend, p + "hnorm.weight", {D});
  w.eh_proj = load_linear(ckpt, backend, p + "eh_proj");
  w.block = load_decoder_layer(ckpt, backend, index);
  w.shared_head_norm = load_param(ckpt, backend, p + "shared_head.norm.weight", {D});
  w.shared_head = load_linear(ckpt, backend, p + "shared_head.head");
  return w;
}

}  // namespace mlaserve
