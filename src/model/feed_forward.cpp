#include "model/feed_forward.h"

namespace mlaserve {

void dense_mlp(Backend& backend, const MlpWeights& w, const Tensor& h, Tensor out) {
  const int64_t T = h.dim(0), I = w.down_proj.in_features();
  const DType act = backend.act_dtype();
  Tensor hidden = backend.alloc({T, I}, act);
  if (w.gate_up_proj) {
    Tensor gate_up = backend.alloc({T, 2 * I}, act);
    backend.linear(h, *w.gate_up_proj, gate_up);
    backend.silu_and_mul_gate_up(gate_up, hidden);
  } else {
    Tensor gate = backend.alloc({T, I}, act), up = backend.alloc({T, I}, act);
    backend.linear(h, *w.gate_proj, gate);
    backend.linear(h, *w.up_proj, up);
    backend.silu_and_mul(gate, up, hidden);
  }
  backend.linear(hidden, w.down_proj, out);
}

}  // namespace mlaserve
