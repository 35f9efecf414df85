#include "model/feed_forward.h"

namespace mlaserve {

void dense_mlp(Backend& backend, const MlpWeights& w, const Tensor& h, Tensor out) {
  const int64_t T = h.dim(0), I = w.gate_proj.out_features();
  const DType act = backend.act_dtype();
  Tensor gate = backend.alloc({T, I}, act), up = backend.alloc({T, I}, act), hidden = backend.alloc({T, I}, act);
  backend.linear(h, w.gate_proj, gate);
  backend.linear(h, w.up_proj, up);
  backend.silu_and_mul(gate, up, hidden);
  backend.linear(hidden, w.down_proj, out);
}

void moe_block(Backend& backend, const MoeWeights& w, const Tensor& h, Tensor out) {
  const int64_t T = h.dim(0), E = w.router.out_features(), k = w.routing.top_k;
  Tensor logits = backend.alloc({T, E}, DType::F32);
  backend.linear_f32_out(h, w.router, logits);
  Tensor ids = backend.alloc({T, k}, DType::I32), weights = backend.alloc({T, k}, DType::F32);
  backend.moe_route(logits, w.score_correction_bias, w.routing, ids, weights);
  backend.moe_experts(h, w.experts, ids, weights, out);
  if (w.shared_experts) {
    Tensor shared = backend.alloc(out.shape(), backend.act_dtype());
    dense_mlp(backend, *w.shared_experts, h, shared);
    backend.add(out, shared);
  }
}

}  // namespace mlaserve
