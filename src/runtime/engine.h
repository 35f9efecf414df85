#pragma once
// The runtime as a library: a dedicated engine thread owns the scheduler and
// drives the model; callers submit requests from any thread and get
// streaming callbacks (on the engine thread) as tokens are produced.
//
// Overlap: a step whose rows need neither penalties nor logprobs
// (ScheduledBatch::sampling) has its tokens picked on the device, and only
// the ids come back. When every running request is decoding and no waiting
// one could be admitted, the step after it is built and started before its
// ids reach the host (Scheduler::continue_decode): its input ids name the
// picks on the device, so the GPU goes from step to step without waiting
// for the host (SGLang's overlap scheduler; --disable-overlap-schedule turns
// it off). Otherwise, when step N's tokens arrive, the engine samples them,
// builds and starts step N+1, and only then detokenizes, matches stop strings
// and reports N's tokens, while N+1 runs. A request ended by a stop token or
// string keeps a row in the step already started, which is dropped
// unsampled. New requests and aborts are taken in between steps.
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
  bool overlap_decode = true;      // start decode steps before the previous one's ids are on the host
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
  // One step: start the next (or a continuation of the started one), finish
  // the oldest started, sample it, start its successor, postprocess.
  void step(std::vector<Command>& commands);
  void take_commands(std::vector<Command>& commands);
  void apply(std::vector<Command>& commands);
  // Starts a batch on the runner (device-picked) or keeps it to run at
  // finish (host logits); a batch that fails to start fails its requests.
  void start(std::optional<ScheduledBatch> batch);
  // Finishes the oldest started batch: its tokens, sampled.
  Scheduler::SampledStep finish_oldest();
  // Finishes every started batch, dropping results and errors (shutdown,
  // bookkeeping failure).
  void drain_started();
  void fail_batch(const ScheduledBatch& batch, std::exception_ptr error);
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

  // Batches started and not finished, oldest first (engine thread only): at
  // most two, the second a continuation of the first.
  std::deque<std::unique_ptr<ScheduledBatch>> started_;

  std::thread engine_thread_;
};

}  // namespace mlaserve::runtime
