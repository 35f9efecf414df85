#include "runtime/engine.h"

#include <spdlog/spdlog.h>

namespace mlaserve::runtime {

Engine::Engine(std::unique_ptr<ModelRunner> runner, EngineConfig config, TextStreamFactory text_streams)
    : runner_(std::move(runner)),
      config_(std::move(config)),
      scheduler_(config_.scheduler, std::move(text_streams)) {
  capacity_tokens_ = scheduler_.capacity_tokens();
  vocab_size_ = runner_->vocab_size();
  stats_ = scheduler_.stats();
  engine_thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  engine_thread_.join();
}

uint64_t Engine::submit(GenerateRequest g) {
  g.params.validate();
  const int n = int(g.input_ids.size());
  const int context = config_.scheduler.context_length;
  MLA_CHECK(n > 0, "the prompt is empty");
  for (int32_t id : g.input_ids)
    MLA_CHECK(id >= 0 && id < vocab_size_, "token id {} is outside the vocabulary [0, {})", id, vocab_size_);
  MLA_CHECK(n < context, "the prompt has {} tokens; the context length is {} (prompt plus at least one new token)",
            n, context);
  MLA_CHECK(n + 1 <= capacity_tokens_, "the prompt has {} tokens; the KV cache holds {} tokens in all", n,
            capacity_tokens_);
  g.params.max_new_tokens = std::min(g.params.max_new_tokens, context - n);

  auto r = std::make_unique<Request>();
  r->tokens = std::move(g.input_ids);
  r->prompt_len = n;
  r->params = std::move(g.params);
  auto user_callback = std::move(g.on_output);
  r->on_output = [this, user_callback](RequestOutput&& out) {
    bool last = out.finished();
    if (user_callback) user_callback(std::move(out));
    if (last) ++finished_unpublished_;  // engine thread; counted down in publish()
  };
  std::lock_guard lk(mu_);
  if (draining_ || stopping_) throw QueueFullError("the server is shutting down");
  if (in_flight_ >= config_.max_queued_requests + config_.scheduler.max_running_requests)
    throw QueueFullError(fmt::format("the request queue is full ({} requests in flight)", in_flight_));
  r->id = next_id_++;
  uint64_t id = r->id;
  ++in_flight_;
  inbox_.push_back(Command{std::move(r)});
  cv_.notify_all();
  return id;
}

void Engine::abort(uint64_t id) {
  std::lock_guard lk(mu_);
  Command c;
  c.abort_id = id;
  inbox_.push_back(std::move(c));
  cv_.notify_all();
}

bool Engine::flush_cache() {
  std::promise<bool> done;
  auto result = done.get_future();
  {
    std::lock_guard lk(mu_);
    Command c;
    c.flush = &done;
    inbox_.push_back(std::move(c));
  }
  cv_.notify_all();
  return result.get();
}

bool Engine::drain(std::chrono::milliseconds timeout) {
  {
    std::lock_guard lk(mu_);
    draining_ = true;
  }
  return wait_idle(timeout);
}

bool Engine::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return in_flight_ == 0; });
}

SchedulerStats Engine::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

int Engine::in_flight() const {
  std::lock_guard lk(mu_);
  return in_flight_;
}

std::vector<GenerateResult> Engine::generate(std::vector<GenerateRequest> batch) {
  std::mutex m;
  std::condition_variable done_cv;
  std::vector<GenerateResult> results(batch.size());
  size_t done = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto user_callback = std::move(batch[i].on_output);
    batch[i].on_output = [&, i, user_callback](RequestOutput&& out) {
      std::lock_guard lk(m);
      GenerateResult& res = results[i];
      res.output_ids.insert(res.output_ids.end(), out.token_ids.begin(), out.token_ids.end());
      res.text += out.text;
      res.logprobs.insert(res.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      bool last = out.finished();
      if (user_callback) user_callback(RequestOutput(out));
      if (last) {
        res.final_output = std::move(out);
        ++done;
        done_cv.notify_all();
      }
    };
  }
  // Submit everything before waiting; a rejected request aborts the ones
  // already queued so nothing keeps running for a caller that is gone.
  std::vector<uint64_t> ids;
  try {
    for (auto& g : batch) ids.push_back(submit(std::move(g)));
  } catch (...) {
    for (uint64_t id : ids) abort(id);
    std::unique_lock lk(m);
    done_cv.wait(lk, [&] { return done == ids.size(); });
    throw;
  }
  std::unique_lock lk(m);
  done_cv.wait(lk, [&] { return done == batch.size(); });
  return results;
}

void Engine::apply(std::vector<Command>& commands) {
  for (auto& c : commands) {
    if (c.add) {
      scheduler_.add(std::move(c.add));
    } else if (c.flush) {
      bool flushed = !scheduler_.has_work() && scheduler_.flush_cache();
      publish();  // callers look at the pool right after
      c.flush->set_value(flushed);
    } else {
      scheduler_.abort(c.abort_id);
    }
  }
  commands.clear();
}

void Engine::publish() {
  std::lock_guard lk(mu_);
  stats_ = scheduler_.stats();
  in_flight_ -= finished_unpublished_;
  finished_unpublished_ = 0;
  cv_.notify_all();
}

void Engine::loop() {
  std::vector<Command> commands;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || scheduler_.has_work() || !started_.empty(); });
      if (stopping_) break;
      commands.swap(inbox_);
    }
    try {
      apply(commands);
      step(commands);
    } catch (const std::exception& e) {
      // A bookkeeping error must not take the process down with it: fail the
      // requests (their clients get an error), keep serving new ones.
      spdlog::error("engine: {}; aborting all requests", e.what());
      drain_started();
      scheduler_.abort_all(std::string("engine error: ") + e.what());
    }
    publish();
  }
  drain_started();
  {
    std::lock_guard lk(mu_);
    for (auto& c : inbox_)
      if (c.flush) c.flush->set_value(false);
    commands.swap(inbox_);
  }
  for (auto& c : commands)
    if (c.add) scheduler_.add(std::move(c.add));
  scheduler_.abort_all("the engine shut down");
  publish();
}

void Engine::take_commands(std::vector<Command>& commands) {
  {
    std::lock_guard lk(mu_);
    commands.swap(inbox_);
  }
  apply(commands);
}

void Engine::step(std::vector<Command>& commands) {
  if (started_.empty()) start(scheduler_.next_batch());
  if (started_.empty()) return;
  // Overlap: the step after the running one is started before its tokens
  // reach the host, its input ids naming them on the device.
  if (config_.overlap_decode && started_.size() == 1) start(scheduler_.continue_decode(*started_.front()));
  Scheduler::SampledStep sampled = finish_oldest();
  take_commands(commands);
  // Without a continuation, the next step is built from these tokens and
  // started before they are detokenized, matched and reported.
  if (started_.empty()) start(scheduler_.next_batch());
  scheduler_.postprocess(sampled);
  if (config_.check_invariants) scheduler_.check_invariants();
}

void Engine::start(std::optional<ScheduledBatch> batch) {
  if (!batch) return;
  auto owned = std::make_unique<ScheduledBatch>(std::move(*batch));
  using Path = ScheduledBatch::SamplingPath;
  if (owned->sampling != Path::HostLogits) {
    try {
      runner_->start_step(owned->forward, owned->sampling == Path::DeviceSample ? &owned->device_rows : nullptr);
    } catch (...) {
      fail_batch(*owned, std::current_exception());
      return;
    }
  }
  started_.push_back(std::move(owned));
}

Scheduler::SampledStep Engine::finish_oldest() {
  std::unique_ptr<ScheduledBatch> done = std::move(started_.front());
  started_.pop_front();
  Tensor logits;
  std::vector<int32_t> ids;
  try {
    if (done->sampling == ScheduledBatch::SamplingPath::HostLogits) {
      logits = runner_->forward(done->forward);
    } else {
      ids = runner_->finish_step();
      for (int32_t id : ids)
        MLA_CHECK(id >= 0 && id < vocab_size_, "model returned token id {} outside the vocabulary [0, {})", id,
                  vocab_size_);
    }
  } catch (...) {
    fail_batch(*done, std::current_exception());
    return {};
  }
  return done->sampling == ScheduledBatch::SamplingPath::HostLogits ? scheduler_.sample(*done, logits)
                                                                     : scheduler_.sample_ids(*done, ids);
}

void Engine::drain_started() {
  while (!started_.empty()) {
    std::unique_ptr<ScheduledBatch> done = std::move(started_.front());
    started_.pop_front();
    if (done->sampling == ScheduledBatch::SamplingPath::HostLogits) continue;  // never ran
    try {
      runner_->finish_step();
    } catch (const std::exception& e) {
      spdlog::error("engine: {} (while finishing a started step)", e.what());
    }
  }
}

void Engine::fail_batch(const ScheduledBatch& batch, std::exception_ptr error) {
  std::string what = "model step failed";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what += std::string(": ") + e.what();
  }
  spdlog::error("{}; aborting the {} requests of the batch", what, batch.entries.size());
  for (auto& e : batch.entries) scheduler_.abort(e.request->id, what);
}

}  // namespace mlaserve::runtime
