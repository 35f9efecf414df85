#include "runtime/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "fake_model.h"

using namespace mlaserve;
using namespace mlaserve::runtime;
using namespace mlaserve::runtime::testing;

namespace {

constexpr int kVocab = 101;

EngineConfig small_config(int pages = 256) {
  EngineConfig c;
  c.scheduler.num_pages = pages;
  c.scheduler.page_size = 2;
  c.scheduler.max_running_requests = 8;
  c.scheduler.chunked_prefill_size = 32;
  c.scheduler.context_length = 512;
  c.check_invariants = true;
  return c;
}

std::unique_ptr<Engine> make_engine(EngineConfig c) {
  int slots = c.scheduler.num_pages * c.scheduler.page_size;
  return std::make_unique<Engine>(std::make_unique<FakeModel>(slots, kVocab), c);
}

GenerateRequest greedy(std::vector<int32_t> prompt, int n) {
  GenerateRequest g;
  g.input_ids = std::move(prompt);
  g.params.temperature = 0;
  g.params.max_new_tokens = n;
  return g;
}

}  // namespace

TEST(Engine, OfflineBatchMatchesTheModel) {
  auto engine = make_engine(small_config());
  std::vector<GenerateRequest> batch;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 20; ++i) {
    std::vector<int32_t> p = {1, 2, 3, 4, 5, 6, 7, int32_t(i)};
    prompts.push_back(p);
    batch.push_back(greedy(p, 10 + i));
  }
  auto results = engine->generate(std::move(batch));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(results[size_t(i)].output_ids, expected_continuation(prompts[size_t(i)], 10 + i, kVocab));
    EXPECT_EQ(results[size_t(i)].final_output.finish, FinishReason::Length);
  }
  EXPECT_TRUE(engine->drain(std::chrono::seconds(5)));
  auto s = engine->stats();
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_EQ(s.free_pages + s.evictable_pages, s.total_pages);
  EXPECT_GT(s.cached_prompt_tokens, 0);
  EXPECT_TRUE(engine->flush_cache());
  EXPECT_EQ(engine->stats().free_pages, s.total_pages);
}

TEST(Engine, ConcurrentSubmittersAndAborts) {
  auto engine = make_engine(small_config(64));
  std::atomic<int> finished{0}, aborted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        std::atomic<bool> done{false};
        auto g = greedy({int32_t(t), int32_t(i), 9, 9}, i % 3 == 0 ? 400 : 8);
        g.on_output = [&](RequestOutput&& o) {
          if (!o.finished()) return;
          (o.finish == FinishReason::Abort ? aborted : finished)++;
          done = true;
        };
        uint64_t id = engine->submit(std::move(g));
        if (i % 3 == 0) engine->abort(id);
        while (!done) std::this_thread::yield();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(finished + aborted, 40);
  EXPECT_GE(aborted, 1);
  EXPECT_TRUE(engine->wait_idle(std::chrono::seconds(5)));
  auto s = engine->stats();
  EXPECT_EQ(s.free_pages + s.evictable_pages, s.total_pages);
}

namespace {

// Holds every model step until open(): nothing finishes before the test
// says so, however the threads are scheduled.
class GatedModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  Tensor forward(const ForwardBatch& b) override {
    wait();
    return FakeModel::forward(b);
  }
  void start_step(const ForwardBatch& b, const std::vector<RowSampling>* rows) override {
    wait();
    FakeModel::start_step(b, rows);
  }
  void open() {
    {
      std::lock_guard lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  void wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace

TEST(Engine, RejectsBadRequestsAndFullQueues) {
  auto c = small_config();
  c.max_queued_requests = 1;
  c.scheduler.max_running_requests = 1;
  auto model = std::make_unique<GatedModel>(c.scheduler.num_pages * c.scheduler.page_size, kVocab);
  GatedModel* gate = model.get();
  auto engine = std::make_unique<Engine>(std::move(model), c);
  EXPECT_THROW(engine->submit(greedy({}, 1)), Error);
  EXPECT_THROW(engine->submit(greedy({kVocab}, 1)), Error);
  EXPECT_THROW(engine->submit(greedy(std::vector<int32_t>(512, 1), 1)), Error);  // no room for one new token
  auto bad = greedy({1}, 1);
  bad.params.top_p = 2;
  EXPECT_THROW(engine->submit(std::move(bad)), Error);
  // Two requests fill running + queue (the model holds their steps); the
  // third is turned away.
  std::atomic<int> done{0};
  auto counting = [&](int n) {
    auto g = greedy({1, 2}, n);
    g.on_output = [&](RequestOutput&& o) { done += o.finished(); };
    return g;
  };
  uint64_t a = engine->submit(counting(500));
  uint64_t b = engine->submit(counting(500));
  EXPECT_THROW(engine->submit(counting(1)), QueueFullError);
  engine->abort(a);
  engine->abort(b);
  gate->open();
  EXPECT_TRUE(engine->drain(std::chrono::seconds(5)));
  EXPECT_EQ(done, 2);
  EXPECT_THROW(engine->submit(counting(1)), QueueFullError);  // draining
}

TEST(Engine, MaxTokensClippedToTheContext) {
  auto engine = make_engine(small_config());
  auto results = engine->generate({greedy(std::vector<int32_t>(500, 3), 100)});
  EXPECT_EQ(results[0].output_ids.size(), 12u);
  EXPECT_EQ(results[0].final_output.finish, FinishReason::Length);
}

// With overlap, decode steps start before the previous step's ids reach the
// host, naming them by placeholder: the same tokens as without (greedy,
// seeded sampling, a stop token ending a request whose next row had already
// started), and every page back at the end.
TEST(Engine, OverlappedDecodeStepsGiveTheSameTokens) {
  const std::vector<int32_t> a = {4, 8, 15}, b = {16, 23, 42, 7}, c_prompt = {3, 1, 4, 1, 5};
  const auto expected_b = expected_continuation(b, 20, kVocab);
  auto requests = [&] {
    std::vector<GenerateRequest> batch = {greedy(a, 30), greedy(b, 20)};
    batch[1].params.stop_token_ids = {expected_b[6]};
    GenerateRequest sampled = greedy(c_prompt, 25);
    sampled.params.temperature = 0.9f;
    sampled.params.top_p = 0.95f;
    sampled.params.seed = 77;
    batch.push_back(sampled);
    return batch;
  };
  std::vector<std::vector<int32_t>> outputs[2];
  for (bool overlap : {false, true}) {
    auto c = small_config();
    c.overlap_decode = overlap;
    auto model = std::make_unique<FakeModel>(c.scheduler.num_pages * c.scheduler.page_size, kVocab);
    FakeModel* fake = model.get();
    Engine engine(std::move(model), c);
    for (auto& r : engine.generate(requests())) outputs[overlap].push_back(r.output_ids);
    EXPECT_EQ(outputs[overlap][0], expected_continuation(a, 30, kVocab));
    EXPECT_EQ(outputs[overlap][1], std::vector<int32_t>(expected_b.begin(), expected_b.begin() + 7));
    EXPECT_EQ(outputs[overlap][2].size(), 25u);
    EXPECT_EQ(fake->placeholder_ids > 0, overlap);
    EXPECT_EQ(fake->overlapped_starts > 0, overlap);
    EXPECT_TRUE(engine.wait_idle(std::chrono::seconds(5)));
    auto s = engine.stats();
    EXPECT_EQ(s.free_pages + s.evictable_pages, s.total_pages);
  }
  EXPECT_EQ(outputs[1], outputs[0]);
}

TEST(Engine, GreedyStepsReturnIdsOnlyAndOtherStepsFullLogits) {
  auto c = small_config();
  auto model = std::make_unique<FakeModel>(c.scheduler.num_pages * c.scheduler.page_size, kVocab);
  FakeModel* fake = model.get();
  Engine engine(std::move(model), c);
  const std::vector<int32_t> a = {4, 8, 15}, b = {16, 23, 42, 7};
  auto greedy_only = engine.generate({greedy(a, 12), greedy(b, 9)});
  EXPECT_EQ(greedy_only[0].output_ids, expected_continuation(a, 12, kVocab));
  EXPECT_EQ(greedy_only[1].output_ids, expected_continuation(b, 9, kVocab));
  EXPECT_GT(fake->greedy_steps, 0);
  EXPECT_EQ(fake->logits_steps, 0);

  // A row that wants logprobs needs the whole row: its steps take the full
  // path, and the greedy request beside it gets the same tokens as alone.
  auto with_logprobs = greedy(b, 9);
  with_logprobs.params.logprobs = true;
  auto mixed = engine.generate({greedy(a, 12), with_logprobs});
  EXPECT_EQ(mixed[0].output_ids, expected_continuation(a, 12, kVocab));
  EXPECT_EQ(mixed[1].output_ids, expected_continuation(b, 9, kVocab));
  EXPECT_GT(fake->logits_steps, 0);
}

namespace {

// Throws on any batch holding token 13, as a model step that fails would.
class PoisonedModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  Tensor forward(const ForwardBatch& b) override {
    check(b);
    return FakeModel::forward(b);
  }
  void start_step(const ForwardBatch& b, const std::vector<RowSampling>* rows) override {
    check(b);
    FakeModel::start_step(b, rows);
  }

 private:
  static void check(const ForwardBatch& b) {
    for (int32_t id : b.input_ids)
      if (id == 13) throw Error("poisoned batch");
  }
};

}  // namespace

TEST(Engine, AFailedStepAbortsItsRequestsAndServingGoesOn) {
  auto c = small_config();
  Engine engine(std::make_unique<PoisonedModel>(c.scheduler.num_pages * c.scheduler.page_size, kVocab), c);
  auto bad = engine.generate({greedy({1, 13, 2}, 5)});
  EXPECT_EQ(bad[0].final_output.finish, FinishReason::Abort);
  EXPECT_NE(bad[0].final_output.abort_message.find("poisoned batch"), std::string::npos);
  auto good = engine.generate({greedy({1, 2, 3}, 5)});
  EXPECT_EQ(good[0].output_ids, expected_continuation({1, 2, 3}, 5, kVocab));
  EXPECT_TRUE(engine.wait_idle(std::chrono::seconds(5)));
  auto s = engine.stats();
  EXPECT_EQ(s.free_pages + s.evictable_pages, s.total_pages);
}
