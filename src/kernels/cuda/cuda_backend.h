#pragma once
// The CUDA backend for Hopper (sm_90a), bf16 activations. Exposed (beyond
// make_cuda_backend) for the CUDA-graph runner and the GPU tests, which need
// its stream and allocator.
// Block-FP8 weights whose K is a multiple of 128 stay FP8 on the device and
// run through the FP8 kernels (docs/fp8.md); others (the tiny presets' K = 32)
// are dequantized to bf16 at load, as all are with MLASERVE_FP8=0 in the
// environment (or set_fp8_weights(false)).
#include <cuda_runtime_api.h>

#include <memory>
#include <unordered_map>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/moe_router.h"

namespace mlaserve::cuda {

class Fp8Linear;
struct MoeSelectWorkspace;
struct MlaPrepareParams;
struct HeadBmmFp8Rope;

class CudaBackend final : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;

  Device device() const override { return Device::CUDA; }
  std::string name() const override;
  DType act_dtype() const override { return DType::BF16; }

  Tensor alloc(const Shape& shape, DType dtype) override;
  Weight load_weight(const Tensor& w, const Tensor& scale_inv) override;
  Tensor load_tensor(const Tensor& host) override;
  ExpertWeights load_experts(std::vector<Weight> gate, std::vector<Weight> up, std::vector<Weight> down,
                             std::optional<SharedExpertWeights> shared) override;
  Tensor to_host(const Tensor& t) override;
  std::function<Tensor()> to_host_later(const Tensor& t) override;
  DeviceBatch prepare_batch(const ForwardBatch& b) override;
  void synchronize() override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor out, const Tensor& picked = {}) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out, Tensor residual = {}) override;
  void linear(const Tensor& x, const Weight& w, Tensor out) override;
  void linear_f32_out(const Tensor& x, const Weight& w, Tensor out) override;
  void rope(Tensor x, int offset, const Tensor& positions, const Tensor& inv_freq, float cos_sin_scale) override;
  void silu_and_mul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void silu_and_mul_gate_up(const Tensor& gate_up, Tensor out) override;
  void rms_norm_linears(const Tensor& x, const Tensor& norm_w, float eps, Tensor residual,
                        const std::vector<LinearTarget>& targets) override;
  void silu_and_mul_linear(const Tensor& gate_up, const Weight& w, Tensor out) override;
  void add(Tensor y, const Tensor& x) override;
  void copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t n) override;
  void scatter_rows(Tensor cache, const Tensor& rows, const Tensor& slots) override;
  void gather_rows(const Tensor& cache, const Tensor& slots, Tensor out) override;
  void head_bmm(const Tensor& x, const Weight& w, bool transpose_w, Tensor out) override;
  void head_bmm_linear(const Tensor& x, const Weight& w, bool transpose_w, const Weight& proj, Tensor out) override;
  void mla_prepare(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                   float cos_sin_scale) override;
  void mla_prepare_q_b(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                       float cos_sin_scale, const Weight& q_b, Tensor q) override;
  void rms_norm_linear_mla_prepare_q_b(const ResidualNorm& in, const Weight& w, const MlaPrepare& p,
                                       const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                                       float cos_sin_scale, const Weight& q_b, Tensor q) override;
  void mla_prepare_head_bmm(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                            const Tensor& inv_freq, float cos_sin_scale, const Tensor& x, const Weight& w,
                            bool transpose_w, Tensor out) override;
  void mla_attention_absorbed(const Tensor& q, const Tensor& cache, const DeviceBatch& batch, float scale,
                              Tensor out) override;
  void mla_attention_expanded(const Tensor& q, const Tensor& kv, const Tensor& k_pe, const DeviceBatch& batch,
                              float scale, Tensor out) override;
  void mla_attention_expanded_linear(const Tensor& q, const Tensor& kv, const Tensor& k_pe, const DeviceBatch& batch,
                                     float scale, const Weight& w, Tensor out) override;
  bool mla_decode_chain(const MlaDecodeChain& chain, const DeviceBatch& batch, Tensor out) override;
  Tensor mla_chain_router_fold(const Weight& router, const Tensor& norm_weight, const Weight& o_proj) override;
  void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor topk_ids,
                 Tensor topk_weights) override;
  void moe_select(const Tensor& h, const Weight& router, const Tensor& bias, const RouterParams& p,
                  Tensor topk_ids, Tensor topk_weights) override;
  void rms_norm_moe_select(const ResidualNorm& in, Tensor normed, const Weight& router, const Tensor& bias,
                           const RouterParams& p, Tensor topk_ids, Tensor topk_weights) override;
  void moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids, const Tensor& topk_weights,
                   Tensor out) override;
  void moe_route_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits, const Tensor& bias,
                         const RouterParams& p, Tensor topk_ids, Tensor topk_weights, Tensor out,
                         const PendingNorm* pending = nullptr) override;
  // Completes a pending norm (the chain's) where the MoE kernels do not take
  // it: normed{1, D} = rmsnorm(residual) * weight, logits{1, E} scaled to
  // the router's.
  void finish_pending_norm(const PendingNorm& pending, Tensor normed, Tensor logits);
  void argmax_rows(const Tensor& logits, Tensor ids) override;
  void sample_rows(const Tensor& logits, const std::vector<RowSampling>& rows, Tensor ids) override;

  // Whether later load_weight / load_experts calls keep eligible block-FP8
  // weights in FP8 (default: on unless MLASERVE_FP8=0).
  void set_fp8_weights(bool on) { fp8_weights_ = on; }
  bool fp8_weights() const { return fp8_weights_; }
  // Whether one-token absorbed MLA runs as one kernel where the widths allow
  // (default: on unless MLASERVE_MLA_CHAIN=0).
  void set_mla_chain(bool on) { mla_chain_ = on; }

  cudaStream_t stream() const { return stream_; }
  DeviceAllocator& allocator() { return *allocator_; }
  int sm_count() const { return sm_count_; }

  // While set, prepare_batch writes the batch into these fixed buffers
  // (a captured graph reads its inputs from fixed addresses).
  // All seven are slices of `storage` (I32), kv_slots last, so a replay's
  // inputs go up in one copy.
  struct StaticBatchBuffers {
    Tensor storage;
    Tensor input_ids, positions, out_slots, q_indptr, kv_indptr, kv_slots, logit_rows;
    int max_kv_len = 0;  // longest context a replay may carry
    bool capturing = false;  // inputs are uploaded before each replay, not inside the graph
  };
  void use_static_batch_buffers(const StaticBatchBuffers* buffers) { static_batch_ = buffers; }

 private:
  // out = x · wᵀ through the skinny kernel or cuBLASLt.
  void matmul(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
              bool out_f32);
  // A host block-FP8 weight the FP8 kernels can run as stored.
  bool keeps_fp8(const Tensor& w, const Tensor& scale_inv) const;
  // A block-FP8 weight on the device with its scales, K a multiple of 128.
  void check_fp8_weight(const Weight& w) const;
  // out{M, N} bf16 = x · dequant(w)ᵀ with x quantized per token per 128 channels.
  void linear_fp8(const Tensor& x, const Weight& w, Tensor out);
  // Rows quantized 1x128 (fp8_quant.h's layout), the input of FP8 linears.
  struct Fp8Rows {
    uint8_t* q = nullptr;
    float* scale = nullptr;
    int64_t rows = 0, width = 0, scale_ld = 0;
  };
  // Workspace for rows x width quantized: q first, then the scales.
  std::pair<Fp8Rows, Tensor> alloc_fp8_rows(int64_t rows, int64_t width);
  // Zeros rows [rows, scale_ld) (fp8_quant.h's padding) where the producer
  // writes only its rows.
  void zero_padding_rows(const Fp8Rows& r, const char* op);
  // Whether every target is a block-FP8 linear of K-wide input that takes
  // m rows quantized ahead of the GEMM (not inside it: decode rows).
  bool takes_fp8_rows(const std::vector<LinearTarget>& targets, int64_t m, int64_t k) const;
  // linear_fp8's product from rows already quantized (w checked by the caller).
  void linear_fp8_rows(const Fp8Rows& x, const Weight& w, Tensor out);
  // A projection's f32 split-K partials left for its consumer to add
  // (Fp8Linear::run_bf16's deferred_splits): [(s * rows + row) * width + col].
  struct ProjectionPartials {
    const float* data = nullptr;
    int splits = 0;
    int64_t width = 0;
  };
  // mla_prepare_q_b, its q_a and kv added from parts where given.
  void prepare_q_b(const MlaPrepare& mp, const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                   float cos_sin_scale, const Weight& q_b, Tensor q, const ProjectionPartials& parts);
  // mla_prepare's kernel arguments, checked (check_mla_prepare).
  MlaPrepareParams prepare_params(const MlaPrepare& mp, const Tensor& positions, const Tensor& out_slots,
                                  const Tensor& inv_freq, float cos_sin_scale, bool q_a_rows_elsewhere);
  // moe_experts; with route (the routing's logits and outputs), the kernels
  // route the token themselves, or nothing runs and it returns false where
  // they cannot (moe_routes_in_kernels).
  bool run_moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids,
                       const Tensor& topk_weights, Tensor out, const MoeRouteParams* route);
  // head_bmm's transposed product from block-FP8 w {H, N, K}; with rope, the
  // streaming kernel also writes mla_prepare's q split.
  void head_bmm_fp8(const Tensor& x, const Weight& w, Tensor out, const HeadBmmFp8Rope* rope = nullptr);
  void check_head_bmm(const Tensor& x, const Weight& w, bool transpose_w, const Tensor& out) const;
  void check_head_bmm_fp8(const Tensor& x, const Weight& w) const;
  // The stacks behind load_experts: E routed experts then the shared slices
  // (all of them keeps_fp8 for the FP8 stacks of fp8_moe.h).
  struct ExpertSource;
  ExpertWeights stack_experts_bf16(const std::vector<ExpertSource>& sources, int64_t E, int64_t I, int64_t D);
  ExpertWeights stack_experts_fp8(const std::vector<ExpertSource>& sources, int64_t E, int64_t I, int64_t D);
  // bf16 view of a weight-like tensor; f32 ones are converted once and cached.
  const __nv_bfloat16* as_bf16(const Tensor& t, const char* op);
  Tensor upload(const Tensor& host);

  cudaStream_t stream_ = nullptr;
  int sm_count_ = 0;
  std::shared_ptr<DeviceAllocator> allocator_;
  std::unique_ptr<CublasLtGemm> gemm_;
  std::unique_ptr<Fp8Linear> fp8_linear_;
  std::unique_ptr<MoeSelectWorkspace> moe_select_ws_;
  bool fp8_weights_ = true;
  bool mla_chain_ = true;
  DeviceBuffer mla_chain_sync_;  // the chain kernel's arrival counter and mailboxes (zeroed once)
  DeviceBuffer mla_chain_norm_parts_;  // {sm_count} F32: the chain's PendingNorm parts
  DeviceBuffer skinny_norm_arrivals_;  // skinny_gemm_fp8_rms_norm's arrival counter (zeroed once)
  std::unordered_map<const void*, Tensor> bf16_copies_;
  struct HostSlot;
  std::vector<std::shared_ptr<HostSlot>> host_slots_;  // to_host_later's
  void* pinned_ = nullptr;  // host staging for prepare_batch uploads
  size_t pinned_bytes_ = 0;
  cudaEvent_t staging_free_ = nullptr;  // recorded after each staging copy
  const StaticBatchBuffers* static_batch_ = nullptr;
};

}  // namespace mlaserve::cuda
