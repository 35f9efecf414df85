// End-to-end CUDA benchmark of the DeepSeek forward on a random-weight
// checkpoint (v2-lite by default, bf16): decode at several batch sizes with
// CUDA graphs (input 512, output 128 by default), eager decode for contrast,
// and prefill of 1 x 4096 and 8 x 512 tokens. Prints tokens/s, ms per step,
// GB/s against the measured copy bandwidth, TFLOP/s against the measured bf16
// GEMM rate. Routing on random weights is close to uniform (the balanced case).
//
//   bench_model_cuda --dir /tmp/v2lite [--preset v2-lite] [--layers N] [--dtype bf16|fp8]
//                    [--batches 1,8,64|none] [--input 512] [--output 128] [--kv-cache-dtype auto|fp8_e4m3]
//                    [--prefill 0|1|BxL,...] [--extend B,P,N] [--mixed D,C,P] [--mla-mode auto|absorbed|expanded]
//                    [--chain-timeline FILE] [--graph-kv N]
// --prefill times B sequences of L tokens for each BxL given (1: 1x4096 and
// 8x512, the default; 0: none);
// --extend also times B sequences adding N new tokens to a P-token cached
// prefix (a prefix-cache hit); --mixed one step as the scheduler mixes it, D
// decode rows at context C and then a P-token prompt; --mla-mode picks the
// MLA form, auto by default; --chain-timeline writes the bs-1 decode chain
// kernel's phase stamps (a build with -DMLASERVE_CHAIN_TIMELINE=ON;
// scripts/device/chain_timeline.py reads them); --graph-kv captures the
// decode graphs for contexts up to N (default input + output): the engine
// captures them at the model's context length, which changes the attention's
// split plan at small batches.
// With --dtype fp8 the checkpoint is block-FP8 and its weights stay FP8 on
// the GPU (bytes counted at 1 per weight for the quantized projections)
// unless MLASERVE_FP8=0 dequantizes them at load.
#ifdef MLASERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <type_traits>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/make_model.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_graph_runner.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/mla_decode_chain.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/sampling.h"
#include "model/deepseek_model.h"
#include "model/kv_cache.h"

namespace mlaserve::cuda {
namespace {

const std::vector<std::pair<int, int>> kDefaultPrefills = {{1, 4096}, {8, 512}};  // {B, L}

struct Args {
  std::filesystem::path dir = "/tmp/mlaserve_bench_v2lite";
  std::string preset = "v2-lite";
  std::string dtype = "bf16";
  int layers = 0;  // 0: the preset's
  std::vector<int> batches = {1, 8, 64};
  int input = 512, output = 128;
  std::string kv_cache_dtype = "auto";  // the decode runs' latent cache: auto (bf16) or fp8_e4m3
  std::vector<std::pair<int, int>> prefills = kDefaultPrefills;  // {B, L} prefills timed
  int extend_batch = 0, extend_prefix = 0, extend_new = 0;  // --extend B,P,N (0: not timed)
  int mixed_decode = 0, mixed_context = 0, mixed_prompt = 0;  // --mixed D,C,P (0: not timed)
  MlaMode mla_mode = MlaMode::Auto;
  std::string chain_timeline;  // written after the batch-1 decode runs (a timeline build's)
  int graph_kv = 0;            // the decode graphs' longest context (0: input + output)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    else if (k == "--preset") a.preset = v;
    else if (k == "--layers") a.layers = std::stoi(v);
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--input") a.input = std::stoi(v);
    else if (k == "--output") a.output = std::stoi(v);
    else if (k == "--kv-cache-dtype") a.kv_cache_dtype = v;
    else if (k == "--chain-timeline") a.chain_timeline = v;
    else if (k == "--graph-kv") a.graph_kv = std::stoi(v);
    else if (k == "--prefill") {
      a.prefills.clear();
      if (v == "1") a.prefills = kDefaultPrefills;
      std::stringstream ss(v == "0" || v == "1" ? "" : v);  // otherwise BxL shapes
      for (std::string x; std::getline(ss, x, ',');) {
        int B = 0, L = 0;
        MLA_CHECK(std::sscanf(x.c_str(), "%dx%d", &B, &L) == 2 && B > 0 && L > 0,
                  "--prefill {}: want 0, 1 or BxL shapes (positive), comma-separated", v);
        a.prefills.emplace_back(B, L);
      }
    }
    else if (k == "--mla-mode") {
      if (v == "auto") a.mla_mode = MlaMode::Auto;
      else if (v == "absorbed") a.mla_mode = MlaMode::Absorbed;
      else if (v == "expanded") a.mla_mode = MlaMode::Expanded;
      else fail("--mla-mode {}: auto, absorbed or expanded", v);
    } else if (k == "--mixed") {
      MLA_CHECK(std::sscanf(v.c_str(), "%d,%d,%d", &a.mixed_decode, &a.mixed_context, &a.mixed_prompt) == 3 &&
                    a.mixed_decode > 0 && a.mixed_context > 0 && a.mixed_prompt > 0,
                "--mixed {}: want D,C,P (positive)", v);
    } else if (k == "--extend") {
      MLA_CHECK(std::sscanf(v.c_str(), "%d,%d,%d", &a.extend_batch, &a.extend_prefix, &a.extend_new) == 3 &&
                    a.extend_batch > 0 && a.extend_prefix > 0 && a.extend_new > 0,
                "--extend {}: want B,P,N (positive)", v);
    }
    else if (k == "--batches") {
      a.batches.clear();  // "none": no decode runs
      std::stringstream ss(v == "none" ? "" : v);
      for (std::string x; std::getline(ss, x, ',');) a.batches.push_back(std::stoi(x));
    } else {
      fail("unknown option {}", k);
    }
  }
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Ceilings measured in this run (METHOD.md): D2D copy and an 8192^3 bf16 GEMM.
struct Ceilings {
  double copy_gbs = 0, gemm_tflops = 0;
};

Ceilings measure_ceilings() {
  Ceilings c;
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer a(bytes), b(bytes);
  fill_random_bf16(a.get<__nv_bfloat16>(), bytes / 2, 1, nullptr);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e9f;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i) best = std::min(best, ms);
  }
  c.copy_gbs = 2.0 * bytes / (best / 1e3) / 1e9;
  const int64_t n = 8192;
  DeviceBuffer x(n * n * 2), w(n * n * 2), o(n * n * 2);
  fill_random_bf16(x.get<__nv_bfloat16>(), n * n, 2, nullptr);
  fill_random_bf16(w.get<__nv_bfloat16>(), n * n, 3, nullptr);
  CublasLtGemm gemm;
  best = 1e9f;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(e0);
    gemm.linear(x.get<__nv_bfloat16>(), w.get<__nv_bfloat16>(), n, n, n, o.get(), false, nullptr);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i) best = std::min(best, ms);
  }
  c.gemm_tflops = 2.0 * n * n * n / (best / 1e3) / 1e12;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return c;
}

// Weight parameters of one token's matmuls, by kind (v2/v3 layouts).
struct ParamCounts {
  double attention = 0, absorbed = 0, dense_mlp = 0, shared = 0, router = 0, expert = 0, lm_head = 0;
  double quantized_bytes = 2;  // per weight of the projections a block-FP8 checkpoint quantizes
  bool absorbed_whole_blocks = false;  // W_UK / W_UV are whole 128x128 blocks of kv_b_proj, kept in FP8 too
  int moe_layers = 0, experts = 0, top_k = 0;
};

ParamCounts count_params(const ModelConfig& c) {
  ParamCounts p;
  const double D = c.hidden_size, H = c.num_attention_heads, L = c.kv_lora_rank, R = c.qk_rope_head_dim;
  const double Dn = c.qk_nope_head_dim, Dv = c.v_head_dim, Dq = Dn + R;
  const double q = c.q_lora_rank ? D * *c.q_lora_rank + *c.q_lora_rank * H * Dq : D * H * Dq;
  p.attention = c.num_hidden_layers * (q + D * (L + R) + H * Dv * D);
  // decode reads W_UK / W_UV (kv_b_proj's weights): block-FP8 where its
  // per-head parts are whole blocks (model/layer_weights.h), else bf16
  p.absorbed = c.num_hidden_layers * H * (Dn + Dv) * L;
  p.absorbed_whole_blocks = int64_t(Dn) % 128 == 0 && int64_t(Dv) % 128 == 0 && int64_t(L) % 128 == 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_moe_layer(i)) {
      ++p.moe_layers;
      p.shared += 3.0 * D * c.moe_intermediate_size * c.n_shared_experts;
      p.router += D * c.n_routed_experts;
    } else {
      p.dense_mlp += 3.0 * D * c.intermediate_size;
    }
  }
  p.expert = 3.0 * D * c.moe_intermediate_size;
  p.experts = c.n_routed_experts;
  p.top_k = c.num_experts_per_tok;
  p.lm_head = double(c.vocab_size) * D;
  return p;
}

// Bytes a decode step of B sequences must read: every non-expert weight, the
// experts B uniform tokens touch in expectation, and the latent cache
// (kv_slot_bytes a token a layer: 1152 bf16, 656 fp8 at V3 widths).
double decode_bytes(const ModelConfig& c, const ParamCounts& p, int B, int ctx, double kv_slot_bytes) {
  const double touched = p.experts * (1.0 - std::pow(1.0 - double(p.top_k) / p.experts, B));
  const double quantized = p.attention + p.dense_mlp + p.shared + p.moe_layers * touched * p.expert;
  const double kv = double(B) * ctx * kv_slot_bytes * c.num_hidden_layers;
  const double absorbed_bytes = p.absorbed_whole_blocks ? p.quantized_bytes : 2.0;
  return p.quantized_bytes * quantized + absorbed_bytes * p.absorbed + 2.0 * (p.router + p.lm_head) + kv;
}

// Matmul + attention FLOPs of a prefill of B sequences of len tokens (causal).
double prefill_flops(const ModelConfig& c, const ParamCounts& p, int B, int len) {
  const double tokens = double(B) * len;
  const double per_token =
      p.attention + p.absorbed + p.dense_mlp + p.shared + p.router + p.moe_layers * p.top_k * p.expert;
  const double pairs = double(B) * len * (len + 1) / 2.0;
  const double attn = 2.0 * pairs * c.num_attention_heads * (c.qk_head_dim() + c.v_head_dim) * c.num_hidden_layers;
  return 2.0 * per_token * tokens + attn + 2.0 * p.lm_head * B;  // logits of each sequence's last token
}

// Sequences first_seq .. first_seq + B - 1, sequence s at slots s * slot_stride onwards.
ForwardBatch prefill_batch(int B, int len, int slot_stride, std::mt19937& rng, int vocab, int first_seq = 0) {
  ForwardBatch b;
  b.q_indptr = {0};
  b.kv_indptr = {0};
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  for (int s = first_seq; s < first_seq + B; ++s) {
    for (int i = 0; i < len; ++i) {
      b.input_ids.push_back(tok(rng));
      b.positions.push_back(i);
      b.out_slots.push_back(s * slot_stride + i);
      b.kv_slots.push_back(s * slot_stride + i);
    }
    b.q_indptr.push_back(b.q_indptr.back() + len);
    b.kv_indptr.push_back(b.kv_indptr.back() + len);
    b.logit_rows.push_back(b.q_indptr.back() - 1);
  }
  return b;
}

// B sequences each adding n tokens to a p-token prefix already in slots
// [s * slot_stride, + p).
ForwardBatch extend_batch(int B, int p, int n, int slot_stride, std::mt19937& rng, int vocab) {
  ForwardBatch b;
  b.q_indptr = {0};
  b.kv_indptr = {0};
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  for (int s = 0; s < B; ++s) {
    for (int i = 0; i < n; ++i) {
      b.input_ids.push_back(tok(rng));
      b.positions.push_back(p + i);
      b.out_slots.push_back(s * slot_stride + p + i);
    }
    for (int j = 0; j < p + n; ++j) b.kv_slots.push_back(s * slot_stride + j);
    b.q_indptr.push_back(b.q_indptr.back() + n);
    b.kv_indptr.push_back(int32_t(b.kv_slots.size()));
    b.logit_rows.push_back(b.q_indptr.back() - 1);
  }
  return b;
}

ForwardBatch decode_batch(const std::vector<int32_t>& tokens, int len, int slot_stride) {
  ForwardBatch b;
  b.q_indptr = {0};
  b.kv_indptr = {0};
  for (int s = 0; s < int(tokens.size()); ++s) {
    b.input_ids.push_back(tokens[s]);
    b.positions.push_back(len);
    b.out_slots.push_back(s * slot_stride + len);
    for (int j = 0; j <= len; ++j) b.kv_slots.push_back(s * slot_stride + j);
    b.q_indptr.push_back(s + 1);
    b.kv_indptr.push_back(int32_t(b.kv_slots.size()));
    b.logit_rows.push_back(s);
  }
  return b;
}

// Times every op of the model on the GPU (events around each call) while
// forwarding to the CUDA backend: the per-op breakdown of a decode step. It
// forwards the fused ops too (Backend makes them pure virtual), so the model
// it times runs the kernels the engine runs.
class OpTimingBackend final : public Backend {
 private:
  struct Record {
    std::string op;
    cudaEvent_t start, stop;
  };
  template <typename Fn>
  auto timed(std::string op, Fn&& fn) {
    if constexpr (std::is_void_v<decltype(fn())>) {
      if (skip_.count(op)) return;
    }
    if (!enabled_) return fn();
    Record r{std::move(op), nullptr, nullptr};
    cudaEventCreate(&r.start);
    cudaEventCreate(&r.stop);
    cudaEventRecord(r.start, in_.stream());
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      cudaEventRecord(r.stop, in_.stream());
      records_.push_back(std::move(r));
    } else {
      auto out = fn();
      cudaEventRecord(r.stop, in_.stream());
      records_.push_back(std::move(r));
      return out;
    }
  }
  CudaBackend& in_;
  bool enabled_ = false;
  std::vector<Record> records_;
  std::set<std::string> skip_;

 public:
  // MLASERVE_BENCH_SKIP: comma-separated op names (as the op table prints
  // them) whose calls are dropped, so the step time without them shows what
  // each op costs on the critical path of a graph (results are garbage).
  explicit OpTimingBackend(CudaBackend& inner) : in_(inner) {
    if (const char* v = std::getenv("MLASERVE_BENCH_SKIP")) {
      std::stringstream list(v);
      for (std::string op; std::getline(list, op, ',');)
        if (!op.empty()) skip_.insert(op);
    }
  }
  ~OpTimingBackend() override {
    for (auto& r : records_) {
      cudaEventDestroy(r.start);
      cudaEventDestroy(r.stop);
    }
  }
  Device device() const override { return in_.device(); }
  std::string name() const override { return "timed " + in_.name(); }
  DType act_dtype() const override { return in_.act_dtype(); }
  Tensor alloc(const Shape& s, DType d) override { return in_.alloc(s, d); }
  Weight load_weight(const Tensor& w, const Tensor& s) override { return in_.load_weight(w, s); }
  Tensor load_tensor(const Tensor& h) override { return in_.load_tensor(h); }
  ExpertWeights load_experts(std::vector<Weight> g, std::vector<Weight> u, std::vector<Weight> d,
                             std::optional<SharedExpertWeights> s) override {
    return in_.load_experts(std::move(g), std::move(u), std::move(d), std::move(s));
  }
  Tensor to_host(const Tensor& t) override { return in_.to_host(t); }
  std::function<Tensor()> to_host_later(const Tensor& t) override { return in_.to_host_later(t); }
  DeviceBatch prepare_batch(const ForwardBatch& b) override { return timed("prepare_batch", [&] { return in_.prepare_batch(b); }); }
  void synchronize() override { in_.synchronize(); }
  void embedding(const Tensor& i, const Tensor& t, Tensor o, const Tensor& p) override {
    timed("embedding", [&] { in_.embedding(i, t, o, p); });
  }
  void rms_norm(const Tensor& x, const Tensor& w, float e, Tensor o, Tensor r) override {
    timed("rms_norm", [&] { in_.rms_norm(x, w, e, o, r); });
  }
  void linear(const Tensor& x, const Weight& w, Tensor o) override {
    timed(fmt::format("linear {}x{}", w.out_features(), w.in_features()), [&] { in_.linear(x, w, o); });
  }
  void linear_f32_out(const Tensor& x, const Weight& w, Tensor o) override {
    timed(fmt::format("linear_f32_out {}x{}", w.out_features(), w.in_features()), [&] { in_.linear_f32_out(x, w, o); });
  }
  void rope(Tensor x, int off, const Tensor& p, const Tensor& f, float s) override {
    timed("rope", [&] { in_.rope(x, off, p, f, s); });
  }
  void silu_and_mul(const Tensor& g, const Tensor& u, Tensor o) override { timed("silu_and_mul", [&] { in_.silu_and_mul(g, u, o); }); }
  void silu_and_mul_gate_up(const Tensor& gu, Tensor o) override {
    timed("silu_and_mul_gate_up", [&] { in_.silu_and_mul_gate_up(gu, o); });
  }
  void rms_norm_linears(const Tensor& x, const Tensor& norm_w, float eps, Tensor residual,
                        const std::vector<LinearTarget>& targets) override {
    timed("rms_norm_linears", [&] { in_.rms_norm_linears(x, norm_w, eps, residual, targets); });
  }
  void silu_and_mul_linear(const Tensor& gate_up, const Weight& w, Tensor out) override {
    timed(fmt::format("silu_and_mul_linear {}x{}", w.out_features(), w.in_features()),
          [&] { in_.silu_and_mul_linear(gate_up, w, out); });
  }
  void add(Tensor y, const Tensor& x) override { timed("add", [&] { in_.add(y, x); }); }
  void copy_columns(const Tensor& s, int64_t sc, Tensor d, int64_t dc, int64_t n) override {
    timed("copy_columns", [&] { in_.copy_columns(s, sc, d, dc, n); });
  }
  void scatter_rows(Tensor c, const Tensor& r, const Tensor& s) override { timed("scatter_rows", [&] { in_.scatter_rows(c, r, s); }); }
  void gather_rows(const Tensor& c, const Tensor& s, Tensor o) override { timed("gather_rows", [&] { in_.gather_rows(c, s, o); }); }
  void head_bmm(const Tensor& x, const Weight& w, bool t, Tensor o) override { timed("head_bmm", [&] { in_.head_bmm(x, w, t, o); }); }
  void mla_prepare(const MlaPrepare& p, const Tensor& pos, const Tensor& slots, const Tensor& f, float s) override {
    timed("mla_prepare", [&] { in_.mla_prepare(p, pos, slots, f, s); });
  }
  void mla_prepare_q_b(const MlaPrepare& p, const Tensor& pos, const Tensor& slots, const Tensor& f, float s,
                       const Weight& q_b, Tensor q) override {
    timed("mla_prepare_q_b", [&] { in_.mla_prepare_q_b(p, pos, slots, f, s, q_b, q); });
  }
  void rms_norm_linear_mla_prepare_q_b(const ResidualNorm& n, const Weight& w, const MlaPrepare& p, const Tensor& pos,
                                       const Tensor& slots, const Tensor& f, float s, const Weight& q_b,
                                       Tensor q) override {
    timed("rms_norm_linear_mla_prepare_q_b",
          [&] { in_.rms_norm_linear_mla_prepare_q_b(n, w, p, pos, slots, f, s, q_b, q); });
  }
  void mla_prepare_head_bmm(const MlaPrepare& p, const Tensor& pos, const Tensor& slots, const Tensor& f, float s,
                            const Tensor& x, const Weight& w, bool t, Tensor o) override {
    timed("mla_prepare_head_bmm", [&] { in_.mla_prepare_head_bmm(p, pos, slots, f, s, x, w, t, o); });
  }
  void head_bmm_linear(const Tensor& x, const Weight& w, bool t, const Weight& proj, Tensor o) override {
    timed("head_bmm_linear", [&] { in_.head_bmm_linear(x, w, t, proj, o); });
  }
  Tensor mla_chain_router_fold(const Weight& r, const Tensor& n, const Weight& o) override {
    return in_.mla_chain_router_fold(r, n, o);
  }
  bool mla_decode_chain(const MlaDecodeChain& c, const DeviceBatch& b, Tensor o) override {
    if (skip_.count("mla_decode_chain")) return true;
    return timed("mla_decode_chain", [&] { return in_.mla_decode_chain(c, b, o); });
  }
  void mla_attention_absorbed(const Tensor& q, const Tensor& c, const DeviceBatch& b, float s, Tensor o) override {
    timed("mla_attention_absorbed", [&] { in_.mla_attention_absorbed(q, c, b, s, o); });
  }
  void mla_attention_expanded(const Tensor& q, const Tensor& kv, const Tensor& kpe, const DeviceBatch& b, float s,
                              Tensor o) override {
    timed("mla_attention_expanded", [&] { in_.mla_attention_expanded(q, kv, kpe, b, s, o); });
  }
  void mla_attention_expanded_linear(const Tensor& q, const Tensor& kv, const Tensor& kpe, const DeviceBatch& b,
                                     float s, const Weight& w, Tensor o) override {
    timed("mla_attention_expanded_linear", [&] { in_.mla_attention_expanded_linear(q, kv, kpe, b, s, w, o); });
  }
  void moe_route(const Tensor& l, const Tensor& b, const RouterParams& p, Tensor i, Tensor w) override {
    timed("moe_route", [&] { in_.moe_route(l, b, p, i, w); });
  }
  void moe_select(const Tensor& h, const Weight& r, const Tensor& b, const RouterParams& p, Tensor i,
                  Tensor w) override {
    timed("moe_select", [&] { in_.moe_select(h, r, b, p, i, w); });
  }
  void rms_norm_moe_select(const ResidualNorm& n, Tensor o, const Weight& r, const Tensor& b, const RouterParams& p,
                           Tensor i, Tensor w) override {
    timed("rms_norm_moe_select", [&] { in_.rms_norm_moe_select(n, o, r, b, p, i, w); });
  }
  void moe_experts(const Tensor& x, const ExpertWeights& e, const Tensor& i, const Tensor& w, Tensor o) override {
    timed("moe_experts", [&] { in_.moe_experts(x, e, i, w, o); });
  }
  void moe_route_experts(const Tensor& x, const ExpertWeights& e, const Tensor& l, const Tensor& b,
                         const RouterParams& p, Tensor i, Tensor w, Tensor o, const PendingNorm* n) override {
    timed("moe_route_experts", [&] { in_.moe_route_experts(x, e, l, b, p, i, w, o, n); });
  }
  void argmax_rows(const Tensor& logits, Tensor ids) override {
    timed("argmax_rows", [&] { in_.argmax_rows(logits, ids); });
  }
  void sample_rows(const Tensor& logits, const std::vector<RowSampling>& rows, Tensor ids) override {
    timed("sample_rows", [&] { in_.sample_rows(logits, rows, ids); });
  }

  void enable(bool on) { enabled_ = on; }

  // Sum of GPU time per op name since the last reset, largest first.
  void print_and_reset(int steps) {
    in_.synchronize();
    std::map<std::string, std::pair<double, int>> by_op;
    double total = 0;
    for (auto& r : records_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, r.start, r.stop);
      by_op[r.op].first += ms;
      by_op[r.op].second += 1;
      total += ms;
      cudaEventDestroy(r.start);
      cudaEventDestroy(r.stop);
    }
    records_.clear();
    std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_op.begin(), by_op.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
    std::printf("\n| op (per eager decode step) | calls | ms | share |\n|---|---|---|---|\n");
    for (auto& [op, v] : rows)
      std::printf("| %s | %d | %.3f | %.0f%% |\n", op.c_str(), v.second / steps, v.first / steps, 100 * v.first / total);
    std::printf("| all ops | | %.3f | |\n", total / steps);
  }

};

// Device buffers of next_tokens for up to 1024 rows.
struct ArgmaxBuffers {
  explicit ArgmaxBuffers(int64_t vocab) : ids(size_t(4) * 1024), work(greedy_argmax_workspace_bytes(1024, vocab)) {}
  DeviceBuffer ids, work;
};

// Greedy next tokens of device logits {B, V}: argmax on the GPU, B ids to the host.
std::vector<int32_t> next_tokens(CudaBackend& be, const Tensor& logits, ArgmaxBuffers& buf) {
  const int64_t B = logits.dim(0);
  DeviceBuffer& ids = buf.ids;
  greedy_argmax(logits.data<float>(), B, logits.dim(1), ids.get<int32_t>(), buf.work.get(), be.stream());
  std::vector<int32_t> h(B);
  MLA_CUDA_CHECK(cudaMemcpyAsync(h.data(), ids.get(), B * 4, cudaMemcpyDeviceToHost, be.stream()), "bench");
  be.synchronize();
  return h;
}

int run(const Args& a) {
  const Ceilings ceil = measure_ceilings();
  std::printf("ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", ceil.copy_gbs, ceil.gemm_tflops);
  if (!std::filesystem::exists(a.dir / "config.json")) {
    MakeModelOptions o;
    o.preset = a.preset;
    o.dtype = a.dtype;
    o.out_dir = a.dir;
    if (a.layers) o.layers = a.layers;
    o.mtp_layers = 0;
    const auto t0 = std::chrono::steady_clock::now();
    write_random_checkpoint(make_model_config(o), a.dir, 0);
    std::printf("made %s checkpoint in %.1f s\n", a.preset.c_str(), seconds_since(t0));
  }
  auto t0 = std::chrono::steady_clock::now();
  const Checkpoint ckpt = Checkpoint::open(a.dir);
  auto backend_ptr = make_cuda_backend(0);
  MLA_CHECK(backend_ptr, "no CUDA GPU");
  auto& cuda_be = dynamic_cast<CudaBackend&>(*backend_ptr);
  OpTimingBackend timing(cuda_be);
  DeepseekModel model(ckpt, timing, {a.mla_mode, false});
  auto& be = cuda_be;
  be.synchronize();
  const ModelConfig& c = model.config();
  ParamCounts pc = count_params(c);
  if (a.dtype == "fp8" && cuda_be.fp8_weights()) pc.quantized_bytes = 1.0 + 4.0 / (128 * 128);
  std::printf("weights: %s, projections read at %.4f bytes a weight\n", a.dtype.c_str(), pc.quantized_bytes);
  std::printf("loaded %d layers in %.1f s (%s)\n", c.num_hidden_layers, seconds_since(t0), be.name().c_str());
  std::mt19937 rng(1);
  ArgmaxBuffers argmax(c.vocab_size);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);

  // The best of `reps` eager forwards of b after a warm-up one (plans, allocator), in ms.
  auto best_forward_ms = [&](const ForwardBatch& b, const std::vector<Tensor>& cache, int reps) {
    model.forward(b, cache);
    be.synchronize();
    float best = 1e9f;
    for (int i = 0; i < reps; ++i) {
      cudaEventRecord(e0, be.stream());
      model.forward(b, cache);
      cudaEventRecord(e1, be.stream());
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      best = std::min(best, ms);
    }
    return best;
  };

  std::printf("\n| shape | mode | tok/s | ms/step | GB/s | of copy | TFLOP/s | of GEMM |\n|---|---|---|---|---|---|---|---|\n");
  // Prefill.
  for (auto [B, len] : a.prefills) {
    auto cache = allocate_kv_cache(be, c, B * len);
    const ForwardBatch pb = prefill_batch(B, len, len, rng, c.vocab_size);
    const float best = best_forward_ms(pb, cache, 3);
    const double tflops = prefill_flops(c, pc, B, len) / (best / 1e3) / 1e12;
    std::printf("| prefill %d x %d | eager | %.0f | %.2f | | | %.0f | %.0f%% |\n", B, len, B * len / (best / 1e3), best,
                tflops, 100 * tflops / ceil.gemm_tflops);
    std::fflush(stdout);
  }

  if (a.mixed_decode > 0) {
    const int D = a.mixed_decode, C = a.mixed_context, P = a.mixed_prompt, stride = C + 1;
    auto cache = allocate_kv_cache(be, c, D * stride + P);
    const int group = std::max(1, 32768 / C);
    for (int s0 = 0; s0 < D; s0 += group)
      model.forward(prefill_batch(std::min(group, D - s0), C, stride, rng, c.vocab_size, s0), cache);
    ForwardBatch mb = extend_batch(D, C, 1, stride, rng, c.vocab_size);
    const ForwardBatch prompt = prefill_batch(1, P, P, rng, c.vocab_size, 0);
    const int t0 = mb.num_tokens(), k0 = int(mb.kv_slots.size());
    for (int i = 0; i < P; ++i) {
      mb.input_ids.push_back(prompt.input_ids[size_t(i)]);
      mb.positions.push_back(i);
      mb.out_slots.push_back(D * stride + i);
      mb.kv_slots.push_back(D * stride + i);
    }
    mb.q_indptr.push_back(t0 + P);
    mb.kv_indptr.push_back(k0 + P);
    mb.logit_rows.push_back(t0 + P - 1);
    const int absorbed_seqs = absorbed_leading_seqs(mb);
    const float best = best_forward_ms(mb, cache, 5);
    std::printf("| mixed: %d decode rows at %d + a %d-token prompt | %s (%d absorbed sequences) | %.0f | %.3f | | | | |\n",
                D, C, P,
                a.mla_mode == MlaMode::Auto ? "auto" : a.mla_mode == MlaMode::Expanded ? "expanded" : "absorbed",
                a.mla_mode == MlaMode::Auto ? absorbed_seqs : a.mla_mode == MlaMode::Absorbed ? D + 1 : 0,
                (D + P) / (best / 1e3), best);
    std::fflush(stdout);
  }

  if (a.extend_new > 0) {
    const int B = a.extend_batch, P = a.extend_prefix, N = a.extend_new, stride = P + N;
    auto cache = allocate_kv_cache(be, c, B * stride);
    const int group = std::max(1, 32768 / P);
    for (int s0 = 0; s0 < B; s0 += group)
      model.forward(prefill_batch(std::min(group, B - s0), P, stride, rng, c.vocab_size, s0), cache);
    const ForwardBatch eb = extend_batch(B, P, N, stride, rng, c.vocab_size);
    const char* form = a.mla_mode == MlaMode::Expanded   ? "expanded"
                       : a.mla_mode == MlaMode::Absorbed ? "absorbed"
                       : absorbed_form_pays_off(eb)      ? "auto: absorbed"
                                                         : "auto: expanded";
    const float best = best_forward_ms(eb, cache, 5);
    std::printf("| extend bs %d: %d new over %d cached | %s | %.0f | %.3f | | | | |\n", B, N, P, form,
                B * N / (best / 1e3), best);
    std::fflush(stdout);
  }

  // Decode.
  const KvCacheDtype kv_dtype = parse_kv_cache_dtype(a.kv_cache_dtype);
  const double kv_slot_bytes = double(kv_cache_format(c, be.act_dtype(), kv_dtype).slot_bytes());
  std::printf("decode kv cache: %s, %.0f bytes a token a layer\n", std::string(kv_cache_dtype_name(kv_dtype)).c_str(),
              kv_slot_bytes);
  for (int B : a.batches) {
    const int stride = a.input + a.output;
    const int slots = B * stride + 1;
    auto cache = allocate_kv_cache(be, c, slots, kv_dtype);
    // The contexts are prefilled a few sequences at a time (at most ~32k
    // tokens a forward), so long contexts at batch 64 fit beside the weights.
    std::vector<int32_t> tokens;
    const int group = std::max(1, 32768 / a.input);
    for (int s0 = 0; s0 < B; s0 += group) {
      const int n = std::min(group, B - s0);
      const ForwardBatch pb = prefill_batch(n, a.input, stride, rng, c.vocab_size, s0);
      const std::vector<int32_t> t = next_tokens(be, model.forward(pb, cache), argmax);
      tokens.insert(tokens.end(), t.begin(), t.end());
    }
    DecodeGraphOptions opt;
    opt.batch_sizes = {B};
    opt.max_kv_len = std::max(stride, a.graph_kv);
    opt.scratch_slot = slots - 1;
    auto graphs = make_decode_graph_runner(be, opt, [&](const ForwardBatch& b) { return model.forward(b, cache); });
    for (bool use_graph : {false, true}) {
      // Eager: the first 16 steps only (the graph run then rewrites the same slots).
      const int steps = use_graph ? a.output : std::min(a.output, 16);
      std::vector<int32_t> t = tokens;
      if (!use_graph && B == a.batches.front()) timing.enable(true);
      const auto w0 = std::chrono::steady_clock::now();
      cudaEventRecord(e0, be.stream());
      for (int s = 0; s < steps; ++s) {
        const ForwardBatch db = decode_batch(t, a.input + s, stride);
        t = next_tokens(be, use_graph ? graphs->replay(db) : model.forward(db, cache), argmax);
      }
      cudaEventRecord(e1, be.stream());
      cudaEventSynchronize(e1);
      const double sec = seconds_since(w0);
      if (!use_graph && B == a.batches.front()) {
        timing.enable(false);
        timing.print_and_reset(steps);
      }
      const double ms_step = sec * 1e3 / steps;
      const double gbs = decode_bytes(c, pc, B, a.input + steps / 2, kv_slot_bytes) / (ms_step / 1e3) / 1e9;
      std::printf("| decode bs %d (in %d, out %d) | %s | %.0f | %.3f | %.0f | %.0f%% | | |\n", B, a.input, steps,
                  use_graph ? "cuda graph" : "eager", B * steps / sec, ms_step, gbs, 100 * gbs / ceil.copy_gbs);
      std::fflush(stdout);
    }
    {
      // The graph replayed back to back on one batch, no step's tokens read
      // on the host: the step time when the host keeps ahead of the GPU
      // (only the batch upload stays between replays).
      const ForwardBatch db = decode_batch(tokens, a.input, stride);
      graphs->replay(db);
      cudaEventRecord(e0, be.stream());
      for (int s = 0; s < a.output; ++s) graphs->replay(db);
      cudaEventRecord(e1, be.stream());
      cudaEventSynchronize(e1);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, e0, e1);
      const double ms_step = ms / a.output;
      const double gbs = decode_bytes(c, pc, B, a.input, kv_slot_bytes) / (ms_step / 1e3) / 1e9;
      std::printf("| decode bs %d (in %d, out %d) | cuda graph, no host round trip | %.0f | %.3f | %.0f | %.0f%% | | |\n",
                  B, a.input, a.output, B / (ms_step / 1e3), ms_step, gbs, 100 * gbs / ceil.copy_gbs);
      std::fflush(stdout);
    }
    if (B == 1 && !a.chain_timeline.empty()) mla_decode_chain_timeline_dump(a.chain_timeline);
  }
  std::printf("\nbytes/step at bs 1: %.2f GB (limit %.0f tok/s at the measured copy bandwidth)\n",
              decode_bytes(c, pc, 1, a.input, kv_slot_bytes) / 1e9,
              ceil.copy_gbs * 1e9 / decode_bytes(c, pc, 1, a.input, kv_slot_bytes));
  return 0;
}

}  // namespace
}  // namespace mlaserve::cuda

int main(int argc, char** argv) {
  try {
    return mlaserve::cuda::run(mlaserve::cuda::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model_cuda: %s\n", e.what());
    return 1;
  }
}
#else
#include <cstdio>
int main() {
  std::puts("bench_model_cuda: built without CUDA");
  return 0;
}
#endif
