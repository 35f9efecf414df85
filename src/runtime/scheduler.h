#pragma once
// Continuous batching over a paged KV pool. Each step mixes one decode token
// for every running request with prefill chunks of new or partly prefilled
// requests, up to --chunked-prefill-size tokens (SGLang semantics: the chunk
// budget counts the step's decode tokens too, and -1/0 means no chunking).
// Admission counts pages: the new request's chunk plus a decaying estimate of
// what running requests will still need. When decode runs out of pages the
// tree is evicted first, then the youngest requests are retracted to the
// queue (their tokens kept; their KV is recomputed, often from the cache).
//
// Not thread safe: the engine thread owns it.
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/forward_batch.h"
#include "runtime/page_allocator.h"
#include "runtime/radix_cache.h"
#include "runtime/request.h"

namespace mlaserve::runtime {

enum class SchedulePolicy { Fcfs, Lpm };
SchedulePolicy parse_schedule_policy(const std::string& name);  // "fcfs" | "lpm"

struct SchedulerConfig {
  int page_size = 1;
  int num_pages = 0;
  int max_running_requests = 256;
  int chunked_prefill_size = 8192;  // <= 0: whole prompts in one step
  int context_length = 4096;
  SchedulePolicy policy = SchedulePolicy::Fcfs;
  bool enable_radix_cache = true;
  std::vector<int32_t> eos_token_ids;
};

struct SchedulerStats {
  int running = 0;
  int waiting = 0;
  int total_pages = 0;
  int free_pages = 0;
  int cached_pages = 0;     // held by the radix tree (evictable or in use)
  int evictable_pages = 0;
  int64_t prompt_tokens = 0;      // over all finished requests
  int64_t cached_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t finished_requests = 0;
  int64_t retractions = 0;
  int last_batch_tokens = 0;
  int last_batch_seqs = 0;
};

// One step's work: the model's view (ForwardBatch) and the scheduler's.
struct ScheduledBatch {
  struct Entry {
    Request* request;
    int num_tokens;        // new tokens this step
    int logit_row = -1;    // row in the logits when this step ends the request's pending tokens
  };
  ForwardBatch forward;
  std::vector<Entry> entries;
  int num_decode = 0;
  // Where the step's tokens are picked. DeviceArgmax: every row needs only
  // its argmax (needs_only_argmax); DeviceSample: no row has penalties or
  // logprobs, so the device samples each row with device_rows (the request's
  // settings and this token's draw from its RNG); HostLogits otherwise. The
  // device paths return just the ids (ModelRunner::forward_greedy /
  // forward_sampled, then Scheduler::sample_ids).
  enum class SamplingPath { HostLogits, DeviceArgmax, DeviceSample };
  SamplingPath sampling = SamplingPath::HostLogits;
  std::vector<RowSampling> device_rows;  // DeviceSample: one per logits row
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config, TextStreamFactory text_streams = {});
  ~Scheduler();

  const SchedulerConfig& config() const { return config_; }
  int64_t capacity_tokens() const { return allocator_.capacity_tokens(); }

  // Takes a validated request (prompt fits, max_new_tokens clipped).
  void add(std::unique_ptr<Request> request);
  // Waiting: finished at once. Running: released before the next batch (a
  // batch in flight still writes its pages). Unknown ids are ignored (the
  // request may have just finished).
  void abort(uint64_t id, const std::string& message = "aborted");
  void abort_all(const std::string& message);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }

  std::optional<ScheduledBatch> next_batch();
  // The step after `started` (device-sampled, not yet sampled here), built
  // before its tokens reach the host: every running request decodes the
  // token `started` picks for it, named by a placeholder input id (-1 - its
  // logits row; ModelRunner::start_step). None when that is not the next
  // step: a waiting request could be admitted (fewer than
  // max_running_requests run), or some request is aborted, not in `started`
  // or mid-prefill, or a page is short. A request that `started` ends by length is left
  // out; one it ends by a stop token keeps a row that is dropped unsampled.
  std::optional<ScheduledBatch> continue_decode(const ScheduledBatch& started);

  // A step's sampled tokens, between sample() and postprocess().
  struct SampledStep {
    struct Item {
      Request* request;
      SampledToken token;
      FinishReason reason = FinishReason::None;  // decided without the text: EOS, stop ids, length
      bool stop_token = false;
    };
    std::vector<Item> items;
  };
  // Consumes the step's logits {logit rows, vocab} on the host: samples each
  // request's next token and ends those that finish by token or length (their
  // pages are freed at once), so next_batch() can build the following step.
  SampledStep sample(const ScheduledBatch& batch, const Tensor& logits);
  // The same from the ids the device picked (one per logits row), for a
  // batch whose sampling path is DeviceArgmax or DeviceSample.
  SampledStep sample_ids(const ScheduledBatch& batch, std::span<const int32_t> ids);
  // Detokenizes, matches stop strings and reports; meant to run while the
  // next step is already on the device (overlap). A stop string found here
  // ends its request before its next step is sampled.
  void postprocess(SampledStep& step);
  // Both, for callers that do not overlap.
  void process(const ScheduledBatch& batch, const Tensor& logits);

  bool flush_cache();  // false while requests hold cached pages
  SchedulerStats stats() const;
  // Every page is exactly one of: free, owned by the tree, owned by one
  // running request. Throws mlaserve::Error naming what broke.
  void check_invariants() const;

 private:
  std::optional<ScheduledBatch> build_batch();
  // The batch's sampling path and statistics, once its entries are in.
  void finish_building(ScheduledBatch& b);
  void release_aborted();
  bool admit(Request& r, int& budget, int reserved_pages);
  bool ensure_pages(Request& r, int tokens);
  bool make_room(int pages, const Request* keep);
  void retract(Request& r);
  void release_kv(Request& r);
  // After a prefill chunk: the computed whole pages join the radix tree at
  // once (locked by the request), so requests arriving while this one still
  // runs reuse its prefix (SGLang's cache_unfinished_req).
  void cache_prefix(Request& r);
  void finish(Request& r, FinishReason reason, RequestOutput&& out);
  int decode_reserve_pages(const Request& r) const;
  void sort_waiting();
  std::unique_ptr<Request> take_running(const Request& r);
  // The shared halves of sample() and sample_ids(): the step's entries
  // whose row is to be sampled (kv lengths advanced, prefixes cached), then
  // the bookkeeping of their tokens (one per entry, in that order).
  std::vector<const ScheduledBatch::Entry*> begin_sampling(const ScheduledBatch& b);
  SampledStep commit_sampled(const std::vector<const ScheduledBatch::Entry*>& entries,
                             std::vector<SampledToken> tokens);

  SchedulerConfig config_;
  TextStreamFactory text_streams_;
  PageAllocator allocator_;
  std::unique_ptr<RadixCache> radix_;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;  // admission order
  // Finished requests kept alive until their last token is postprocessed.
  std::vector<std::unique_ptr<Request>> retired_;
  uint64_t next_arrival_ = 0;
  // SGLang's new_token_ratio: the fraction of each running request's
  // remaining max_new_tokens that admission keeps in reserve. It decays as
  // steps succeed and jumps back up after a retraction.
  double new_token_ratio_;
  SchedulerStats totals_;
};

}  // namespace mlaserve::runtime
