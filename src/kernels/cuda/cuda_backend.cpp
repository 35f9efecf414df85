#include "kernels/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fp8_kv_cache.h"
#include "kernels/cuda/fp8_linear.h"
#include "kernels/cuda/fp8_moe.h"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/mla_absorbed.h"
#include "kernels/cuda/mla_decode_chain.h"
#include "kernels/cuda/mla_expanded.h"
#include "kernels/cuda/mla_prepare.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/head_bmm_fp8.h"
#include "kernels/cuda/head_bmm_small.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/moe_select.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/mla_prepare_dims.h"

namespace mlaserve {
namespace cuda {
namespace {

// Rows up to which linear() takes the skinny kernel, and the weight size
// above which cuBLASLt keeps it (the lm_head). Inside CUDA graphs on an H200
// (BM_SkinnyGemm mode 1 vs 3, 20 launches): 1 x 3648 x 2048 5.4 vs 6.8 us,
// 1 x 2048 x 2048 4.0 vs 6.2, but 4 rows 11.2 vs 6.8 and 6.1 vs 6.2.
constexpr int64_t kSkinnyRowsUsed = 2;
constexpr int64_t kSkinnyMaxWeightElems = int64_t(64) << 20;

int64_t row_count(const Tensor& t) { return t.ndim() == 0 || t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }

void check_dev(const Tensor& t, DType dtype, const char* op, const char* what) {
  MLA_CHECK(t.defined() && t.device() == Device::CUDA && t.dtype() == dtype, "{}: {} must be a CUDA {} tensor, got {} {}",
            op, what, dtype_name(dtype), t.device() == Device::CUDA ? "CUDA" : "CPU", dtype_name(t.dtype()));
}

__nv_bfloat16* bf(const Tensor& t, const char* op, const char* what) {
  check_dev(t, DType::BF16, op, what);
  return t.data<__nv_bfloat16>();
}

const int32_t* i32(const Tensor& t, const char* op, const char* what) {
  check_dev(t, DType::I32, op, what);
  return t.data<int32_t>();
}

// Host conversion of a checkpoint weight to bf16 (block-FP8 dequantized with
// its scales; f16/f32 rounded). bf16 weights are not copied here.
std::vector<uint16_t> host_weight_to_bf16(const Tensor& w, const Tensor& scale_inv) {
  const int64_t N = w.dim(0), K = w.dim(1);
  std::vector<uint16_t> out(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = size_t(n * K + k);
      float v = 0.0f;
      switch (w.dtype()) {
        case DType::F8_E4M3:
          v = fp8e4m3_to_f32(w.data<uint8_t>()[i]) * scale_inv.data<float>()[(n / 128) * scale_inv.dim(1) + k / 128];
          break;
        case DType::F16: v = f16_to_f32(w.data<uint16_t>()[i]); break;
        case DType::F32: v = w.data<float>()[i]; break;
        default: fail("weight dtype {} not supported by the CUDA backend", dtype_name(w.dtype()));
      }
      out[i] = f32_to_bf16(v);
    }
  return out;
}

// A layer's experts stacked for the fused MoE kernels: the routed ones, then
// the shared MLP cut into num_shared experts of width I. gate_up {E + S, 2I, D},
// down {E + S, D, I}. bf16 stacks interleave gate and up by 8 rows
// (moe_experts.h); FP8 stacks keep all gate rows then all up rows, with their
// block scales stacked the same way (fp8_moe.h).
struct StackedExperts {
  Tensor gate_up, down;
  Tensor gate_up_scale, down_scale;  // defined only for FP8 stacks
  int64_t hidden, inter;
  int num_shared = 0;
  bool fp8() const { return gate_up_scale.defined(); }
};

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// On unless MLASERVE_FP8=0: a block-FP8 checkpoint (V3, R1, V3.1, V3.2)
// then takes half the memory and half the decode bytes. The switch keeps the
// bf16-dequantized path for comparison.
bool fp8_weights_from_env() {
  const char* v = std::getenv("MLASERVE_FP8");
  return !(v && std::strcmp(v, "0") == 0);
}

// On unless MLASERVE_MLA_CHAIN=0, which keeps the op-by-op absorbed MLA at
// one token (to measure what the fused chain buys).
bool mla_chain_from_env() {
  const char* v = std::getenv("MLASERVE_MLA_CHAIN");
  return !(v && std::strcmp(v, "0") == 0);
}

}  // namespace

CudaBackend::CudaBackend()
    : allocator_(std::make_shared<DeviceAllocator>()),
      fp8_weights_(fp8_weights_from_env()),
      mla_chain_(mla_chain_from_env()) {
  MLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "backend start-up");
  MLA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, 0), "backend start-up");
  gemm_ = std::make_unique<CublasLtGemm>();
  fp8_linear_ = std::make_unique<Fp8Linear>();
  moe_select_ws_ = std::make_unique<MoeSelectWorkspace>();
  mla_chain_sync_ = DeviceBuffer(mla_decode_chain_sync_bytes());
  mla_chain_norm_parts_ = DeviceBuffer(sizeof(float) * size_t(std::max(sm_count_, 1)));
  MLA_CUDA_CHECK(cudaMemset(mla_chain_sync_.get(), 0, mla_chain_sync_.bytes()), "backend start-up");
  skinny_norm_arrivals_ = DeviceBuffer(sizeof(unsigned));
  MLA_CUDA_CHECK(cudaMemset(skinny_norm_arrivals_.get(), 0, skinny_norm_arrivals_.bytes()), "backend start-up");
  pinned_bytes_ = size_t(1) << 20;
  MLA_CUDA_CHECK(cudaMallocHost(&pinned_, pinned_bytes_), "backend start-up");
  MLA_CUDA_CHECK(cudaEventCreateWithFlags(&staging_free_, cudaEventDisableTiming), "backend start-up");
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  bf16_copies_.clear();
  gemm_.reset();
  fp8_linear_.reset();
  moe_select_ws_.reset();
  if (pinned_) cudaFreeHost(pinned_);
  if (staging_free_) cudaEventDestroy(staging_free_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  return fmt::format("cuda ({}, {} SMs, bf16{})", prop.name, sm_count_, fp8_weights_ ? ", fp8 weights" : "");
}

Tensor CudaBackend::alloc(const Shape& shape, DType dtype) {
  for (int64_t d : shape) MLA_CHECK(d >= 0, "alloc: negative dimension in {}", shape_str(shape));
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  std::shared_ptr<void> block = allocator_->allocate(bytes);
  return Tensor::wrap(block.get(), shape, dtype, Device::CUDA, block);
}

Tensor CudaBackend::upload(const Tensor& host) {
  Tensor d = alloc(host.shape(), host.dtype());
  if (host.nbytes())
    MLA_CUDA_CHECK(cudaMemcpyAsync(d.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, stream_), "upload");
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream_), "upload");  // the host source may be a temporary
  return d;
}

Weight CudaBackend::load_weight(const Tensor& w, const Tensor& scale_inv) {
  MLA_CHECK(w.ndim() == 2, "linear weight must be 2-D, got {}", shape_str(w.shape()));
  if (w.device() == Device::CUDA) {
    MLA_CHECK(w.dtype() == DType::BF16, "CUDA weights must be BF16, got {}", dtype_name(w.dtype()));
    return Weight{w, {}};
  }
  if (w.dtype() == DType::BF16) return Weight{upload(w), {}};
  if (w.dtype() == DType::F8_E4M3) {
    const int64_t nb = (w.dim(0) + 127) / 128, kb = (w.dim(1) + 127) / 128;
    MLA_CHECK(scale_inv.defined() && scale_inv.dtype() == DType::F32 && scale_inv.shape() == Shape({nb, kb}),
              "FP8 weight {} needs F32 weight_scale_inv [{}, {}]", shape_str(w.shape()), nb, kb);
    if (keeps_fp8(w, scale_inv)) return Weight{upload(w), upload(scale_inv)};
  }
  // Block-FP8 the FP8 kernels cannot run (K not a multiple of 128, or FP8
  // switched off) is dequantized to bf16: correct, 2x the bytes of FP8.
  std::vector<uint16_t> converted = host_weight_to_bf16(w, scale_inv);
  return Weight{upload(Tensor::wrap(converted.data(), w.shape(), DType::BF16, Device::CPU)), {}};
}

bool CudaBackend::keeps_fp8(const Tensor& w, const Tensor& scale_inv) const {
  // The FP8 kernels need whole 128-wide K blocks (activation groups and the
  // own kernel's 16-byte loads); partial N blocks are handled.
  return fp8_weights_ && w.device() == Device::CPU && w.dtype() == DType::F8_E4M3 && w.ndim() == 2 &&
         w.dim(0) > 0 && w.dim(1) > 0 && w.dim(1) % kFp8Group == 0 && scale_inv.defined() &&
         scale_inv.device() == Device::CPU && scale_inv.dtype() == DType::F32 &&
         scale_inv.shape() == Shape({(w.dim(0) + 127) / 128, w.dim(1) / 128});
}

Tensor CudaBackend::load_tensor(const Tensor& host) {
  if (host.device() == Device::CUDA) return host;
  return upload(host);
}

// One expert of a stack: gate and up rows [col0, col0 + I) and down columns
// [col0, col0 + I) of these weights (a routed expert whole, or a width-I
// slice of the shared MLP).
struct CudaBackend::ExpertSource {
  Weight gate, up, down;
  int64_t col0;
};

ExpertWeights CudaBackend::load_experts(std::vector<Weight> gate, std::vector<Weight> up, std::vector<Weight> down,
                                        std::optional<SharedExpertWeights> shared) {
  const int64_t E = int64_t(gate.size());
  MLA_CHECK(E > 0 && up.size() == gate.size() && down.size() == gate.size(), "experts: {} gate, {} up, {} down weights",
            gate.size(), up.size(), down.size());
  MLA_CHECK(gate[0].w.ndim() == 2, "expert 0: gate weight must be 2-D, got {}", shape_str(gate[0].w.shape()));
  const int64_t I = gate[0].out_features(), D = gate[0].in_features();
  MLA_CHECK(I % 8 == 0 && D % 8 == 0, "experts: intermediate size {} and hidden size {} must be multiples of 8", I, D);
  std::vector<ExpertSource> sources;
  for (int64_t e = 0; e < E; ++e) {
    MLA_CHECK(gate[e].w.shape() == Shape({I, D}) && up[e].w.shape() == Shape({I, D}) &&
                  down[e].w.shape() == Shape({D, I}),
              "expert {}: gate {}, up {}, down {} do not match expert 0's [{}, {}]", e, shape_str(gate[e].w.shape()),
              shape_str(up[e].w.shape()), shape_str(down[e].w.shape()), I, D);
    sources.push_back({gate[e], up[e], down[e], 0});
  }
  int num_shared = 0;
  if (shared) {
    const int64_t Is = shared->gate.w.ndim() == 2 ? shared->gate.out_features() : 0;
    MLA_CHECK(Is > 0 && Is % I == 0 && shared->gate.w.shape() == Shape({Is, D}) &&
                  shared->up.w.shape() == Shape({Is, D}) && shared->down.w.shape() == Shape({D, Is}),
              "shared experts: gate {}, up {}, down {} are not one MLP of a multiple of the routed width {} over {}",
              shape_str(shared->gate.w.shape()), shape_str(shared->up.w.shape()), shape_str(shared->down.w.shape()),
              I, D);
    num_shared = int(Is / I);
    for (int s = 0; s < num_shared; ++s) sources.push_back({shared->gate, shared->up, shared->down, s * I});
  }
  bool all_fp8 = I % kFp8Group == 0 && D % kFp8Group == 0;
  for (const ExpertSource& src : sources)
    all_fp8 = all_fp8 && keeps_fp8(src.gate.w, src.gate.scale_inv) && keeps_fp8(src.up.w, src.up.scale_inv) &&
              keeps_fp8(src.down.w, src.down.scale_inv);
  ExpertWeights out = all_fp8 ? stack_experts_fp8(sources, E, I, D) : stack_experts_bf16(sources, E, I, D);
  out.num_shared = num_shared;
  static_cast<StackedExperts*>(out.packed.get())->num_shared = num_shared;
  return out;
}

// Sources may be host (the checkpoint's mmapped views) or device tensors:
// cudaMemcpyDefault lets the unified address space tell them apart.
ExpertWeights CudaBackend::stack_experts_bf16(const std::vector<ExpertSource>& sources, int64_t E, int64_t I,
                                              int64_t D) {
  const int64_t X = int64_t(sources.size());
  auto stacked = std::make_shared<StackedExperts>();
  stacked->hidden = D;
  stacked->inter = I;
  stacked->gate_up = alloc({X, 2 * I, D}, DType::BF16);
  stacked->down = alloc({X, D, I}, DType::BF16);
  const size_t mat = size_t(I * D) * 2, group = size_t(8 * D) * 2;  // bytes of a matrix, of 8 rows
  auto* gu = static_cast<char*>(stacked->gate_up.raw());
  auto* dn = static_cast<char*>(stacked->down.raw());
  // Non-bf16 weights (dequantized FP8, f16, f32) are converted on the host;
  // each expert's copies live until its transfers are done.
  std::unordered_map<const void*, std::vector<uint16_t>> converted;
  auto bf16_bytes = [&](const Weight& w) -> const char* {
    if (w.w.dtype() == DType::BF16) return static_cast<const char*>(w.w.raw());
    MLA_CHECK(w.w.device() == Device::CPU, "experts: device weights must be BF16, got {}", dtype_name(w.w.dtype()));
    auto it = converted.find(w.w.raw());
    if (it == converted.end()) it = converted.emplace(w.w.raw(), host_weight_to_bf16(w.w, w.scale_inv)).first;
    return reinterpret_cast<const char*>(it->second.data());
  };
  ExpertWeights out;
  for (int64_t x = 0; x < X; ++x) {
    const ExpertSource& src = sources[size_t(x)];
    const size_t col_bytes = size_t(src.col0) * 2, down_pitch = size_t(src.down.in_features()) * 2;
    // gate_up interleaves 8-row groups of gate and up (see moe_experts.h).
    char* gdst = gu + 2 * x * mat;
    MLA_CUDA_CHECK(cudaMemcpy2DAsync(gdst, 2 * group, bf16_bytes(src.gate) + col_bytes * D, group, group,
                                     size_t(I / 8), cudaMemcpyDefault, stream_),
                   "load_experts");
    MLA_CUDA_CHECK(cudaMemcpy2DAsync(gdst + group, 2 * group, bf16_bytes(src.up) + col_bytes * D, group, group,
                                     size_t(I / 8), cudaMemcpyDefault, stream_),
                   "load_experts");
    MLA_CUDA_CHECK(cudaMemcpy2DAsync(dn + x * mat, size_t(I) * 2, bf16_bytes(src.down) + col_bytes, down_pitch,
                                     size_t(I) * 2, size_t(D), cudaMemcpyDefault, stream_),
                   "load_experts");
    // The routed experts live only in the stacks (`packed`): gate[e] is expert
    // e's interleaved gate_up block, up[e] stays empty, down[e] is its down block.
    if (x < E) {
      out.gate.push_back({Tensor::wrap(gdst, {2 * I, D}, DType::BF16, Device::CUDA, stacked), {}});
      out.up.push_back({});
      out.down.push_back({Tensor::wrap(dn + x * mat, {D, I}, DType::BF16, Device::CUDA, stacked), {}});
    }
    if (!converted.empty()) {  // one expert's conversions at a time, not a whole layer's
      MLA_CUDA_CHECK(cudaStreamSynchronize(stream_), "load_experts");
      converted.clear();
    }
  }
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream_), "load_experts");  // pageable sources: done before returning
  out.packed = stacked;
  return out;
}

ExpertWeights CudaBackend::stack_experts_fp8(const std::vector<ExpertSource>& sources, int64_t E, int64_t I,
                                             int64_t D) {
  const int64_t X = int64_t(sources.size()), ib = I / kFp8Group, db = D / kFp8Group;
  auto stacked = std::make_shared<StackedExperts>();
  stacked->hidden = D;
  stacked->inter = I;
  stacked->gate_up = alloc({X, 2 * I, D}, DType::F8_E4M3);
  stacked->down = alloc({X, D, I}, DType::F8_E4M3);
  stacked->gate_up_scale = alloc({X, 2 * ib, db}, DType::F32);
  stacked->down_scale = alloc({X, db, ib}, DType::F32);
  const size_t mat = size_t(I * D), scales = size_t(ib * db) * 4;  // bytes of a matrix, of its scales
  auto* gu = static_cast<char*>(stacked->gate_up.raw());
  auto* dn = static_cast<char*>(stacked->down.raw());
  auto* gus = static_cast<char*>(stacked->gate_up_scale.raw());
  auto* dns = static_cast<char*>(stacked->down_scale.raw());
  // rows x width bytes from src (row pitch src_pitch) to dst (packed rows).
  auto copy_in = [&](char* dst, const void* src, size_t src_pitch, size_t width, size_t rows) {
    MLA_CUDA_CHECK(cudaMemcpy2DAsync(dst, width, src, src_pitch, width, rows, cudaMemcpyHostToDevice, stream_),
                   "load_experts");
  };
  auto bytes = [](const Tensor& t) { return static_cast<const char*>(t.raw()); };
  ExpertWeights out;
  for (int64_t x = 0; x < X; ++x) {
    const ExpertSource& src = sources[size_t(x)];
    const int64_t Is = src.down.in_features(), cb = src.col0 / kFp8Group;  // cb: first 128-block of the slice
    // gate / up rows [col0, col0 + I) and their scale rows are contiguous.
    copy_in(gu + 2 * x * mat, bytes(src.gate.w) + src.col0 * D, mat, mat, 1);
    copy_in(gu + (2 * x + 1) * mat, bytes(src.up.w) + src.col0 * D, mat, mat, 1);
    copy_in(gus + 2 * x * scales, bytes(src.gate.scale_inv) + cb * db * 4, scales, scales, 1);
    copy_in(gus + (2 * x + 1) * scales, bytes(src.up.scale_inv) + cb * db * 4, scales, scales, 1);
    // down columns [col0, col0 + I) of {D, Is}, and of its scales {D/128, Is/128}.
    copy_in(dn + x * mat, bytes(src.down.w) + src.col0, size_t(Is), size_t(I), size_t(D));
    copy_in(dns + x * scales, bytes(src.down.scale_inv) + cb * 4, size_t(Is / kFp8Group) * 4, size_t(ib) * 4,
            size_t(db));
    // As in the bf16 stacks: gate[e] is expert e's [gate | up] block, up[e] stays empty.
    if (x < E) {
      out.gate.push_back({Tensor::wrap(gu + 2 * x * mat, {2 * I, D}, DType::F8_E4M3, Device::CUDA, stacked),
                          Tensor::wrap(gus + 2 * x * scales, {2 * ib, db}, DType::F32, Device::CUDA, stacked)});
      out.up.push_back({});
      out.down.push_back({Tensor::wrap(dn + x * mat, {D, I}, DType::F8_E4M3, Device::CUDA, stacked),
                          Tensor::wrap(dns + x * scales, {db, ib}, DType::F32, Device::CUDA, stacked)});
    }
  }
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream_), "load_experts");  // the host sources may be temporaries
  out.packed = stacked;
  return out;
}

Tensor CudaBackend::to_host(const Tensor& t) {
  if (t.device() == Device::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  if (t.nbytes())
    MLA_CUDA_CHECK(cudaMemcpyAsync(h.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_), "to_host");
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream_), "to_host");
  return h;
}

// Pinned buffers for to_host_later, each with the event its copy records;
// one is reused once no pending result holds it.
struct CudaBackend::HostSlot {
  void* pinned = nullptr;
  size_t bytes = 0;
  cudaEvent_t copied = nullptr;
  ~HostSlot() {
    if (pinned) cudaFreeHost(pinned);
    if (copied) cudaEventDestroy(copied);
  }
};

std::function<Tensor()> CudaBackend::to_host_later(const Tensor& t) {
  MLA_CHECK(t.device() == Device::CUDA, "to_host_later: a CUDA tensor is required");
  auto it = std::find_if(host_slots_.begin(), host_slots_.end(), [](auto& s) { return s.use_count() == 1; });
  if (it == host_slots_.end()) {
    auto slot = std::make_shared<HostSlot>();
    MLA_CUDA_CHECK(cudaEventCreateWithFlags(&slot->copied, cudaEventDisableTiming), "to_host_later");
    host_slots_.push_back(slot);
    it = host_slots_.end() - 1;
  }
  std::shared_ptr<HostSlot> slot = *it;
  if (slot->bytes < t.nbytes()) {
    if (slot->pinned) cudaFreeHost(slot->pinned);
    slot->pinned = nullptr;
    slot->bytes = 0;
    MLA_CUDA_CHECK(cudaMallocHost(&slot->pinned, t.nbytes()), "to_host_later");
    slot->bytes = t.nbytes();
  }
  if (t.nbytes())
    MLA_CUDA_CHECK(cudaMemcpyAsync(slot->pinned, t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_),
                   "to_host_later");
  MLA_CUDA_CHECK(cudaEventRecord(slot->copied, stream_), "to_host_later");
  return [slot, shape = t.shape(), dtype = t.dtype()] {
    MLA_CUDA_CHECK(cudaEventSynchronize(slot->copied), "to_host_later");
    Tensor h = Tensor::empty(shape, dtype);
    if (h.nbytes()) std::memcpy(h.raw(), slot->pinned, h.nbytes());
    return h;
  };
}

void CudaBackend::synchronize() { MLA_CUDA_CHECK(cudaStreamSynchronize(stream_), "synchronize"); }

DeviceBatch CudaBackend::prepare_batch(const ForwardBatch& b) {
  const int T = b.num_tokens(), B = b.num_seqs();
  MLA_CHECK(B >= 1 && int(b.kv_indptr.size()) == B + 1 && int(b.positions.size()) == T &&
                int(b.out_slots.size()) == T && b.q_indptr.front() == 0 && b.q_indptr.back() == T &&
                b.kv_indptr.front() == 0 && b.kv_indptr.back() == int(b.kv_slots.size()),
            "malformed ForwardBatch: {} tokens, {} sequences, q_indptr/kv_indptr/positions/out_slots disagree", T, B);
  DeviceBatch d;
  d.num_seqs = B;
  d.num_tokens = T;
  d.num_logit_rows = int(b.logit_rows.size());
  d.is_decode = b.is_decode();
  for (int s = 0; s < B; ++s) {
    const int q_len = b.q_indptr[s + 1] - b.q_indptr[s], kv_len = b.kv_indptr[s + 1] - b.kv_indptr[s];
    MLA_CHECK(q_len >= 0 && kv_len >= q_len, "sequence {}: q_len {} and kv_len {} inconsistent", s, q_len, kv_len);
    d.max_q_len = std::max(d.max_q_len, q_len);
    d.max_kv_len = std::max(d.max_kv_len, kv_len);
  }
  for (int32_t r : b.logit_rows) MLA_CHECK(r >= 0 && r < T, "logit row {} outside the batch's {} tokens", r, T);
  d.host = b;

  // One staging copy for all seven arrays.
  const std::vector<int32_t>* arrays[] = {&b.input_ids, &b.positions, &b.out_slots, &b.q_indptr,
                                          &b.kv_indptr, &b.kv_slots,  &b.logit_rows};
  size_t total = 0;
  for (auto* a : arrays) total += a->size();
  Tensor* fields[] = {&d.input_ids, &d.positions, &d.out_slots, &d.q_indptr, &d.kv_indptr, &d.kv_slots, &d.logit_rows};
  if (static_batch_ && static_batch_->capturing) {
    // Inside graph capture: the graph reads the fixed buffers, which the
    // runner fills before each replay; nothing is copied or synchronized here.
    const Tensor* fixed[] = {&static_batch_->input_ids, &static_batch_->positions, &static_batch_->out_slots,
                             &static_batch_->q_indptr,  &static_batch_->kv_indptr, &static_batch_->kv_slots,
                             &static_batch_->logit_rows};
    for (int i = 0; i < 7; ++i) *fields[i] = fixed[i]->view({fixed[i]->numel()}).slice_rows(0, int64_t(arrays[i]->size()));
    return d;
  }
  // The staging buffer is free once the previous batch's copy ran (not the
  // whole previous step: the host keeps running ahead of the GPU).
  MLA_CUDA_CHECK(cudaEventSynchronize(staging_free_), "prepare_batch");
  // The fixed buffers' layout is mirrored in the staging buffer, which then
  // goes up in one copy (seven small copies cost ~1% of a bs-1 step).
  const size_t staged = static_batch_ ? size_t(static_batch_->storage.numel()) : total;
  if (staged * 4 > pinned_bytes_) {
    cudaFreeHost(pinned_);
    pinned_bytes_ = std::max(staged * 4, 2 * pinned_bytes_);
    MLA_CUDA_CHECK(cudaMallocHost(&pinned_, pinned_bytes_), "prepare_batch staging");
  }
  auto* staging = static_cast<int32_t*>(pinned_);
  if (static_batch_) {
    const Tensor* fixed[] = {&static_batch_->input_ids, &static_batch_->positions, &static_batch_->out_slots,
                             &static_batch_->q_indptr,  &static_batch_->kv_indptr, &static_batch_->kv_slots,
                             &static_batch_->logit_rows};
    const auto* base = static_batch_->storage.data<int32_t>();
    size_t end = 0;
    for (int i = 0; i < 7; ++i) {
      const size_t n = arrays[i]->size();
      MLA_CHECK(int64_t(n) <= fixed[i]->numel(), "prepare_batch: {} entries exceed the captured graph's {}", n,
                fixed[i]->numel());
      const size_t off = size_t(fixed[i]->data<int32_t>() - base);
      std::memcpy(staging + off, arrays[i]->data(), n * 4);
      end = std::max(end, off + n);
      *fields[i] = fixed[i]->view({fixed[i]->numel()}).slice_rows(0, int64_t(n));
    }
    MLA_CUDA_CHECK(cudaMemcpyAsync(static_batch_->storage.raw(), staging, end * 4, cudaMemcpyHostToDevice, stream_),
                   "prepare_batch");
    MLA_CUDA_CHECK(cudaEventRecord(staging_free_, stream_), "prepare_batch");
    return d;
  }
  Tensor all = alloc({int64_t(total)}, DType::I32);
  size_t off = 0;
  for (int i = 0; i < 7; ++i) {
    const size_t n = arrays[i]->size();
    std::memcpy(staging + off, arrays[i]->data(), n * 4);
    *fields[i] = all.slice_rows(int64_t(off), int64_t(off + n));
    off += n;
  }
  if (total)
    MLA_CUDA_CHECK(cudaMemcpyAsync(all.raw(), staging, total * 4, cudaMemcpyHostToDevice, stream_), "prepare_batch");
  MLA_CUDA_CHECK(cudaEventRecord(staging_free_, stream_), "prepare_batch");
  return d;
}

const __nv_bfloat16* CudaBackend::as_bf16(const Tensor& t, const char* op) {
  MLA_CHECK(t.defined() && t.device() == Device::CUDA, "{}: weight must be a CUDA tensor", op);
  if (t.dtype() == DType::BF16) return t.data<__nv_bfloat16>();
  MLA_CHECK(t.dtype() == DType::F32, "{}: weight dtype {} not supported (BF16 or F32)", op, dtype_name(t.dtype()));
  auto it = bf16_copies_.find(t.raw());
  if (it == bf16_copies_.end()) {
    // Once per weight, at its first use (warm-up), never on later steps.
    Tensor copy = alloc(t.shape(), DType::BF16);
    convert_f32_to_bf16(t.data<float>(), t.numel(), copy.data<__nv_bfloat16>(), stream_);
    it = bf16_copies_.emplace(t.raw(), copy).first;
  }
  return it->second.data<__nv_bfloat16>();
}

void CudaBackend::embedding(const Tensor& ids, const Tensor& table, Tensor out, const Tensor& picked) {
  const int64_t D = table.dim(1);
  MLA_CHECK(out.dim(0) == ids.numel() && out.dim(1) == D, "embedding: out {} for {} ids of width {}",
            shape_str(out.shape()), ids.numel(), D);
  cuda::embedding(i32(ids, "embedding", "ids"), picked.defined() ? i32(picked, "embedding", "picked") : nullptr,
                  as_bf16(table, "embedding"), ids.numel(), D, bf(out, "embedding", "out"), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out, Tensor residual) {
  const int64_t D = x.dim(-1);
  MLA_CHECK(w.numel() == D && out.numel() == x.numel() && (!residual.defined() || residual.numel() == x.numel()),
            "rms_norm: x {}, w {}, out {}", shape_str(x.shape()), shape_str(w.shape()), shape_str(out.shape()));
  cuda::rms_norm(bf(x, "rms_norm", "x"), as_bf16(w, "rms_norm"), eps, row_count(x), D, bf(out, "rms_norm", "out"),
                 residual.defined() ? bf(residual, "rms_norm", "residual") : nullptr, stream_);
}

void CudaBackend::matmul(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
                         bool out_f32) {
  // Decode-sized products stream the weights with the skinny kernel, except
  // the huge lm_head, where cuBLASLt already runs at the copy bandwidth.
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  if (aligned && m <= kSkinnyRowsUsed && skinny_gemm_applies(m, k) && n * k < kSkinnyMaxWeightElems) {
    skinny_gemm(x, w, m, n, k, out, out_f32, stream_);
  } else {
    gemm_->linear(x, w, m, n, k, out, out_f32, stream_);
  }
}

void CudaBackend::linear(const Tensor& x, const Weight& w, Tensor out) {
  const int64_t K = w.in_features(), N = w.out_features();
  MLA_CHECK(x.dim(-1) == K && out.dim(-1) == N && row_count(x) == row_count(out),
            "linear: x {} · W{}ᵀ does not fit out {}", shape_str(x.shape()), shape_str(w.w.shape()),
            shape_str(out.shape()));
  if (w.is_fp8()) {
    linear_fp8(x, w, out);
    return;
  }
  matmul(bf(x, "linear", "x"), bf(w.w, "linear", "weight"), row_count(x), N, K, bf(out, "linear", "out"), false);
}

void CudaBackend::check_fp8_weight(const Weight& w) const {
  const int64_t N = w.out_features(), K = w.in_features();
  check_dev(w.w, DType::F8_E4M3, "linear", "weight");
  check_dev(w.scale_inv, DType::F32, "linear", "weight scale_inv");
  MLA_CHECK(K % kFp8Group == 0 && w.scale_inv.shape() == Shape({(N + 127) / 128, K / kFp8Group}),
            "linear: FP8 weight {} with scales {} (K must be a multiple of 128)", shape_str(w.w.shape()),
            shape_str(w.scale_inv.shape()));
}

void CudaBackend::linear_fp8(const Tensor& x, const Weight& w, Tensor out) {
  const int64_t M = row_count(x), N = w.out_features(), K = w.in_features();
  check_fp8_weight(w);
  const __nv_bfloat16* xp = bf(x, "linear", "x");
  __nv_bfloat16* op = bf(out, "linear", "out");
  if (M == 0) return;
  if (fp8_linear_->takes_bf16_rows(M, N, K)) {  // decode rows: no quantization kernel
    const size_t gemm_bytes = Fp8Linear::workspace_bytes(M, N, K);
    Tensor work = alloc({int64_t(gemm_bytes)}, DType::U8);
    fp8_linear_->run_bf16(xp, K, w.w.data<uint8_t>(), w.scale_inv.data<float>(), M, N, K, op,
                          gemm_bytes ? work.raw() : nullptr, stream_);
    return;
  }
  auto [rows, work] = alloc_fp8_rows(M, K);
  quantize_fp8_act(xp, M, K, K, rows.q, rows.scale, rows.scale_ld, stream_);
  linear_fp8_rows(rows, w, out);
}

std::pair<CudaBackend::Fp8Rows, Tensor> CudaBackend::alloc_fp8_rows(int64_t rows, int64_t width) {
  Fp8Rows r;
  r.rows = rows;
  r.width = width;
  r.scale_ld = fp8_act_scale_ld(rows);
  const size_t q_bytes = round_up_256(size_t(r.scale_ld * width));
  Tensor work = alloc({int64_t(q_bytes + size_t(r.scale_ld * (width / kFp8Group)) * 4)}, DType::U8);
  r.q = static_cast<uint8_t*>(work.raw());
  r.scale = reinterpret_cast<float*>(r.q + q_bytes);
  return {r, work};
}

void CudaBackend::zero_padding_rows(const Fp8Rows& r, const char* op) {
  if (r.scale_ld == r.rows) return;
  const int64_t pad = r.scale_ld - r.rows;
  MLA_CUDA_CHECK(cudaMemsetAsync(r.q + r.rows * r.width, 0, size_t(pad * r.width), stream_), op);
  MLA_CUDA_CHECK(cudaMemset2DAsync(r.scale + r.rows, size_t(r.scale_ld) * 4, 0, size_t(pad) * 4,
                                   size_t(r.width / kFp8Group), stream_),
                 op);
}

bool CudaBackend::takes_fp8_rows(const std::vector<LinearTarget>& targets, int64_t m, int64_t k) const {
  if (m == 0 || k % kFp8Group != 0 || targets.empty()) return false;
  for (const LinearTarget& t : targets)
    if (!t.w->is_fp8() || t.w->in_features() != k || fp8_linear_->takes_bf16_rows(m, t.w->out_features(), k))
      return false;
  return true;
}

void CudaBackend::linear_fp8_rows(const Fp8Rows& x, const Weight& w, Tensor out) {
  const int64_t M = x.rows, N = w.out_features(), K = w.in_features();
  MLA_CHECK(x.width == K && out.dim(-1) == N && row_count(out) == M, "linear: {} x {} quantized rows · W{}ᵀ into {}",
            M, x.width, shape_str(w.w.shape()), shape_str(out.shape()));
  const size_t gemm_bytes = Fp8Linear::workspace_bytes(M, N, K);
  Tensor work = gemm_bytes ? alloc({int64_t(gemm_bytes)}, DType::U8) : Tensor();
  fp8_linear_->run(x.q, x.scale, x.scale_ld, w.w.data<uint8_t>(), w.scale_inv.data<float>(), M, N, K,
                   bf(out, "linear", "out"), gemm_bytes ? work.raw() : nullptr, stream_);
}

void CudaBackend::rms_norm_linears(const Tensor& x, const Tensor& norm_w, float eps, Tensor residual,
                                   const std::vector<LinearTarget>& targets) {
  const int64_t M = row_count(x), K = x.dim(-1);
  if (!takes_fp8_rows(targets, M, K)) {
    Backend::rms_norm_linears(x, norm_w, eps, residual, targets);
    return;
  }
  MLA_CHECK(norm_w.numel() == K && (!residual.defined() || residual.numel() == x.numel()),
            "rms_norm_linears: x {}, norm weight {}", shape_str(x.shape()), shape_str(norm_w.shape()));
  for (const LinearTarget& t : targets) {
    check_fp8_weight(*t.w);
    MLA_CHECK(row_count(t.out) == M, "rms_norm_linears: {} rows into out {}", M, shape_str(t.out.shape()));
  }
  auto [rows, work] = alloc_fp8_rows(M, K);
  rms_norm_quantize_fp8(bf(x, "rms_norm_linears", "x"), as_bf16(norm_w, "rms_norm_linears"), eps, M, K,
                        rows.q, rows.scale, rows.scale_ld,
                        residual.defined() ? bf(residual, "rms_norm_linears", "residual") : nullptr, stream_);
  for (const LinearTarget& t : targets) linear_fp8_rows(rows, *t.w, t.out);
}

void CudaBackend::silu_and_mul_linear(const Tensor& gate_up, const Weight& w, Tensor out) {
  const int64_t M = row_count(gate_up), I = gate_up.dim(-1) / 2;
  if (gate_up.dim(-1) % 2 != 0 || !takes_fp8_rows({LinearTarget{&w, out}}, M, I)) {
    Backend::silu_and_mul_linear(gate_up, w, out);
    return;
  }
  check_fp8_weight(w);
  auto [rows, work] = alloc_fp8_rows(M, I);
  const __nv_bfloat16* gu = bf(gate_up, "silu_and_mul_linear", "gate_up");
  silu_and_mul_quantize_fp8(gu, gu + I, 2 * I, M, I, rows.q, rows.scale, rows.scale_ld, stream_);
  linear_fp8_rows(rows, w, out);
}

void CudaBackend::linear_f32_out(const Tensor& x, const Weight& w, Tensor out) {
  const int64_t K = w.in_features(), N = w.out_features();
  MLA_CHECK(x.dim(-1) == K && out.dim(-1) == N && row_count(x) == row_count(out),
            "linear_f32_out: x {} · W{}ᵀ does not fit out {}", shape_str(x.shape()), shape_str(w.w.shape()),
            shape_str(out.shape()));
  check_dev(out, DType::F32, "linear_f32_out", "out");
  // Only the router and lm_head want f32 logits, and DeepSeek checkpoints keep both in bf16.
  MLA_CHECK(!w.is_fp8(), "linear_f32_out: FP8 weight {} is not supported (f32 outputs take bf16 weights)",
            shape_str(w.w.shape()));
  matmul(bf(x, "linear_f32_out", "x"), bf(w.w, "linear_f32_out", "weight"), row_count(x), N, K, out.raw(), true);
}

void CudaBackend::rope(Tensor x, int offset, const Tensor& positions, const Tensor& inv_freq, float cos_sin_scale) {
  const int64_t T = x.dim(0), W = x.dim(-1), F = inv_freq.numel();
  const int64_t heads = T ? x.numel() / T / W : 0;
  MLA_CHECK(positions.numel() == T, "rope: x {} with {} positions", shape_str(x.shape()), positions.numel());
  check_dev(inv_freq, DType::F32, "rope", "inv_freq");
  rope_inplace(bf(x, "rope", "x"), T, heads, W, offset, i32(positions, "rope", "positions"), inv_freq.data<float>(),
               int(F), cos_sin_scale, stream_);
}

void CudaBackend::silu_and_mul(const Tensor& gate, const Tensor& up, Tensor out) {
  MLA_CHECK(gate.shape() == up.shape() && up.numel() == out.numel(), "silu_and_mul: gate {}, up {}, out {}",
            shape_str(gate.shape()), shape_str(up.shape()), shape_str(out.shape()));
  const int64_t I = gate.dim(-1);
  cuda::silu_and_mul(bf(gate, "silu_and_mul", "gate"), bf(up, "silu_and_mul", "up"), I, row_count(gate), I,
                     bf(out, "silu_and_mul", "out"), stream_);
}

void CudaBackend::silu_and_mul_gate_up(const Tensor& gate_up, Tensor out) {
  const int64_t I = out.dim(-1);
  MLA_CHECK(gate_up.dim(-1) == 2 * I && row_count(gate_up) == row_count(out),
            "silu_and_mul_gate_up: gate_up {} for out {}", shape_str(gate_up.shape()), shape_str(out.shape()));
  const __nv_bfloat16* gu = bf(gate_up, "silu_and_mul_gate_up", "gate_up");
  cuda::silu_and_mul(gu, gu + I, 2 * I, row_count(out), I, bf(out, "silu_and_mul_gate_up", "out"), stream_);
}

void CudaBackend::add(Tensor y, const Tensor& x) {
  MLA_CHECK(x.numel() == y.numel(), "add: {} vs {}", shape_str(y.shape()), shape_str(x.shape()));
  add_inplace(bf(y, "add", "y"), bf(x, "add", "x"), y.numel(), stream_);
}

void CudaBackend::copy_columns(const Tensor& src, int64_t src_col, Tensor dst, int64_t dst_col, int64_t n) {
  MLA_CHECK(src.dtype() == dst.dtype() && src.device() == Device::CUDA && dst.device() == Device::CUDA,
            "copy_columns: {} to {} (both CUDA, same dtype)", dtype_name(src.dtype()), dtype_name(dst.dtype()));
  MLA_CHECK(row_count(src) == row_count(dst) && src_col >= 0 && dst_col >= 0, "copy_columns: {} into {}",
            shape_str(src.shape()), shape_str(dst.shape()));
  cuda::copy_columns(src.raw(), src.dim(-1), src_col, dst.raw(), dst.dim(-1), dst_col, n, row_count(src),
                     int64_t(dtype_size(src.dtype())), stream_);
}

void CudaBackend::scatter_rows(Tensor cache, const Tensor& rows, const Tensor& slots) {
  if (cache.dtype() == DType::U8) {  // FP8 cache: quantize the bf16 rows into their slots
    check_dev(cache, DType::U8, "scatter_rows", "cache");
    MLA_CHECK(cache.ndim() == 2 && row_count(rows) == slots.numel(), "scatter_rows: rows {} into cache {} at {} slots",
              shape_str(rows.shape()), shape_str(cache.shape()), slots.numel());
    cuda::fp8_kv_store(fp8_kv_layout_for(rows.dim(-1), cache.dim(1)), bf(rows, "scatter_rows", "rows"),
                       i32(slots, "scatter_rows", "slots"), slots.numel(), cache.data<uint8_t>(), stream_);
    return;
  }
  const int64_t W = cache.dim(-1);
  MLA_CHECK(rows.dtype() == cache.dtype() && rows.dim(-1) == W && row_count(rows) == slots.numel(),
            "scatter_rows: rows {} into cache {} at {} slots", shape_str(rows.shape()), shape_str(cache.shape()),
            slots.numel());
  cuda::scatter_rows(cache.raw(), rows.raw(), i32(slots, "scatter_rows", "slots"), slots.numel(),
                     W * int64_t(dtype_size(cache.dtype())), stream_);
}

void CudaBackend::gather_rows(const Tensor& cache, const Tensor& slots, Tensor out) {
  if (cache.dtype() == DType::U8) {  // FP8 cache: dequantize the slots to bf16 rows
    check_dev(cache, DType::U8, "gather_rows", "cache");
    MLA_CHECK(cache.ndim() == 2 && row_count(out) == slots.numel(), "gather_rows: {} slots of {} into {}",
              slots.numel(), shape_str(cache.shape()), shape_str(out.shape()));
    cuda::fp8_kv_load(fp8_kv_layout_for(out.dim(-1), cache.dim(1)), cache.data<uint8_t>(),
                      i32(slots, "gather_rows", "slots"), slots.numel(), bf(out, "gather_rows", "out"), stream_);
    return;
  }
  const int64_t W = cache.dim(-1);
  MLA_CHECK(out.dtype() == cache.dtype() && out.dim(-1) == W && row_count(out) == slots.numel(),
            "gather_rows: {} slots of {} into {}", slots.numel(), shape_str(cache.shape()), shape_str(out.shape()));
  cuda::gather_rows(out.raw(), cache.raw(), i32(slots, "gather_rows", "slots"), slots.numel(),
                    W * int64_t(dtype_size(cache.dtype())), stream_);
}

void CudaBackend::check_head_bmm(const Tensor& x, const Weight& weight, bool transpose_w, const Tensor& out) const {
  const Tensor& w = weight.w;
  const int64_t T = x.dim(0), H = x.dim(1), Kx = x.dim(2);
  const int64_t K = transpose_w ? w.dim(2) : w.dim(1), N = transpose_w ? w.dim(1) : w.dim(2);
  MLA_CHECK(w.ndim() == 3 && w.dim(0) == H && K <= Kx && out.ndim() == 3 && out.dim(0) == T && out.dim(1) == H &&
                out.dim(2) >= N,
            "head_bmm: x {} · w {} (transposed: {}) into {}", shape_str(x.shape()), shape_str(w.shape()),
            transpose_w, shape_str(out.shape()));
}

void CudaBackend::head_bmm(const Tensor& x, const Weight& weight, bool transpose_w, Tensor out) {
  const Tensor& w = weight.w;
  const int64_t T = x.dim(0), H = x.dim(1), Kx = x.dim(2);
  const int64_t K = transpose_w ? w.dim(2) : w.dim(1), N = transpose_w ? w.dim(1) : w.dim(2);
  check_head_bmm(x, weight, transpose_w, out);
  if (weight.is_fp8()) {
    MLA_CHECK(transpose_w, "head_bmm: FP8 w {} must be {{H, N, K}} (transpose_w)", shape_str(w.shape()));
    return head_bmm_fp8(x, weight, out);
  }
  const __nv_bfloat16* wb = as_bf16(w, "head_bmm");
  if (head_bmm_small_applies(wb, transpose_w, T, K, N)) {  // decode: stream the weights with many blocks
    head_bmm_small(bf(x, "head_bmm", "x"), wb, transpose_w, T, H, Kx, K, N, bf(out, "head_bmm", "out"), out.dim(2),
                   stream_);
    return;
  }
  gemm_->head_bmm(bf(x, "head_bmm", "x"), wb, transpose_w, T, H, Kx, K, N, bf(out, "head_bmm", "out"), out.dim(2),
                  stream_);
}

// Block-FP8 W_UK (transposed) / W_UV, {H, N, K}: head_bmm_fp8.h.
void CudaBackend::check_head_bmm_fp8(const Tensor& x, const Weight& w) const {
  const int64_t H = x.dim(1), N = w.w.dim(1), K = w.w.dim(2);
  MLA_CHECK(w.w.device() == Device::CUDA && w.scale_inv.dtype() == DType::F32 &&
                w.scale_inv.shape() == Shape({(H * N + 127) / 128, (K + 127) / 128}) && head_bmm_fp8_applies(K, N),
            "head_bmm: FP8 w {} needs F32 scales [{}, {}], N and K multiples of 128", shape_str(w.w.shape()),
            (H * N + 127) / 128, (K + 127) / 128);
}

void CudaBackend::head_bmm_fp8(const Tensor& x, const Weight& w, Tensor out, const HeadBmmFp8Rope* rope) {
  const int64_t T = x.dim(0), H = x.dim(1), Kx = x.dim(2), N = w.w.dim(1), K = w.w.dim(2);
  check_head_bmm_fp8(x, w);
  cuda::head_bmm_fp8(bf(x, "head_bmm", "x"), w.w.data<uint8_t>(), w.scale_inv.data<float>(), T, H, Kx, K, N,
                     bf(out, "head_bmm", "out"), out.dim(2), stream_,
                     rope ? HeadBmmFp8Path::Stream : HeadBmmFp8Path::Auto, rope);
}

void CudaBackend::mla_prepare_head_bmm(const MlaPrepare& mp, const Tensor& positions, const Tensor& out_slots,
                                       const Tensor& inv_freq, float cos_sin_scale, const Tensor& x, const Weight& w,
                                       bool transpose_w, Tensor out) {
  const MlaPrepareParams p = prepare_params(mp, positions, out_slots, inv_freq, cos_sin_scale, false);
  // Only a q split with q_nope read in place rides in the product's launch,
  // and only on the streaming FP8 kernel: one kernel boundary less a decode
  // layer (the q split alone cost ~4.5 us of a bs-1 step's critical path,
  // perf.md session 36).
  const bool q_split_only = p.q_pe_out && !p.q_nope_out && !p.cache && !p.fp8_cache && !p.q_a;
  if (!q_split_only || !w.is_fp8() || !transpose_w || p.num_heads != x.dim(1) ||
      !head_bmm_fp8_streams(x.dim(0), w.w.dim(2))) {
    Backend::mla_prepare_head_bmm(mp, positions, out_slots, inv_freq, cos_sin_scale, x, w, transpose_w, out);
    return;
  }
  check_head_bmm(x, w, transpose_w, out);
  const HeadBmmFp8Rope rope{.q = p.q,
                            .q_stride = p.q_stride,
                            .nope_dim = p.nope_dim,
                            .num_freqs = p.num_freqs,
                            .positions = p.positions,
                            .inv_freq = p.inv_freq,
                            .cos_sin_scale = p.cos_sin_scale,
                            .out = p.q_pe_out,
                            .out_width = p.q_pe_width};
  head_bmm_fp8(x, w, out, &rope);
}

void CudaBackend::head_bmm_linear(const Tensor& x, const Weight& w, bool transpose_w, const Weight& proj,
                                  Tensor out) {
  const int64_t T = x.dim(0), H = x.dim(1), Kx = x.dim(2);
  // A head's N = 128 outputs are one 1x128 group of proj's input; decode rows
  // (which the GEMM quantizes itself) keep the ops in turn.
  if (!w.is_fp8() || !transpose_w || w.w.ndim() != 3 || w.w.dim(0) != H || w.w.dim(1) != kFp8Group ||
      w.w.dim(2) > Kx || !takes_fp8_rows({LinearTarget{&proj, out}}, T, H * kFp8Group)) {
    Backend::head_bmm_linear(x, w, transpose_w, proj, out);
    return;
  }
  check_head_bmm_fp8(x, w);
  check_fp8_weight(proj);
  auto [rows, work] = alloc_fp8_rows(T, H * kFp8Group);
  zero_padding_rows(rows, "head_bmm_linear");
  cuda::head_bmm_fp8_quantized(bf(x, "head_bmm_linear", "x"), w.w.data<uint8_t>(), w.scale_inv.data<float>(), T, H,
                               Kx, w.w.dim(2), kFp8Group, rows.q, rows.scale, rows.scale_ld, stream_);
  linear_fp8_rows(rows, proj, out);
}

void CudaBackend::mla_prepare(const MlaPrepare& mp, const Tensor& positions, const Tensor& out_slots,
                              const Tensor& inv_freq, float cos_sin_scale) {
  cuda::mla_prepare(prepare_params(mp, positions, out_slots, inv_freq, cos_sin_scale, false), stream_);
}

void CudaBackend::mla_prepare_q_b(const MlaPrepare& mp, const Tensor& positions, const Tensor& out_slots,
                                  const Tensor& inv_freq, float cos_sin_scale, const Weight& q_b, Tensor q) {
  prepare_q_b(mp, positions, out_slots, inv_freq, cos_sin_scale, q_b, q, ProjectionPartials{});
}

void CudaBackend::rms_norm_linear_mla_prepare_q_b(const ResidualNorm& in, const Weight& w, const MlaPrepare& mp,
                                                  const Tensor& positions, const Tensor& out_slots,
                                                  const Tensor& inv_freq, float cos_sin_scale, const Weight& q_b,
                                                  Tensor q) {
  const int64_t T = row_count(in.x), K = in.x.dim(-1), N = w.out_features();
  // Decode rows, which the projection quantizes itself: where it splits K
  // into f32 partials, the prepare adds them (one kernel boundary less a
  // layer). Elsewhere the ops in turn.
  if (T == 0 || !w.is_fp8() || w.in_features() != K || !fp8_linear_->takes_bf16_rows(T, N, K) ||
      mp.q_a.defined() || mp.kv.defined()) {
    Backend::rms_norm_linear_mla_prepare_q_b(in, w, mp, positions, out_slots, inv_freq, cos_sin_scale, q_b, q);
    return;
  }
  check_fp8_weight(w);
  MlaPrepare with = mp;
  with.q_a = with.kv = alloc({T, N}, act_dtype());
  MLA_CHECK(in.norm_weight.numel() == K && (!in.residual.defined() || in.residual.numel() == in.x.numel()),
            "rms_norm_linear_mla_prepare_q_b: x {}, norm weight {}", shape_str(in.x.shape()),
            shape_str(in.norm_weight.shape()));
  // One row: the norm is formed inside the projection's launch.
  if (T == 1) {
    SkinnyRmsNorm norm;
    norm.x = bf(in.x, "rms_norm_linear_mla_prepare_q_b", "x");
    norm.residual = in.residual.defined() ? bf(in.residual, "rms_norm_linear_mla_prepare_q_b", "residual") : nullptr;
    norm.weight = as_bf16(in.norm_weight, "rms_norm_linear_mla_prepare_q_b");
    norm.eps = in.eps;
    norm.arrivals = skinny_norm_arrivals_.get<unsigned>();
    if (fp8_linear_->run_bf16_rms_norm(norm, w.w.data<uint8_t>(), w.scale_inv.data<float>(), N, K,
                                       bf(with.q_a, "rms_norm_linear_mla_prepare_q_b", "qkv"), stream_)) {
      prepare_q_b(with, positions, out_slots, inv_freq, cos_sin_scale, q_b, q, ProjectionPartials{});
      return;
    }
  }
  Tensor h = alloc(in.x.shape(), act_dtype());
  rms_norm(in.x, in.norm_weight, in.eps, h, in.residual);
  const size_t gemm_bytes = Fp8Linear::workspace_bytes(T, N, K);
  Tensor work = alloc({int64_t(gemm_bytes)}, DType::U8);
  ProjectionPartials parts;
  fp8_linear_->run_bf16(bf(h, "rms_norm_linear_mla_prepare_q_b", "h"), K, w.w.data<uint8_t>(),
                        w.scale_inv.data<float>(), T, N, K, bf(with.q_a, "rms_norm_linear_mla_prepare_q_b", "qkv"),
                        gemm_bytes ? work.raw() : nullptr, stream_, &parts.splits);
  if (parts.splits > 0) {
    parts.data = work.data<float>();
    parts.width = N;
  }
  prepare_q_b(with, positions, out_slots, inv_freq, cos_sin_scale, q_b, q, parts);
}

void CudaBackend::prepare_q_b(const MlaPrepare& mp, const Tensor& positions, const Tensor& out_slots,
                              const Tensor& inv_freq, float cos_sin_scale, const Weight& q_b, Tensor q,
                              const ProjectionPartials& parts) {
  const int64_t T = positions.numel(), Q = mp.q_a_norm.numel();
  const bool rows_for_q_b = !mp.q_a_out.defined() && takes_fp8_rows({LinearTarget{&q_b, q}}, T, Q);
  if (!rows_for_q_b && !parts.data) {
    Backend::mla_prepare_q_b(mp, positions, out_slots, inv_freq, cos_sin_scale, q_b, q);
    return;
  }
  MlaPrepare with = mp;
  if (!rows_for_q_b && !with.q_a_out.defined()) with.q_a_out = alloc({T, Q}, act_dtype());
  MlaPrepareParams p = prepare_params(with, positions, out_slots, inv_freq, cos_sin_scale, rows_for_q_b);
  if (parts.data) {
    p.partials = parts.data;
    p.splits = parts.splits;
    p.partials_width = parts.width;
    p.partials_kv_col = mp.kv_col;
  }
  if (!rows_for_q_b) {  // decode rows: q_b quantizes the bf16 rows itself
    cuda::mla_prepare(p, stream_);
    linear(with.q_a_out, q_b, q);
    return;
  }
  check_fp8_weight(q_b);
  auto [rows, work] = alloc_fp8_rows(T, Q);
  zero_padding_rows(rows, "mla_prepare_q_b");
  p.q_a_q = rows.q;
  p.q_a_scale = rows.scale;
  p.q_a_scale_ld = rows.scale_ld;
  cuda::mla_prepare(p, stream_);
  linear_fp8_rows(rows, q_b, q);
}

MlaPrepareParams CudaBackend::prepare_params(const MlaPrepare& mp, const Tensor& positions, const Tensor& out_slots,
                                             const Tensor& inv_freq, float cos_sin_scale, bool q_a_rows_elsewhere) {
  const MlaPrepareDims d = check_mla_prepare(mp, positions, out_slots, inv_freq, q_a_rows_elsewhere);
  check_dev(inv_freq, DType::F32, "mla_prepare", "inv_freq");
  MlaPrepareParams p;
  p.positions = i32(positions, "mla_prepare", "positions");
  p.inv_freq = inv_freq.data<float>();
  p.num_tokens = int(d.tokens);
  p.num_freqs = int(d.rope / 2);
  p.cos_sin_scale = cos_sin_scale;
  p.eps = mp.eps;
  if (d.latent_write) {
    p.out_slots = i32(out_slots, "mla_prepare", "out_slots");
    p.kv = bf(mp.kv, "mla_prepare", "kv") + mp.kv_col;
    p.kv_stride = mp.kv.dim(-1);
    p.kv_norm = as_bf16(mp.kv_norm, "mla_prepare");
    if (mp.cache.dtype() == DType::U8) {
      check_dev(mp.cache, DType::U8, "mla_prepare", "cache");
      p.fp8_cache = mp.cache.data<uint8_t>();
    } else {
      p.cache = bf(mp.cache, "mla_prepare", "cache");
    }
    p.latent_dim = int(d.latent);
  }
  if (d.q_a_norm) {
    p.q_a = bf(mp.q_a, "mla_prepare", "q_a") + mp.q_a_col;
    p.q_a_stride = mp.q_a.dim(-1);
    p.q_a_norm = as_bf16(mp.q_a_norm, "mla_prepare");
    if (mp.q_a_out.defined()) p.q_a_out = bf(mp.q_a_out, "mla_prepare", "q_a_out");
    p.q_a_dim = int(d.q_a);
  }
  if (d.q_split) {
    p.q = bf(mp.q, "mla_prepare", "q") + mp.q_col;
    p.q_stride = mp.q.dim(-1);
    p.q_pe_out = bf(mp.q_pe_out, "mla_prepare", "q_pe_out") + mp.q_pe_col;
    p.q_pe_width = mp.q_pe_out.dim(2);
    if (mp.q_nope_out.defined()) {
      p.q_nope_out = bf(mp.q_nope_out, "mla_prepare", "q_nope_out");
      p.q_nope_width = mp.q_nope_out.dim(2);
    }
    p.num_heads = int(d.heads);
    p.nope_dim = int(d.nope);
  }
  return p;
}

void CudaBackend::mla_attention_absorbed(const Tensor& q, const Tensor& cache, const DeviceBatch& batch, float scale,
                                         Tensor out) {
  const int64_t T = q.dim(0), H = q.dim(1), L = out.dim(2), R = q.dim(2) - L;
  const bool fp8_cache = cache.dtype() == DType::U8;  // an FP8 cache of Fp8KvLayout{L, R} slots
  const int64_t slot_width = fp8_cache ? Fp8KvLayout{int(L), int(R)}.slot_bytes() : L + R;
  MLA_CHECK(T == batch.num_tokens && cache.dim(-1) == slot_width && out.shape() == Shape({T, H, L}),
            "mla_attention_absorbed: q {}, cache {} {}, out {} for {} tokens", shape_str(q.shape()),
            dtype_name(cache.dtype()), shape_str(cache.shape()), shape_str(out.shape()), batch.num_tokens);
  MlaAbsorbedParams p;
  p.q = bf(q, "mla_attention_absorbed", "q");
  if (fp8_cache) {
    check_dev(cache, DType::U8, "mla_attention_absorbed", "cache");
    p.fp8_cache = cache.data<uint8_t>();
  } else {
    p.cache = bf(cache, "mla_attention_absorbed", "cache");
  }
  p.q_indptr = i32(batch.q_indptr, "mla_attention_absorbed", "q_indptr");
  p.kv_indptr = i32(batch.kv_indptr, "mla_attention_absorbed", "kv_indptr");
  p.kv_slots = i32(batch.kv_slots, "mla_attention_absorbed", "kv_slots");
  p.num_seqs = batch.num_seqs;
  p.num_tokens = int(T);
  p.num_heads = int(H);
  p.latent_dim = int(L);
  p.rope_dim = int(R);
  p.scale = scale;
  p.out = bf(out, "mla_attention_absorbed", "out");
  // A captured graph must not bake in this batch's lengths: it plans for the
  // longest context it will replay.
  const int kv_hint = static_batch_ ? static_batch_->max_kv_len : batch.max_kv_len;
  p.num_splits = mla_absorbed_num_splits(int(T), int(H), sm_count_, kv_hint,
                                         mla_absorbed_uses_wide_blocks(int(H), int(L), int(R)));
  Tensor work;
  if (p.num_splits > 1 && mla_absorbed_has_fast_path(int(L), int(R))) {
    const size_t bytes = mla_absorbed_workspace_bytes(int(T), int(H), int(L), p.num_splits);
    work = alloc({int64_t(bytes / 4)}, DType::F32);
    p.partial_out = work.data<float>();
    p.partial_lse = p.partial_out + size_t(p.num_splits) * T * H * L;
  }
  cuda::mla_attention_absorbed(p, stream_);
}

namespace {

// RouterParams (and the op's bias and outputs) as the router kernels take them.
MoeRouteParams route_params(const Tensor& bias, const RouterParams& rp, int64_t T, int64_t E, Tensor topk_ids,
                            Tensor topk_weights, const char* op) {
  MLA_CHECK(topk_ids.shape() == Shape({T, rp.top_k}) && topk_weights.shape() == Shape({T, rp.top_k}),
            "{}: ids {} and weights {} for {} tokens, top_k {}", op, shape_str(topk_ids.shape()),
            shape_str(topk_weights.shape()), T, rp.top_k);
  MoeRouteParams p;
  if (bias.defined()) {
    check_dev(bias, DType::F32, op, "bias");
    MLA_CHECK(bias.numel() == E, "{}: bias of {} for {} experts", op, bias.numel(), E);
    p.bias = bias.data<float>();
  }
  p.num_tokens = int(T);
  p.num_experts = int(E);
  p.method = rp.method == TopkMethod::Greedy               ? RouteMethod::Greedy
             : rp.method == TopkMethod::GroupLimitedGreedy ? RouteMethod::GroupLimitedGreedy
                                                           : RouteMethod::NoauxTc;
  p.sigmoid = rp.scoring == ScoringFunc::Sigmoid;
  p.top_k = rp.top_k;
  p.n_group = rp.n_group;
  p.topk_group = rp.topk_group;
  p.renormalize = rp.renormalize;
  p.scaling = rp.scaling;
  check_dev(topk_ids, DType::I32, op, "topk_ids");
  check_dev(topk_weights, DType::F32, op, "topk_weights");
  p.topk_ids = topk_ids.data<int32_t>();
  p.topk_weights = topk_weights.data<float>();
  return p;
}

}  // namespace

bool CudaBackend::mla_decode_chain(const MlaDecodeChain& c, const DeviceBatch& batch, Tensor out) {
  if (!mla_chain_ || batch.num_tokens != 1 || batch.num_seqs != 1) return false;
  const Weight &qkv = *c.qkv_a, &o = *c.o_proj;
  if (qkv.is_fp8() || o.is_fp8() || c.w_uk.dtype() == DType::F8_E4M3 || c.cache.dtype() != DType::BF16) return false;
  const int64_t D = c.h.dim(-1), H = c.w_uk.dim(0), Dn = c.w_uk.dim(1), L = c.w_uk.dim(2), Dv = c.w_uv.dim(1);
  const int64_t R = 2 * c.inv_freq.numel();
  MLA_CHECK(qkv.out_features() == H * (Dn + R) + L + R && qkv.in_features() == D && o.out_features() == D &&
                o.in_features() == H * Dv && c.cache.dim(-1) == L + R && c.kv_norm.numel() == L &&
                out.shape() == c.h.shape(),
            "mla_decode_chain: h {}, qkv_a {}, w_uk {}, w_uv {}, o_proj {}, cache {}, out {}", shape_str(c.h.shape()),
            shape_str(qkv.w.shape()), shape_str(c.w_uk.shape()), shape_str(c.w_uv.shape()), shape_str(o.w.shape()),
            shape_str(c.cache.shape()), shape_str(out.shape()));
  if (!mla_decode_chain_applies({int(D), int(H), int(Dn), int(R), int(L), int(Dv)}, sm_count_)) return false;
  MlaDecodeChainParams p;
  p.h = bf(c.h, "mla_decode_chain", "h");
  p.w_qkv = as_bf16(qkv.w, "mla_decode_chain");
  p.kv_norm = as_bf16(c.kv_norm, "mla_decode_chain");
  p.w_uk = as_bf16(c.w_uk, "mla_decode_chain");
  p.w_uv = as_bf16(c.w_uv, "mla_decode_chain");
  p.w_o = as_bf16(o.w, "mla_decode_chain");
  p.cache = bf(c.cache, "mla_decode_chain", "cache");
  p.positions = i32(batch.positions, "mla_decode_chain", "positions");
  p.out_slots = i32(batch.out_slots, "mla_decode_chain", "out_slots");
  p.kv_indptr = i32(batch.kv_indptr, "mla_decode_chain", "kv_indptr");
  p.kv_slots = i32(batch.kv_slots, "mla_decode_chain", "kv_slots");
  check_dev(c.inv_freq, DType::F32, "mla_decode_chain", "inv_freq");
  p.inv_freq = c.inv_freq.data<float>();
  p.cos_sin_scale = c.cos_sin_scale;
  p.eps = c.eps;
  p.softmax_scale = c.softmax_scale;
  p.out = bf(out, "mla_decode_chain", "out");
  if (c.norm_head) {
    const ResidualNorm& n = *c.norm_head;
    MLA_CHECK(n.x.shape() == c.h.shape() && (!n.residual.defined() || n.residual.shape() == c.h.shape()) &&
                  n.norm_weight.numel() == D,
              "mla_decode_chain: norm head x {}, residual {}, norm {} for h {}", shape_str(n.x.shape()),
              shape_str(n.residual.shape()), shape_str(n.norm_weight.shape()), shape_str(c.h.shape()));
    p.x = bf(n.x, "mla_decode_chain", "x");
    p.in_norm = as_bf16(n.norm_weight, "mla_decode_chain");
    p.in_eps = n.eps;
    if (n.residual.defined()) p.in_residual = bf(n.residual, "mla_decode_chain", "residual");
  }
  if (c.moe_tail) {
    const MlaChainMoeTail& t = *c.moe_tail;
    const Weight& router = *t.router;
    const int64_t E = router.out_features();
    if (router.is_fp8() || router.in_features() != D || !mla_decode_chain_routes(int(E), sm_count_)) return false;
    MLA_CHECK(t.residual.shape() == c.h.shape() && t.normed.shape() == c.h.shape() && t.norm_weight.numel() == D &&
                  t.logits.shape() == Shape({1, E}),
              "mla_decode_chain: residual {}, normed {}, norm {}, logits {} for h {} and {} experts",
              shape_str(t.residual.shape()), shape_str(t.normed.shape()), shape_str(t.norm_weight.shape()),
              shape_str(t.logits.shape()), shape_str(c.h.shape()), E);
    check_dev(t.logits, DType::F32, "mla_decode_chain", "logits");
    if (!t.router_fold.defined() || !t.pending) return false;
    MLA_CHECK(t.router_fold.shape() == Shape({E, H * Dv}),
              "mla_decode_chain: router fold {} for {} experts and attention width {}",
              shape_str(t.router_fold.shape()), E, H * Dv);
    check_dev(t.router_fold, DType::F32, "mla_decode_chain", "router_fold");
    p.router_fold = t.router_fold.data<float>();
    p.num_experts = int(E);
    p.logits = t.logits.data<float>();
    p.router = as_bf16(router.w, "mla_decode_chain");
    p.moe_norm = as_bf16(t.norm_weight, "mla_decode_chain");
    p.residual = bf(t.residual, "mla_decode_chain", "residual");
    p.norm_parts = static_cast<float*>(mla_chain_norm_parts_.get());
    *t.pending = PendingNorm{t.residual, t.norm_weight, t.eps,
                             Tensor::wrap(p.norm_parts, {int64_t(sm_count_)}, DType::F32, Device::CUDA)};
  }
  Tensor scratch = alloc({int64_t(mla_decode_chain_scratch_bytes(sm_count_))}, DType::U8);
  p.scratch = scratch.raw();
  p.sync = mla_chain_sync_.get();
  cuda::mla_decode_chain(p, sm_count_, stream_);
  return true;
}

Tensor CudaBackend::mla_chain_router_fold(const Weight& router, const Tensor& norm_weight, const Weight& o_proj) {
  const int64_t E = router.out_features(), D = router.in_features(), K = o_proj.in_features();
  if (router.is_fp8() || o_proj.is_fp8() || !mla_decode_chain_takes_fold(int(D), int(K), int(E), sm_count_))
    return {};
  MLA_CHECK(o_proj.out_features() == D && norm_weight.numel() == D,
            "mla_chain_router_fold: router {}, norm {}, o_proj {}", shape_str(router.w.shape()),
            shape_str(norm_weight.shape()), shape_str(o_proj.w.shape()));
  Tensor fold = alloc({E, K}, DType::F32);
  cuda::mla_decode_chain_router_fold(as_bf16(router.w, "mla_chain_router_fold"),
                                     as_bf16(norm_weight, "mla_chain_router_fold"),
                                     as_bf16(o_proj.w, "mla_chain_router_fold"), int(E), int(D), int(K),
                                     fold.data<float>(), stream_);
  return fold;
}

namespace {

// The kernel's parameters but its output, for q{T, H, Dn + R}, kv{Lk, H, Dn + Dv}, k_pe{Lk, R}.
MlaExpandedParams expanded_params(const Tensor& q, const Tensor& kv, const Tensor& k_pe, const DeviceBatch& batch,
                                  float scale, int64_t Dv, const char* op) {
  const int64_t T = q.dim(0), H = q.dim(1), Dn = kv.dim(2) - Dv, R = k_pe.dim(1);
  MLA_CHECK(T == batch.num_tokens && q.dim(2) == Dn + R && kv.dim(1) == H && kv.dim(0) == k_pe.dim(0),
            "{}: q {}, kv {}, k_pe {} (v width {})", op, shape_str(q.shape()), shape_str(kv.shape()),
            shape_str(k_pe.shape()), Dv);
  MlaExpandedParams p;
  p.q = bf(q, op, "q");
  p.kv = bf(kv, op, "kv");
  p.k_pe = bf(k_pe, op, "k_pe");
  p.q_indptr = i32(batch.q_indptr, op, "q_indptr");
  p.kv_indptr = i32(batch.kv_indptr, op, "kv_indptr");
  p.num_seqs = batch.num_seqs;
  p.num_tokens = int(T);
  p.num_heads = int(H);
  p.kv_rows = kv.dim(0);
  p.max_q_len = batch.max_q_len;
  p.nope_dim = int(Dn);
  p.rope_dim = int(R);
  p.v_dim = int(Dv);
  p.scale = scale;
  return p;
}

}  // namespace

void CudaBackend::mla_attention_expanded(const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                         const DeviceBatch& batch, float scale, Tensor out) {
  MLA_CHECK(out.shape() == Shape({q.dim(0), q.dim(1), out.dim(2)}), "mla_attention_expanded: q {}, out {}",
            shape_str(q.shape()), shape_str(out.shape()));
  MlaExpandedParams p = expanded_params(q, kv, k_pe, batch, scale, out.dim(2), "mla_attention_expanded");
  p.out = bf(out, "mla_attention_expanded", "out");
  cuda::mla_attention_expanded(p, stream_);
}

void CudaBackend::mla_attention_expanded_linear(const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                                const DeviceBatch& batch, float scale, const Weight& w, Tensor out) {
  const int64_t T = q.dim(0), H = q.dim(1), R = k_pe.dim(1), Dn = q.dim(2) - R, Dv = kv.dim(2) - Dn;
  // A head's output is one 1x128 group of o_proj's input.
  if (Dv != kFp8Group || !mla_expanded_has_fast_path(int(Dn), int(R), int(Dv)) ||
      !takes_fp8_rows({LinearTarget{&w, out}}, T, H * Dv)) {
    Backend::mla_attention_expanded_linear(q, kv, k_pe, batch, scale, w, out);
    return;
  }
  check_fp8_weight(w);
  const char* op = "mla_attention_expanded_linear";
  MlaExpandedParams p = expanded_params(q, kv, k_pe, batch, scale, Dv, op);
  auto [rows, work] = alloc_fp8_rows(T, H * Dv);
  zero_padding_rows(rows, op);
  p.out_q = rows.q;
  p.out_scale = rows.scale;
  p.out_scale_ld = rows.scale_ld;
  cuda::mla_attention_expanded(p, stream_);
  linear_fp8_rows(rows, w, out);
}

void CudaBackend::moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& rp, Tensor topk_ids,
                            Tensor topk_weights) {
  check_dev(logits, DType::F32, "moe_route", "logits");
  MoeRouteParams p = route_params(bias, rp, logits.dim(0), logits.dim(1), topk_ids, topk_weights, "moe_route");
  p.logits = logits.data<float>();
  cuda::moe_route(p, stream_);
}

void CudaBackend::moe_select(const Tensor& h, const Weight& router, const Tensor& bias, const RouterParams& rp,
                             Tensor topk_ids, Tensor topk_weights) {
  const int64_t T = row_count(h), E = router.out_features(), D = router.in_features();
  MLA_CHECK(h.dim(-1) == D, "moe_select: h {} for router {}", shape_str(h.shape()), shape_str(router.w.shape()));
  const bool fused = !router.is_fp8() && router.w.dtype() == DType::BF16 &&
                     moe_select_applies(bf(h, "moe_select", "h"), router.w.data<__nv_bfloat16>(), T, E, D);
  if (!fused) {  // larger batches: the skinny / cuBLASLt GEMM and the router kernel
    Backend::moe_select(h, router, bias, rp, topk_ids, topk_weights);
    return;
  }
  const MoeRouteParams p = route_params(bias, rp, T, E, topk_ids, topk_weights, "moe_select");
  cuda::moe_select(h.data<__nv_bfloat16>(), router.w.data<__nv_bfloat16>(), D, p, *moe_select_ws_, stream_);
}

void CudaBackend::rms_norm_moe_select(const ResidualNorm& in, Tensor normed, const Weight& router, const Tensor& bias,
                                      const RouterParams& rp, Tensor topk_ids, Tensor topk_weights) {
  const int64_t T = row_count(in.x), E = router.out_features(), D = router.in_features();
  MLA_CHECK(in.x.dim(-1) == D && normed.shape() == in.x.shape() && in.norm_weight.numel() == D &&
                (!in.residual.defined() || in.residual.shape() == in.x.shape()),
            "rms_norm_moe_select: x {}, residual {}, norm weight {}, normed {} for router {}", shape_str(in.x.shape()),
            shape_str(in.residual.shape()), shape_str(in.norm_weight.shape()), shape_str(normed.shape()),
            shape_str(router.w.shape()));
  MoeSelectNorm n;
  if (in.residual.defined() && !router.is_fp8() && router.w.dtype() == DType::BF16) {
    n.x = bf(in.x, "rms_norm_moe_select", "x");
    n.residual = bf(in.residual, "rms_norm_moe_select", "residual");
    n.weight = as_bf16(in.norm_weight, "rms_norm_moe_select");
    n.eps = in.eps;
    n.normed = bf(normed, "rms_norm_moe_select", "normed");
  }
  if (!n.x || !rms_norm_moe_select_applies(n, router.w.data<__nv_bfloat16>(), T, E, D)) {
    Backend::rms_norm_moe_select(in, normed, router, bias, rp, topk_ids, topk_weights);
    return;
  }
  const MoeRouteParams p = route_params(bias, rp, T, E, topk_ids, topk_weights, "rms_norm_moe_select");
  cuda::rms_norm_moe_select(n, router.w.data<__nv_bfloat16>(), D, p, *moe_select_ws_, stream_);
}

void CudaBackend::moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids,
                              const Tensor& topk_weights, Tensor out) {
  run_moe_experts(x, experts, topk_ids, topk_weights, out, nullptr);
}

namespace {

PendingNormParams pending_norm_params(const PendingNorm& n, const Tensor& x, const __nv_bfloat16* weight,
                                      const char* op) {
  MLA_CHECK(x.ndim() == 2 && x.dim(0) == 1 && n.residual.shape() == x.shape() && n.weight.numel() == x.dim(1) &&
                n.parts.ndim() == 1 && n.parts.numel() >= 1 && n.parts.numel() <= kMaxNormParts,
            "{}: a pending norm of residual {}, weight {}, {} parts for x {}", op, shape_str(n.residual.shape()),
            shape_str(n.weight.shape()), n.parts.numel(), shape_str(x.shape()));
  check_dev(n.parts, DType::F32, op, "parts");
  PendingNormParams p;
  p.parts = n.parts.data<float>();
  p.count = int(n.parts.numel());
  p.width = int(x.dim(1));
  p.eps = n.eps;
  p.row = bf(n.residual, op, "residual");
  p.weight = weight;
  return p;
}

}  // namespace

void CudaBackend::finish_pending_norm(const PendingNorm& pending, Tensor normed, Tensor logits) {
  check_dev(logits, DType::F32, "finish_pending_norm", "logits");
  MLA_CHECK(logits.ndim() == 2 && logits.dim(0) == 1, "finish_pending_norm: logits {}", shape_str(logits.shape()));
  const PendingNormParams n =
      pending_norm_params(pending, normed, as_bf16(pending.weight, "finish_pending_norm"), "finish_pending_norm");
  cuda::finish_pending_norm(n, logits.data<float>(), int(logits.dim(1)), bf(normed, "finish_pending_norm", "normed"),
                            stream_);
}

void CudaBackend::moe_route_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                                    const Tensor& bias, const RouterParams& rp, Tensor topk_ids, Tensor topk_weights,
                                    Tensor out, const PendingNorm* pending) {
  check_dev(logits, DType::F32, "moe_route_experts", "logits");
  MLA_CHECK(logits.ndim() == 2 && logits.dim(0) == x.dim(0) && logits.dim(1) == experts.num_experts(),
            "moe_route_experts: logits {} for x {} and {} routed experts", shape_str(logits.shape()),
            shape_str(x.shape()), experts.num_experts());
  MoeRouteParams route = route_params(bias, rp, logits.dim(0), logits.dim(1), topk_ids, topk_weights,
                                      "moe_route_experts");
  route.logits = logits.data<float>();
  if (pending)
    route.norm = pending_norm_params(*pending, x, as_bf16(pending->weight, "moe_route_experts"), "moe_route_experts");
  if (run_moe_experts(x, experts, topk_ids, topk_weights, out, &route)) return;
  if (pending) finish_pending_norm(*pending, x, logits);
  Backend::moe_route_experts(x, experts, logits, bias, rp, topk_ids, topk_weights, out);
}

bool CudaBackend::run_moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids,
                                  const Tensor& topk_weights, Tensor out, const MoeRouteParams* route) {
  auto* stacked = static_cast<const StackedExperts*>(experts.packed.get());
  MLA_CHECK(stacked, "moe_experts: experts were not loaded by the CUDA backend");
  const int64_t T = x.dim(0), D = x.dim(1), k = topk_ids.dim(1);
  MLA_CHECK(D == stacked->hidden && out.shape() == x.shape() && topk_ids.dim(0) == T &&
                topk_weights.shape() == topk_ids.shape(),
            "moe_experts: x {}, ids {}, weights {}, out {} (hidden {})", shape_str(x.shape()),
            shape_str(topk_ids.shape()), shape_str(topk_weights.shape()), shape_str(out.shape()), stacked->hidden);
  check_dev(topk_weights, DType::F32, "moe_experts", "topk_weights");
  MoeBatch batch;
  batch.x = bf(x, "moe_experts", "x");
  batch.topk_ids = i32(topk_ids, "moe_experts", "topk_ids");
  batch.topk_weights = topk_weights.data<float>();
  batch.num_tokens = int(T);
  batch.hidden = int(D);
  batch.inter = int(stacked->inter);
  batch.num_experts = experts.num_experts();
  batch.top_k = int(k);
  batch.num_shared = stacked->num_shared;
  batch.out = bf(out, "moe_experts", "out");
  if (route && (stacked->fp8() || T == 0)) return false;
  if (T == 0) return true;
  if (stacked->fp8()) {
    Fp8MoeParams p;
    static_cast<MoeBatch&>(p) = batch;
    p.w_gate_up = stacked->gate_up.data<uint8_t>();
    p.w_gate_up_scale = stacked->gate_up_scale.data<float>();
    p.w_down = stacked->down.data<uint8_t>();
    p.w_down_scale = stacked->down_scale.data<float>();
    Tensor work = alloc({int64_t(fp8_moe_workspace_bytes(p))}, DType::U8);
    fp8_moe_experts(p, work.raw(), stream_);
    return true;
  }
  MoeExpertsParams p;
  static_cast<MoeBatch&>(p) = batch;
  p.w_gate_up = stacked->gate_up.data<__nv_bfloat16>();
  p.w_down = stacked->down.data<__nv_bfloat16>();
  if (route) {
    if (!moe_routes_in_kernels(p)) return false;
    p.route = *route;
  }
  Tensor work = alloc({int64_t(moe_workspace_bytes(p))}, DType::U8);
  cuda::moe_experts(p, work.raw(), stream_);
  return true;
}

void CudaBackend::argmax_rows(const Tensor& logits, Tensor ids) {
  check_dev(logits, DType::F32, "argmax_rows", "logits");
  check_dev(ids, DType::I32, "argmax_rows", "ids");
  MLA_CHECK(logits.ndim() == 2 && logits.dim(1) > 0 && ids.numel() == logits.dim(0),
            "argmax_rows: {} ids for logits {}", ids.numel(), shape_str(logits.shape()));
  Tensor work = alloc({int64_t(cuda::greedy_argmax_workspace_bytes(logits.dim(0), logits.dim(1)))}, DType::U8);
  cuda::greedy_argmax(logits.data<float>(), logits.dim(0), logits.dim(1), ids.data<int32_t>(), work.raw(), stream_);
}

void CudaBackend::sample_rows(const Tensor& logits, const std::vector<RowSampling>& rows, Tensor ids) {
  check_dev(logits, DType::F32, "sample_rows", "logits");
  check_dev(ids, DType::I32, "sample_rows", "ids");
  MLA_CHECK(logits.ndim() == 2 && logits.dim(1) > 0 && ids.numel() == logits.dim(0) &&
                int64_t(rows.size()) == logits.dim(0),
            "sample_rows: {} ids and {} settings for logits {}", ids.numel(), rows.size(), shape_str(logits.shape()));
  std::vector<cuda::RowSamplingParams> host(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    host[r] = {rows[r].temperature, rows[r].top_k, rows[r].top_p, rows[r].min_p, float(rows[r].uniform)};
  const int64_t bytes = int64_t(host.size() * sizeof(cuda::RowSamplingParams));
  Tensor params = alloc({bytes}, DType::U8);
  // Pageable source: the call returns once the bytes are staged, so `host` may go.
  MLA_CUDA_CHECK(cudaMemcpyAsync(params.raw(), host.data(), size_t(bytes), cudaMemcpyHostToDevice, stream_),
                 "sample_rows");
  cuda::sample_tokens(logits.data<float>(), logits.dim(0), logits.dim(1),
                      static_cast<const cuda::RowSamplingParams*>(params.raw()), ids.data<int32_t>(), stream_);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(size_t /*workspace_bytes: see DeviceAllocator*/) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<cuda::CudaBackend>();
}

}  // namespace mlaserve
