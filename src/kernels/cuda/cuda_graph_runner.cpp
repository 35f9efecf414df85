#include "kernels/cuda/cuda_graph_runner.h"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace mlaserve {
namespace cuda {
namespace {

class CudaDecodeGraphRunner final : public DecodeGraphRunner {
 public:
  CudaDecodeGraphRunner(CudaBackend& backend, DecodeGraphOptions options, DecodeStepFn step)
      : backend_(backend), options_(std::move(options)), step_(std::move(step)) {
    std::sort(options_.batch_sizes.begin(), options_.batch_sizes.end());
    options_.batch_sizes.erase(std::unique(options_.batch_sizes.begin(), options_.batch_sizes.end()),
                               options_.batch_sizes.end());
    MLA_CHECK(!options_.batch_sizes.empty() && options_.batch_sizes.front() >= 1 && options_.max_kv_len >= 1,
              "cuda graphs: need batch sizes >= 1 and max_kv_len >= 1");
    // A size whose capture fails (e.g. an allocation the warm-up did not
    // make) runs eagerly instead of taking the whole process down.
    std::vector<int> captured;
    for (int bs : options_.batch_sizes) {
      try {
        capture(bs);
        captured.push_back(bs);
      } catch (const Error& e) {
        spdlog::warn("cuda graphs: batch size {} not captured, it runs eagerly: {}", bs, e.what());
      }
    }
    options_.batch_sizes = std::move(captured);
  }

  ~CudaDecodeGraphRunner() override {
    for (auto& g : graphs_) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
    }
  }

  const std::vector<int>& captured_batch_sizes() const override { return options_.batch_sizes; }

  bool can_replay(const ForwardBatch& b) const override {
    const int n = b.num_seqs();
    if (n < 1 || options_.batch_sizes.empty() || n > options_.batch_sizes.back() || !b.is_decode() ||
        int(b.logit_rows.size()) != n)
      return false;
    for (int i = 0; i < n; ++i) {
      if (b.logit_rows[i] != i) return false;
      if (b.kv_indptr[i + 1] - b.kv_indptr[i] > options_.max_kv_len) return false;
    }
    return true;
  }

  Tensor replay(const ForwardBatch& b) override {
    MLA_CHECK(can_replay(b), "cuda graphs: batch of {} sequences is not a replayable decode step", b.num_seqs());
    const int n = b.num_seqs();
    Graph& g = *std::find_if(graphs_.begin(), graphs_.end(), [&](const Graph& x) { return x.batch_size >= n; });
    const ForwardBatch padded = pad(b, g.batch_size);
    // Upload the inputs into the graph's fixed buffers (outside the graph).
    backend_.use_static_batch_buffers(&g.buffers);
    backend_.prepare_batch(padded);
    backend_.use_static_batch_buffers(nullptr);
    MLA_CUDA_CHECK(cudaGraphLaunch(g.exec, backend_.stream()), "cuda graph replay");
    return g.logits.slice_rows(0, n);
  }

 private:
  struct Graph {
    int batch_size = 0;
    CudaBackend::StaticBatchBuffers buffers;
    std::shared_ptr<DeviceAllocator::Pool> pool;
    cudaGraphExec_t exec = nullptr;
    Tensor logits;
  };

  // b plus (bs - n) one-token sequences over the scratch slot.
  ForwardBatch pad(const ForwardBatch& b, int bs) const {
    ForwardBatch p = b;
    for (int i = b.num_seqs(); i < bs; ++i) {
      p.input_ids.push_back(0);
      p.positions.push_back(0);
      p.out_slots.push_back(options_.scratch_slot);
      p.q_indptr.push_back(p.q_indptr.back() + 1);
      p.kv_slots.push_back(options_.scratch_slot);
      p.kv_indptr.push_back(p.kv_indptr.back() + 1);
      p.logit_rows.push_back(i);
    }
    return p;
  }

  void capture(int bs) {
    Graph g;
    g.batch_size = bs;
    g.buffers.max_kv_len = options_.max_kv_len;
    const int64_t n = bs;
    g.buffers.storage = backend_.alloc({6 * n + 2 + n * options_.max_kv_len}, DType::I32);
    int64_t used = 0;
    auto buffer = [&](int64_t count) {
      used += count;
      return g.buffers.storage.slice_rows(used - count, used);
    };
    g.buffers.input_ids = buffer(n);
    g.buffers.positions = buffer(n);
    g.buffers.out_slots = buffer(n);
    g.buffers.q_indptr = buffer(n + 1);
    g.buffers.kv_indptr = buffer(n + 1);
    g.buffers.logit_rows = buffer(n);
    g.buffers.kv_slots = buffer(n * options_.max_kv_len);
    g.pool = std::make_shared<DeviceAllocator::Pool>();

    ForwardBatch dummy;
    dummy.q_indptr = {0};
    dummy.kv_indptr = {0};
    const ForwardBatch warm = pad(dummy, bs);

    // Warm-up in the graph's private pool: plans, attributes, lazy weight
    // conversions and every activation block exist before capture.
    backend_.allocator().use_pool(g.pool);
    backend_.use_static_batch_buffers(&g.buffers);
    try {
      step_(warm);
      backend_.synchronize();
      g.buffers.capturing = true;
      cudaStream_t stream = backend_.stream();
      MLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cuda graph capture");
      Tensor logits;
      try {
        logits = step_(warm);
      } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream, &broken);
        if (broken) cudaGraphDestroy(broken);
        // The invalidated capture leaves its error pending; the next launch
        // check would report it as that launch's failure.
        cudaGetLastError();
        throw;
      }
      cudaGraph_t graph = nullptr;
      MLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), "cuda graph capture");
      const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
      cudaGraphDestroy(graph);
      MLA_CUDA_CHECK(inst, "cuda graph instantiate");
      g.logits = logits;
      g.buffers.capturing = false;
    } catch (...) {
      backend_.use_static_batch_buffers(nullptr);
      backend_.allocator().use_default_pool();
      throw;
    }
    backend_.use_static_batch_buffers(nullptr);
    backend_.allocator().use_default_pool();
    graphs_.push_back(std::move(g));
  }

  CudaBackend& backend_;
  DecodeGraphOptions options_;
  DecodeStepFn step_;
  std::vector<Graph> graphs_;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<DecodeGraphRunner> make_decode_graph_runner(Backend& backend, const DecodeGraphOptions& options,
                                                            DecodeStepFn step) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (!cuda_backend) return nullptr;
  return std::make_unique<cuda::CudaDecodeGraphRunner>(*cuda_backend, options, std::move(step));
}

}  // namespace mlaserve
