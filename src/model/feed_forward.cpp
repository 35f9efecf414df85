#include "model/feed_forward.h"

namespace mlaserve {

void dense_mlp(Backend& backend, const MlpWeights& w, const ResidualNorm& in, Tensor out) {
  const int64_t T = in.x.dim(0), I = w.down_proj.in_features();
  const DType act = backend.act_dtype();
  if (w.gate_up_proj) {
    Tensor gate_up = backend.alloc({T, 2 * I}, act);
    backend.rms_norm_linears(in.x, in.norm_weight, in.eps, in.residual, {LinearTarget{&*w.gate_up_proj, gate_up}});
    backend.silu_and_mul_linear(gate_up, w.down_proj, out);
    return;
  }
  Tensor gate = backend.alloc({T, I}, act), up = backend.alloc({T, I}, act), hidden = backend.alloc({T, I}, act);
  backend.rms_norm_linears(in.x, in.norm_weight, in.eps, in.residual,
                           {LinearTarget{&*w.gate_proj, gate}, LinearTarget{&*w.up_proj, up}});
  backend.silu_and_mul(gate, up, hidden);
  backend.linear(hidden, w.down_proj, out);
}

}  // namespace mlaserve
