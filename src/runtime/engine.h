#pragma once
// The runtime as a library: a dedicated engine thread owns the scheduler and
// drives the model; callers submit requests from any thread and get
// streaming callbacks (on the engine thread) as tokens are produced.
//
// Overlap: the model step runs on its own step thread. When step N's logits
// arrive, the engine thread samples them, builds and launches step N+1, and
// only then detokenizes, matches stop strings and reports N's tokens, while
// N+1 runs (a request ended by a stop string is dropped from N+1's results).
// While a step runs the engine thread also takes in new requests and aborts.
// A step whose rows need neither penalties nor logprobs
// (ScheduledBatch::sampling) asks the model for the argmax or sampled ids
// only, so the logits stay on the device.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/model_runner.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"

namespace mlaserve::runtime {

// The engine cannot take more work now (HTTP 503 + Retry-After).
class QueueFullError : public Error {
 public:
  using Error::Error;
};

struct EngineConfig {
  SchedulerConfig scheduler;
  int max_queued_requests = 4096;  // waiting, not yet running
  bool check_invariants = false;   // after every step (tests)
};

struct GenerateRequest {
  std::vector<int32_t> input_ids;
  SamplingParams params;
  OutputCallback on_output;  // every update, the last one has finished() set
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::string text;
  std::vector<SampledToken> logprobs;
  RequestOutput final_output;  // finish reason, usage
};

class Engine {
 public:
  Engine(std::unique_ptr<ModelRunner> runner, EngineConfig config, TextStreamFactory text_streams = {});
  ~Engine();  // aborts what is left and joins the threads
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (throws mlaserve::Error naming the problem) and queues; throws
  // QueueFullError when the queue is full or the engine is draining.
  // max_new_tokens is clipped to the context length. Returns the request id.
  uint64_t submit(GenerateRequest request);
  void abort(uint64_t id);
  // Offline batch: submits all, blocks until all finish, results in order.
  std::vector<GenerateResult> generate(std::vector<GenerateRequest> batch);

  // Clears the prefix cache; false when requests are in flight.
  bool flush_cache();
  // Stops taking requests, waits up to `timeout` for in-flight ones to
  // finish; true when everything finished.
  bool drain(std::chrono::milliseconds timeout);
  // Waits up to `timeout` until every submitted request has finished and
  // the stats show it (without refusing new ones); true when idle.
  bool wait_idle(std::chrono::milliseconds timeout);

  SchedulerStats stats() const;
  // Submitted requests whose final output has not been delivered yet.
  int in_flight() const;
  int64_t capacity_tokens() const { return capacity_tokens_; }
  const EngineConfig& config() const { return config_; }
  int vocab_size() const { return vocab_size_; }

 private:
  struct Command {
    std::unique_ptr<Request> add;
    uint64_t abort_id = 0;
    std::promise<bool>* flush = nullptr;
  };
  void loop();
  void apply(std::vector<Command>& commands);
  // Hands a batch to the step thread (nothing when there is none).
  std::unique_ptr<ScheduledBatch> launch(std::optional<ScheduledBatch> batch);
  // Until the launched step is done, taking in commands meanwhile; its error.
  std::exception_ptr wait_for_step(std::vector<Command>& commands);
  void fail_batch(const ScheduledBatch& batch, std::exception_ptr error);
  void step_thread();
  // Makes the scheduler's state visible to other threads: stats, and the
  // in-flight count drain() waits on (only once the stats show them done).
  void publish();

  std::unique_ptr<ModelRunner> runner_;
  EngineConfig config_;
  int64_t capacity_tokens_ = 0;
  int vocab_size_ = 0;
  Scheduler scheduler_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Command> inbox_;
  bool stopping_ = false;
  bool draining_ = false;
  uint64_t next_id_ = 1;
  int in_flight_ = 0;  // submitted, final output not yet delivered
  SchedulerStats stats_;
  int finished_unpublished_ = 0;  // engine thread only

  // The step thread runs one forward at a time for the engine thread
  // (guarded by mu_, signalled through cv_).
  const ScheduledBatch* step_batch_ = nullptr;
  Tensor step_logits_;             // the step's logits rows, or
  std::vector<int32_t> step_ids_;  // the ids the device picked (ScheduledBatch::sampling)
  std::exception_ptr step_error_;
  bool step_done_ = false;

  std::thread step_thread_;
  std::thread engine_thread_;
};

}  // namespace mlaserve::runtime
