#pragma once
// The ops interface the DeepSeek model is written against, once, for every
// backend. The CPU backend (kernels/cpu) is the reference: f32 activations,
// f32 accumulation. The CUDA backend (kernels/cuda) implements the same ops
// on Hopper with bf16 activations and must match within stated tolerances.
//
// Conventions:
// - Every tensor passed to an op lives on the backend's device, is
//   contiguous and row-major. Activations have dtype act_dtype().
// - Shapes are written as {dim0, dim1, ...}; T = new tokens in the batch,
//   H = attention heads, D = hidden size, E = routed experts.
// - Outputs are preallocated by the caller; ops never allocate on the step
//   path (CUDA graphs capture them).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/forward_batch.h"

namespace mlaserve {

// A linear layer's weight {N, K} (out, in) as the checkpoint stores it.
// For block-FP8 weights, scale_inv is F32 {ceil(N/128), ceil(K/128)} and the
// real weight is w * scale_inv[n/128][k/128]; otherwise scale_inv is undefined.
struct Weight {
  Tensor w;
  Tensor scale_inv;
  int64_t out_features() const { return w.dim(0); }
  int64_t in_features() const { return w.dim(1); }
  bool is_fp8() const { return w.dtype() == DType::F8_E4M3; }
};

// One product of a fused op (Backend::rms_norm_linears): out = input · wᵀ.
struct LinearTarget {
  const Weight* w = nullptr;
  Tensor out;
};

// A MoE layer's shared experts as the checkpoint stores them: one SwiGLU MLP
// of intermediate width n_shared * I (I = moe_intermediate_size).
struct SharedExpertWeights {
  Weight gate, up, down;  // {n_shared * I, D}, {n_shared * I, D}, {D, n_shared * I}
};

// All experts of one MoE layer: the routed ones and, when load_experts was
// given them, the shared ones. Backends may repack them at load time
// (stacked, transposed, quantized) behind `packed`. A sum over intermediate
// channels splits exactly, so a backend may fold the shared MLP in as
// num_shared extra always-selected experts of width I with weight 1.0.
struct ExpertWeights {
  std::vector<Weight> gate, up, down;  // per routed expert: {I, D}, {I, D}, {D, I}
  std::shared_ptr<void> packed;
  int num_shared = 0;  // shared experts of width I included in moe_experts' output (0: none)
  std::optional<SharedExpertWeights> shared;  // the shared MLP as given, for backends that run it whole (CPU)
  int num_experts() const { return int(gate.size()); }
};

// Routing parameters of a MoE layer (see DESIGN.md "MoE").
// Selection: scores = softmax|sigmoid(logits); GroupLimitedGreedy keeps the
// topk_group groups with the highest max score, NoauxTc those with the highest
// sum of their top-2 (score + bias); then the top_k experts among the kept
// groups by (score + bias) (bias only for NoauxTc). Weights are the unbiased
// scores of the chosen experts, divided by their sum if `renormalize`, then
// multiplied by `scaling`. (V2 and V3 differ in when routed_scaling_factor
// applies; the model resolves that into these two fields.)
enum class TopkMethod { Greedy, GroupLimitedGreedy, NoauxTc };
enum class ScoringFunc { Softmax, Sigmoid };
struct RouterParams {
  TopkMethod method = TopkMethod::Greedy;
  ScoringFunc scoring = ScoringFunc::Softmax;
  int top_k = 1;
  int n_group = 1;
  int topk_group = 1;
  bool renormalize = false;
  float scaling = 1.0f;
};

// Batch metadata on the device, made once per step by prepare_batch (the
// host-side "plan"); the run-side ops only read it.
struct DeviceBatch {
  int num_seqs = 0, num_tokens = 0, max_q_len = 0, max_kv_len = 0, num_logit_rows = 0;
  bool is_decode = false;
  Tensor input_ids, positions, out_slots;  // I32 {T}
  Tensor q_indptr, kv_indptr;              // I32 {B+1}
  Tensor kv_slots;                         // I32 {sum kv_len}
  Tensor logit_rows;                       // I32 {R}
  ForwardBatch host;                       // the host copy, for CPU loops and planning
};

// One logits row's sampling settings for sample_rows (the runtime's
// SamplingParams without penalties or logprobs, plus the row's draw).
struct RowSampling {
  float temperature = 1.0f;  // <= 1e-5 (or top_k == 1): greedy
  int top_k = -1;            // <= 0: no limit
  float top_p = 1.0f;
  float min_p = 0.0f;
  double uniform = 0.0;      // in [0, 1): the request's RNG draw for this token
};

// MLA's per-token work between the input projections and the attention
// (Backend::mla_prepare). Sources are row-major {T, width} activations whose
// rows may hold more than a part reads: the fused q / kv_a projection output
// holds both, at their column offsets. A part runs when its output is defined.
struct MlaPrepare {
  // Latent write: cache{S, L + R}[out_slots[t]] = [rmsnorm(c_kv) * kv_norm |
  // rope(k_pe)], where [c_kv{L} | k_pe{R}] = kv[t, kv_col : kv_col + L + R]
  // and L = kv_norm.numel().
  Tensor kv, kv_norm, cache;
  int64_t kv_col = 0;
  // q_a norm (q_lora_rank set): q_a_out{T, Q}[t] = rmsnorm(q_a[t, q_a_col :
  // q_a_col + Q]) * q_a_norm, Q = q_a_norm.numel().
  Tensor q_a, q_a_norm, q_a_out;
  int64_t q_a_col = 0;
  // q split: head h of token t is [q_nope{Dn} | q_pe{R}] at q[t, q_col +
  // h * (Dn + R) ...], H = q_pe_out.dim(1), Dn = nope_dim. Writes
  // q_pe_out{T, H, Wp}[t, h, q_pe_col : q_pe_col + R] = rope(q_pe) and, when
  // q_nope_out{T, H, Wn} is defined, q_nope_out[t, h, :Dn] = q_nope. The
  // outputs may be q itself (in place: same columns) or another tensor.
  Tensor q, q_nope_out, q_pe_out;
  int64_t q_col = 0, nope_dim = 0, q_pe_col = 0;
  // rmsnorm(x) = x / sqrt(mean(x²) + eps); rope is Backend::rope's rotation.
  float eps = 1e-6f;
};

// One token's post-attention norm that the decode chain leaves to the MoE
// op after it (MlaChainMoeTail::pending): normed = rmsnorm(residual) *
// weight, with mean(residual²) = sum(parts) / D, the parts summed in index
// order. So the chain need not gather its whole output in every block.
struct PendingNorm {
  Tensor residual, weight;  // {1, D}, {D}
  float eps = 1e-6f;
  Tensor parts;             // {n} F32
};

// What may follow the chain in the same op at a MoE layer: the
// post-attention norm with the residual add (rms_norm's semantics: residual
// += the chain's output in place, normed = rmsnorm(residual) * norm_weight)
// and the router's logits over normed (linear_f32_out's), which the MoE
// routes from (moe_route_experts).
struct MlaChainMoeTail {
  Tensor norm_weight;  // {D}
  float eps = 1e-6f;
  Tensor residual, normed;  // {T, D}
  const Weight* router = nullptr;  // {E, D}
  Tensor logits;                   // {T, E} F32
  Tensor router_fold;              // Backend::mla_chain_router_fold's, where the backend has one
  // Where set, the backend may leave the norm pending: it then fills
  // *pending, normed is not written, and logits hold the router's logits
  // times rms(residual); moe_route_experts, given pending, completes it.
  PendingNorm* pending = nullptr;
};

// A pre-norm with the residual add, formed by the op that reads h
// (rms_norm's semantics: residual += x in place, h = rmsnorm(residual) *
// norm_weight; with residual undefined, h = rmsnorm(x) * norm_weight): the
// block's input norm ahead of the projections or the decode chain (which
// then neither reads nor writes the h tensor) and the post-attention norm
// ahead of the dense MLP.
struct ResidualNorm {
  Tensor x, residual;  // {T, D}: the previous block's output (or the embeddings), the residual stream
  Tensor norm_weight;  // {D}
  float eps = 1e-6f;
};

// The absorbed MLA of a decode step from the block's normed input to
// o_proj's output (Backend::mla_decode_chain): the same function as
// model/mla_attention.cpp's op sequence (fused q / kv_a projection, latent
// write, q_nope·W_UK, attention, ·W_UV, o_proj) for models without q_lora.
struct MlaDecodeChain {
  Tensor h;                        // {T, D}
  const Weight* qkv_a = nullptr;   // rows [q_proj {H (Dn + R)} | kv_a_proj_with_mqa {L + R}], K = D
  Tensor kv_norm;                  // {L}
  Tensor w_uk, w_uv;               // {H, Dn, L}, {H, Dv, L}
  const Weight* o_proj = nullptr;  // {D, H Dv}
  Tensor cache;                    // {S, L + R}
  Tensor inv_freq;                 // {R / 2}
  float cos_sin_scale = 1.0f, eps = 1e-6f, softmax_scale = 1.0f;
  const MlaChainMoeTail* moe_tail = nullptr;    // also do the MoE layer's start
  const ResidualNorm* norm_head = nullptr;  // also do the block's input norm
};

// Ops that fuse others (rms_norm_linears, moe_select, the decode chain...)
// are pure virtual with a reference definition, the composition they
// replace: every backend, wrappers included, must say which one it runs, so
// a wrapper cannot silently run the composition where the backend it wraps
// has a fused kernel (a timing wrapper once did, and its benchmarks measured
// a path the engine never takes).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  virtual DType act_dtype() const = 0;

  // ---- memory -----------------------------------------------------------
  virtual Tensor alloc(const Shape& shape, DType dtype) = 0;
  // A weight from host memory (e.g. an mmapped checkpoint). The CPU backend
  // may keep the host view (no copy); CUDA uploads it.
  virtual Weight load_weight(const Tensor& w, const Tensor& scale_inv) = 0;
  // Any other host tensor (norm weights, biases, embeddings) to the device.
  virtual Tensor load_tensor(const Tensor& host) = 0;
  // A MoE layer's experts from HOST weights as the checkpoint stores them
  // (mmapped views; not passed through load_weight first), so a backend
  // stacks and converts them itself (e.g. block-FP8 straight into FP8
  // stacks). gate/up/down hold the routed experts; `shared` (optional) the
  // layer's shared experts, whose width must be a multiple of the routed I.
  virtual ExpertWeights load_experts(std::vector<Weight> gate, std::vector<Weight> up, std::vector<Weight> down,
                                     std::optional<SharedExpertWeights> shared) = 0;
  virtual Tensor to_host(const Tensor& t) = 0;
  // A copy of t for the host, taken once the work queued so far is done,
  // without waiting for work queued later: the copy is queued now and the
  // returned function waits for it alone. So a caller can queue the next
  // step before it reads this one's results.
  virtual std::function<Tensor()> to_host_later(const Tensor& t) = 0;
  virtual DeviceBatch prepare_batch(const ForwardBatch& b) = 0;
  virtual void synchronize() = 0;

  // ---- ops ---------------------------------------------------------------
  // Weight-like tensors (embedding table, norm weights, router bias) may keep
  // their checkpoint dtype (BF16/F16/F32) after load_tensor; ops convert.
  // out{T, D} = table{V, D}[ids{T}]; an id below zero stands for one an
  // earlier step picked on the device: picked[-1 - id] (the runtime's
  // overlapped steps, ModelRunner::start_step).
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor out, const Tensor& picked = {}) = 0;
  // out{T, D} = rmsnorm(x) * w; if residual is defined: residual += x first
  // and out = rmsnorm(residual) * w (the fused pre-norm residual add).
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out, Tensor residual = {}) = 0;
  // out{T, N} = x{T, K} · Wᵀ, f32 accumulation (block scales applied per 128-wide K block).
  virtual void linear(const Tensor& x, const Weight& w, Tensor out) = 0;
  // Same product with an F32 output whatever act_dtype() is: the MoE router
  // (DeepSeek computes router logits in f32) and the lm_head (F32 logits).
  virtual void linear_f32_out(const Tensor& x, const Weight& w, Tensor out) = 0;
  // In place on x{T, n, width}: rotates the pairs (x[2i], x[2i+1]) of
  // x[t, h, offset : offset + 2 * F] by the angle positions[t] * inv_freq[i]
  // (inv_freq F32 {F}, the angle computed in f32), cos and sin multiplied by
  // cos_sin_scale (YaRN's attention factor). This is the interleaved layout of
  // DeepSeek's checkpoints; q and k both use it, so q·k equals transformers'
  // de-interleaved form, and the latent cache holds k_pe in this layout.
  virtual void rope(Tensor x, int offset, const Tensor& positions, const Tensor& inv_freq,
                    float cos_sin_scale) = 0;
  // out{T, I} = silu(gate{T, I}) * up{T, I}
  virtual void silu_and_mul(const Tensor& gate, const Tensor& up, Tensor out) = 0;
  // out{T, I} = silu(gate_up[:, :I]) * gate_up[:, I:] for gate_up{T, 2I}: the
  // dense MLP's gate and up projections run as one GEMM (rows concatenated).
  virtual void silu_and_mul_gate_up(const Tensor& gate_up, Tensor out) = 0;
  // The producer of a linear's input and the linear(s) reading it, as one op,
  // so a backend can hand the product its input in the form it reads: the
  // CUDA backend quantizes the rows 1x128 inside the norm / SiLU kernel for
  // block-FP8 weights instead of writing bf16 rows and quantizing them in a
  // second pass. Results equal the ops in turn (the defaults run them so).
  // rms_norm(x, norm_w, eps, ·, residual), then linear(·, *t.w, t.out) for
  // each target; the normed rows themselves are not kept.
  virtual void rms_norm_linears(const Tensor& x, const Tensor& norm_w, float eps, Tensor residual,
                                const std::vector<LinearTarget>& targets) = 0;
  // silu_and_mul_gate_up(gate_up, ·), then linear(·, w, out).
  virtual void silu_and_mul_linear(const Tensor& gate_up, const Weight& w, Tensor out) = 0;
  // y += x (same shape)
  virtual void add(Tensor y, const Tensor& x) = 0;
  // Column block copy between row-major matrices: both tensors are viewed as
  // {rows, width} with rows = numel / last dim (equal for both), and
  // dst[r, dst_col : dst_col + n] = src[r, src_col : src_col + n]. Splits and
  // concatenations of MLA's q / latent rows without strided tensors.
  virtual void copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t n) = 0;
  // The latent cache (mla_prepare, scatter/gather_rows, the absorbed
  // attention) is either {S, L + R} of act_dtype or, for an FP8 cache
  // (--kv-cache-dtype fp8_e4m3), U8 {S, slot_bytes} of kernels/fp8_kv_layout.h
  // slots [L e4m3 c_kv | ceil(L/128) f32 scales | R bf16 k_pe]; every op
  // dispatches on the cache tensor's dtype, writing quantizes and reading
  // dequantizes to act_dtype.
  // cache[slots[t]] = rows[t] for rows{T, W}, cache{S, W} (or FP8 slots of rows{T, L + R})
  virtual void scatter_rows(Tensor cache, const Tensor& rows, const Tensor& slots) = 0;
  // out[i] = cache[slots[i]] (an FP8 cache's slots dequantized)
  virtual void gather_rows(const Tensor& cache, const Tensor& slots, Tensor out) = 0;
  // Per-head matmul: out{T, H, No}[:, :, :N] = x{T, H, Kx}[:, :, :K] · w[h]
  // where w.w is {H, K, N} (transpose_w = false) or {H, N, K} (transpose_w =
  // true), F32 or act_dtype; or block-FP8 (transpose_w only): e4m3 {H, N, K}
  // with scale_inv {H * N / 128, K / 128} over its rows {H * N, K}, as a
  // load_weight of that 2-D shape returned it (the product uses the
  // dequantized weights). Kx >= K, so q_nope is read in place from
  // q{T, H, Dn + R}; No >= N, so q_nope·W_UK lands in place in the first L
  // columns of the absorbed attention's q{T, H, L + R} (columns N .. No are
  // left as they are). The absorbed-MLA q_nope·W_UK and o_latent·W_UVᵀ products.
  virtual void head_bmm(const Tensor& x, const Weight& w, bool transpose_w, Tensor out) = 0;
  // head_bmm, then linear(·{T, H N}, proj, out): W_UV's product feeding
  // o_proj, as one op like rms_norm_linears (the CUDA backend writes
  // block-FP8 rows from the product's kernel for block-FP8 weights).
  virtual void head_bmm_linear(const Tensor& x, const Weight& w, bool transpose_w, const Weight& proj,
                               Tensor out) = 0;

  // All parts of p (see MlaPrepare) for the tokens at positions{T} I32,
  // writing latent rows to out_slots{T} I32; R = 2 * inv_freq.numel(). One
  // launch on CUDA where the unfused form took a norm, two ropes, column
  // copies and a scatter.
  virtual void mla_prepare(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                           const Tensor& inv_freq, float cos_sin_scale) = 0;
  // mla_prepare whose q_a norm feeds q_b_proj: q{T, N} = linear(q_a_out, q_b),
  // as one op like rms_norm_linears. p.q_a_out may be left undefined (the
  // normed rows are then the op's scratch): the CUDA backend quantizes them
  // for a block-FP8 q_b inside the norm and writes no bf16 rows.
  virtual void mla_prepare_q_b(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                               const Tensor& inv_freq, float cos_sin_scale, const Weight& q_b, Tensor q) = 0;
  // The MLA block's start with a q_lora and a fused q_a / kv_a projection w:
  // rms_norm_linears(in.x, in.norm_weight, in.eps, in.residual, {w into
  // qkv{T, w.out_features()}}), then mla_prepare_q_b(p, ...) with p.q_a =
  // p.kv = qkv (p.q_a and p.kv left undefined by the caller, p.kv_col where
  // kv starts). The CUDA backend adds the projection's split-K partials inside
  // the prepare's launch at decode (no sum kernel).
  virtual void rms_norm_linear_mla_prepare_q_b(const ResidualNorm& in, const Weight& w, const MlaPrepare& p,
                                               const Tensor& positions, const Tensor& out_slots,
                                               const Tensor& inv_freq, float cos_sin_scale, const Weight& q_b,
                                               Tensor q) = 0;
  // mla_prepare(p, ...), then head_bmm(x, w, transpose_w, out): the absorbed
  // attention's q rows, the roped q_pe (p's q split) and q_nope · W_UK, as one
  // op. The CUDA backend ropes inside the product's launch when p holds only
  // the q split (q_nope read in place) and the product streams block-FP8
  // weights (decode).
  virtual void mla_prepare_head_bmm(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                                    const Tensor& inv_freq, float cos_sin_scale, const Tensor& x, const Weight& w,
                                    bool transpose_w, Tensor out) = 0;

  // Absorbed MLA (decode, or any batch): q{T, H, L + R} = [q_latent | q_pe]
  // in the layout of the cache rows; cache{S, L + R} holds [c_kv | k_pe] per
  // slot; out{T, H, L} is the attention-weighted sum of c_kv (W_UV is applied
  // by the caller). Scores = q·cache_row * scale, one latent "KV head" shared
  // by all H query heads, causal per ForwardBatch (kv_slots order).
  virtual void mla_attention_absorbed(const Tensor& q, const Tensor& cache, const DeviceBatch& batch,
                                      float scale, Tensor out) = 0;
  // The whole chain of MlaDecodeChain as one op where the backend has it for
  // this batch and these widths (CUDA: one token, V2-Lite widths, bf16):
  // returns true having written out{T, D} and the cache row (and, with a
  // moe_tail or a norm_head, their outputs). Returns false having done nothing, and the model
  // asks again without the tail or runs the ops one by one.
  virtual bool mla_decode_chain(const MlaDecodeChain& chain, const DeviceBatch& batch, Tensor out) = 0;
  // What a backend's chain with a moe_tail needs besides the layer's weights,
  // made once at load: router · diag(norm_weight) · o_proj {E, H Dv} F32
  // where the chain forms the router logits from the attention output (the
  // logits then skip the roundings of out, the residual and the normed row);
  // undefined where the backend's chain does not take one (the default).
  virtual Tensor mla_chain_router_fold(const Weight& router, const Tensor& norm_weight, const Weight& o_proj) = 0;
  // Non-absorbed MLA (prefill/extend): q{T, H, Dn + R}; kv{Lk, H, Dn + Dv} is
  // kv_b_proj's output [k_nope | v] per head and k_pe{Lk, R} the roped key,
  // both for the batch's kv tokens in kv_slots order (Lk = total kv tokens);
  // out{T, H, Dv}. Scores = (q_nope·k_nope + q_pe·k_pe) * scale, causal.
  virtual void mla_attention_expanded(const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                      const DeviceBatch& batch, float scale, Tensor out) = 0;
  // mla_attention_expanded, then linear(·{T, H Dv}, w, out): the attention
  // output feeding o_proj, as one op like rms_norm_linears (the CUDA backend
  // writes block-FP8 rows from the attention kernel for a block-FP8 w).
  virtual void mla_attention_expanded_linear(const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                             const DeviceBatch& batch, float scale, const Weight& w, Tensor out) = 0;

  // Router: logits{T, E} F32 (from linear_f32_out), bias{E} (NoauxTc's
  // e_score_correction_bias) or undefined. topk_ids I32 {T, k},
  // topk_weights F32 {T, k} (normalized and scaled per RouterParams).
  virtual void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& p,
                         Tensor topk_ids, Tensor topk_weights) = 0;
  // The router's logits and moe_route in one op: logits{T, E} F32 =
  // h{T, D} · router{E, D}ᵀ (linear_f32_out), then moe_route(logits, bias,
  // p, topk_ids, topk_weights). This default runs exactly those two ops (the
  // CPU reference); CUDA fuses them into one launch for decode-sized T.
  virtual void moe_select(const Tensor& h, const Weight& router, const Tensor& bias, const RouterParams& p,
                          Tensor topk_ids, Tensor topk_weights) = 0;
  // rms_norm(in.x, in.norm_weight, in.eps, normed, in.residual), then
  // moe_select(normed, router, bias, p, topk_ids, topk_weights): a MoE
  // layer's start where no decode chain formed it. CUDA forms the norm inside
  // moe_select's launch for decode-sized T.
  virtual void rms_norm_moe_select(const ResidualNorm& in, Tensor normed, const Weight& router, const Tensor& bias,
                                   const RouterParams& p, Tensor topk_ids, Tensor topk_weights) = 0;
  // out{T, D} = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])
  //             + shared(x[t]) when the experts were loaded with shared ones,
  // expert(x) = down(silu(gate(x)) * up(x)), likewise shared(x).
  virtual void moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids,
                           const Tensor& topk_weights, Tensor out) = 0;
  // moe_route(logits, bias, p, topk_ids, topk_weights), then moe_experts(x,
  // experts, topk_ids, topk_weights, out): the MoE of logits formed earlier
  // (the decode chain's tail). This default runs exactly those two ops (the
  // CPU reference); CUDA routes a decode token inside the expert kernels.
  // With pending (the chain's), x and logits are first completed from it (x
  // may instead be formed inside the kernels and left unwritten).
  virtual void moe_route_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                                 const Tensor& bias, const RouterParams& p, Tensor topk_ids, Tensor topk_weights,
                                 Tensor out, const PendingNorm* pending = nullptr) = 0;

  // ids{R} I32 = argmax of each row of logits{R, V} F32, the lowest index on
  // ties (the host sampler's greedy rule): greedy steps copy only the ids.
  virtual void argmax_rows(const Tensor& logits, Tensor ids) = 0;
  // ids{R} I32: one token per row of logits{R, V} F32, drawn with rows[r]:
  // weights w = exp((logit - max) / T); keep the top_k largest (ties at the
  // k-th weight all stay), then those with w >= min_p (the max weight is 1),
  // then the smallest set of the largest whose mass reaches top_p of what is
  // left (ties at the boundary stay); the token is where the running sum of
  // kept weights, in vocabulary order, first exceeds uniform * their total.
  // Greedy rows take argmax_rows' id. Only the ids cross to the host.
  virtual void sample_rows(const Tensor& logits, const std::vector<RowSampling>& rows, Tensor ids) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();
// Null when built without CUDA or when no GPU is present.
std::unique_ptr<Backend> make_cuda_backend(size_t workspace_bytes);

}  // namespace mlaserve
