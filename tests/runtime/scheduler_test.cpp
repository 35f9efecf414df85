#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <optional>
#include <random>

#include "core/error.h"
#include "fake_model.h"

using namespace mlaserve;
using namespace mlaserve::runtime;
using namespace mlaserve::runtime::testing;

namespace {

constexpr int kVocab = 97;

struct Harness {
  Scheduler sched;
  FakeModel model;
  std::map<uint64_t, std::vector<RequestOutput>> outputs;
  uint64_t next_id = 1;

  explicit Harness(SchedulerConfig c, bool text = false)
      : sched(c, text ? TextStreamFactory([](bool) { return std::make_unique<LetterStream>(); })
                      : TextStreamFactory()),
        model(c.num_pages * c.page_size, kVocab) {}

  uint64_t add(std::vector<int32_t> prompt, SamplingParams p) {
    auto r = std::make_unique<Request>();
    r->id = next_id++;
    r->prompt_len = int(prompt.size());
    r->tokens = std::move(prompt);
    r->params = p;
    uint64_t id = r->id;
    r->on_output = [this, id](RequestOutput&& o) { outputs[id].push_back(std::move(o)); };
    sched.add(std::move(r));
    return id;
  }

  // Whether batches of greedy rows take the ids-only path, as the engine's do.
  bool greedy_ids = true;

  Scheduler::SampledStep step(const ScheduledBatch& b) {
    using Path = ScheduledBatch::SamplingPath;
    if (greedy_ids && b.sampling == Path::DeviceArgmax) return sched.sample_ids(b, model.forward_greedy(b.forward));
    if (greedy_ids && b.sampling == Path::DeviceSample)
      return sched.sample_ids(b, model.forward_sampled(b.forward, b.device_rows));
    return sched.sample(b, model.forward(b.forward));
  }

  // Runs until idle, checking every invariant after every step.
  void run() {
    for (int guard = 0; sched.has_work(); ++guard) {
      ASSERT_LT(guard, 100000) << "scheduler made no progress";
      auto b = sched.next_batch();
      if (!b) {
        // Only legal when the step finished the last request itself.
        ASSERT_FALSE(sched.has_work()) << "work left but nothing scheduled";
        break;
      }
      const auto& c = sched.config();
      if (c.chunked_prefill_size > 0) ASSERT_LE(b->forward.num_tokens(), std::max(c.chunked_prefill_size, b->num_decode));
      ASSERT_LE(int(sched.num_running()), c.max_running_requests);
      auto sampled = step(*b);
      sched.postprocess(sampled);
      sched.check_invariants();
    }
  }

  // As the engine runs: step N+1 is built (and would be on the device)
  // before step N's tokens are detokenized and reported.
  void run_overlapped() {
    std::optional<ScheduledBatch> current = sched.next_batch();
    for (int guard = 0; current; ++guard) {
      ASSERT_LT(guard, 100000) << "scheduler made no progress";
      auto sampled = step(*current);
      auto next = sched.next_batch();
      sched.postprocess(sampled);
      sched.check_invariants();
      current = std::move(next);
      if (!current && sched.has_work()) current = sched.next_batch();
    }
    ASSERT_FALSE(sched.has_work());
  }

  // As the engine runs with overlapped decode: while a device-picked step
  // runs, the step after it is started from its picks on the "device"
  // (continue_decode); without one, the next step is built from its tokens.
  // Without greedy_ids every step takes the host path, and none is continued.
  void run_continued() {
    using Path = ScheduledBatch::SamplingPath;
    std::deque<ScheduledBatch> started;
    auto start = [&](std::optional<ScheduledBatch> b) {
      if (!b) return;
      if (!greedy_ids) b->sampling = Path::HostLogits;
      if (b->sampling != Path::HostLogits)
        model.start_step(b->forward, b->sampling == Path::DeviceSample ? &b->device_rows : nullptr);
      started.push_back(std::move(*b));
    };
    for (int guard = 0; sched.has_work() || !started.empty(); ++guard) {
      ASSERT_LT(guard, 100000) << "scheduler made no progress";
      if (started.empty()) start(sched.next_batch());
      ASSERT_FALSE(started.empty()) << "work left but nothing scheduled";
      if (started.size() == 1) start(sched.continue_decode(started.front()));
      ScheduledBatch done = std::move(started.front());
      started.pop_front();
      auto sampled = done.sampling == Path::HostLogits ? sched.sample(done, model.forward(done.forward))
                                                       : sched.sample_ids(done, model.finish_step());
      if (started.empty()) start(sched.next_batch());
      sched.postprocess(sampled);
      sched.check_invariants();
    }
  }

  enum class Mode { Plain, Overlapped, Continued };
  void run(Mode mode) {
    if (mode == Mode::Plain) run();
    if (mode == Mode::Overlapped) run_overlapped();
    if (mode == Mode::Continued) run_continued();
  }

  std::vector<int32_t> tokens(uint64_t id) {
    std::vector<int32_t> t;
    for (auto& o : outputs[id]) t.insert(t.end(), o.token_ids.begin(), o.token_ids.end());
    return t;
  }
  std::string text(uint64_t id) {
    std::string s;
    for (auto& o : outputs[id]) s += o.text;
    return s;
  }
  const RequestOutput& last(uint64_t id) { return outputs.at(id).back(); }
};

SamplingParams greedy(int max_new) {
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = max_new;
  return p;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, const std::vector<int32_t>& prefix, int extra) {
  auto p = prefix;
  for (int i = 0; i < extra; ++i) p.push_back(int32_t(rng() % kVocab));
  return p;
}

}  // namespace

TEST(Scheduler, ContinuousBatchingUnderMemoryPressureGivesExactOutputs) {
  for (bool greedy_ids : {true, false}) {
  for (auto mode : {Harness::Mode::Plain, Harness::Mode::Overlapped, Harness::Mode::Continued}) {
  for (int page_size : {1, 4}) {
    for (bool radix : {true, false}) {
      SchedulerConfig c;
      c.page_size = page_size;
      c.num_pages = 128 / page_size;  // small: forces eviction and retraction
      c.max_running_requests = 8;
      c.chunked_prefill_size = 16;
      c.context_length = 1000;
      c.enable_radix_cache = radix;
      Harness h(c);
      h.greedy_ids = greedy_ids;
      std::mt19937 rng(page_size * 10 + radix);
      std::vector<int32_t> system_prompt = random_prompt(rng, {}, 24);
      std::map<uint64_t, std::vector<int32_t>> prompts;
      std::map<uint64_t, int> max_new;
      for (int i = 0; i < 24; ++i) {
        auto prompt = random_prompt(rng, i % 2 ? system_prompt : std::vector<int32_t>{}, 1 + int(rng() % 30));
        int n = 20 + int(rng() % 60);
        uint64_t id = h.add(prompt, greedy(n));
        prompts[id] = prompt;
        max_new[id] = n;
      }
      h.run(mode);
      for (auto& [id, prompt] : prompts) {
        EXPECT_EQ(h.tokens(id), expected_continuation(prompt, max_new[id], kVocab)) << "request " << id;
        EXPECT_EQ(h.last(id).finish, FinishReason::Length);
        EXPECT_EQ(h.last(id).completion_tokens, max_new[id]);
      }
      auto s = h.sched.stats();
      EXPECT_GT(s.retractions, 0) << "the pool was meant to run out (page size " << page_size << ")";
      EXPECT_EQ(s.running + s.waiting, 0);
      // Idle: every page is free or evictable cache, and flushing empties it.
      EXPECT_EQ(s.free_pages + s.evictable_pages, s.total_pages);
      EXPECT_TRUE(h.sched.flush_cache());
      EXPECT_EQ(h.sched.stats().free_pages, s.total_pages);
      if (radix) EXPECT_GT(s.cached_prompt_tokens, 0);
      EXPECT_LE(h.model.max_batch_seqs, 8);
      EXPECT_EQ(h.model.greedy_steps > 0, greedy_ids);
      EXPECT_EQ(h.model.logits_steps > 0, !greedy_ids);
      // Once the queue is empty, decode steps start from the device's picks.
      EXPECT_EQ(h.model.placeholder_ids > 0, greedy_ids && mode == Harness::Mode::Continued);
    }
  }
  }
  }
}

TEST(Scheduler, RowsWithoutPenaltiesOrLogprobsArePickedOnTheDevice) {
  SchedulerConfig c;
  c.page_size = 4;
  c.num_pages = 64;
  using Path = ScheduledBatch::SamplingPath;
  auto batch_of = [&](SamplingParams second) {
    Harness h(c);
    h.add({1, 2, 3}, greedy(4));
    h.add({4, 5}, second);
    return h.sched.next_batch()->sampling;
  };
  EXPECT_EQ(batch_of(greedy(4)), Path::DeviceArgmax);
  SamplingParams top_k_one = greedy(4);
  top_k_one.temperature = 0.7f;
  top_k_one.top_k = 1;
  EXPECT_EQ(batch_of(top_k_one), Path::DeviceArgmax);
  SamplingParams with_stops = greedy(4);
  with_stops.stop_token_ids = {7};
  with_stops.stop = {"ab"};
  EXPECT_EQ(batch_of(with_stops), Path::DeviceArgmax);

  SamplingParams sampled = greedy(4);
  sampled.temperature = 0.7f;
  sampled.top_p = 0.9f;
  EXPECT_EQ(batch_of(sampled), Path::DeviceSample);
  SamplingParams logprobs = greedy(4);
  logprobs.logprobs = true;
  EXPECT_EQ(batch_of(logprobs), Path::HostLogits);
  SamplingParams top_logprobs = sampled;
  top_logprobs.top_logprobs = 2;
  EXPECT_EQ(batch_of(top_logprobs), Path::HostLogits);
  for (auto penalty : {&SamplingParams::repetition_penalty, &SamplingParams::frequency_penalty,
                       &SamplingParams::presence_penalty}) {
    SamplingParams penalized = sampled;
    penalized.*penalty = 1.3f;
    EXPECT_EQ(batch_of(penalized), Path::HostLogits);
  }
}

TEST(Scheduler, DeviceSampledRowsCarryTheRequestSettingsAndItsSeededDraw) {
  SchedulerConfig c;
  c.page_size = 4;
  c.num_pages = 64;
  SamplingParams p = greedy(4);
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.02f;
  p.seed = 1234;
  Harness h(c);
  h.add({1, 2, 3}, greedy(4));
  h.add({4, 5}, p);
  auto b = h.sched.next_batch();
  ASSERT_TRUE(b && b->sampling == ScheduledBatch::SamplingPath::DeviceSample);
  ASSERT_EQ(b->device_rows.size(), 2u);
  EXPECT_LT(b->device_rows[0].temperature, 1e-5f);  // the greedy row stays greedy
  const RowSampling& r = b->device_rows[1];
  EXPECT_EQ(r.temperature, 0.8f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.top_p, 0.95f);
  EXPECT_EQ(r.min_p, 0.02f);
  Rng same_seed(1234);
  EXPECT_EQ(r.uniform, same_seed.uniform());
}

TEST(Scheduler, GreedyIdsMustCoverEveryRow) {
  SchedulerConfig c;
  c.page_size = 4;
  c.num_pages = 64;
  Harness h(c);
  h.add({1, 2, 3}, greedy(4));
  h.add({4, 5}, greedy(4));
  auto b = h.sched.next_batch();
  ASSERT_TRUE(b && b->sampling == ScheduledBatch::SamplingPath::DeviceArgmax);
  std::vector<int32_t> one_id = {3};
  EXPECT_THROW(h.sched.sample_ids(*b, one_id), Error);
}

TEST(Scheduler, SharedPrefixIsReportedAsCached) {
  SchedulerConfig c;
  c.page_size = 4;
  c.num_pages = 64;
  Harness h(c);
  std::mt19937 rng(1);
  auto prefix = random_prompt(rng, {}, 37);
  uint64_t a = h.add(random_prompt(rng, prefix, 3), greedy(4));
  h.run();
  uint64_t b = h.add(random_prompt(rng, prefix, 5), greedy(4));
  h.run();
  EXPECT_EQ(h.last(a).cached_tokens, 0);
  EXPECT_EQ(h.last(b).cached_tokens, 36);  // whole pages of the shared 37 tokens
}

TEST(Scheduler, ChunkedPrefillMixesWithDecode) {
  SchedulerConfig c;
  c.num_pages = 512;
  c.chunked_prefill_size = 8;
  Harness h(c);
  std::mt19937 rng(2);
  auto short_prompt = random_prompt(rng, {}, 3);
  auto long_prompt = random_prompt(rng, {}, 50);
  uint64_t a = h.add(short_prompt, greedy(20));
  auto b0 = h.sched.next_batch();
  h.sched.process(*b0, h.model.forward(b0->forward));
  uint64_t b = h.add(long_prompt, greedy(3));
  auto mixed = h.sched.next_batch();
  ASSERT_TRUE(mixed);
  EXPECT_EQ(mixed->num_decode, 1);
  EXPECT_EQ(mixed->forward.num_tokens(), 8);  // 1 decode + 7 prefill tokens
  h.sched.process(*mixed, h.model.forward(mixed->forward));
  h.run();
  EXPECT_EQ(h.tokens(a), expected_continuation(short_prompt, 20, kVocab));
  EXPECT_EQ(h.tokens(b), expected_continuation(long_prompt, 3, kVocab));
}

TEST(Scheduler, StopTokensEosAndStopStrings) {
  for (auto mode : {Harness::Mode::Plain, Harness::Mode::Overlapped, Harness::Mode::Continued}) {
  SchedulerConfig c;
  c.num_pages = 256;
  std::vector<int32_t> prompt = {5, 6, 7};
  auto expected = expected_continuation(prompt, 12, kVocab);
  c.eos_token_ids = {expected[4]};
  Harness h(c, /*text=*/true);

  uint64_t eos = h.add(prompt, greedy(12));
  auto ignore = greedy(12);
  ignore.ignore_eos = true;
  uint64_t ignored = h.add(prompt, ignore);
  auto stop_id = greedy(12);
  stop_id.ignore_eos = true;
  stop_id.stop_token_ids = {expected[2]};
  uint64_t by_id = h.add(prompt, stop_id);
  // A stop string made of the second letter of token 5 and the first of token 6.
  auto by_str_params = greedy(12);
  by_str_params.ignore_eos = true;
  std::string full;
  for (int32_t t : expected) full += LetterStream::text_of(t);
  std::string stop = full.substr(11, 2);
  by_str_params.stop = {stop};
  uint64_t by_str = h.add(prompt, by_str_params);
  h.run(mode);

  EXPECT_EQ(h.tokens(eos), std::vector<int32_t>(expected.begin(), expected.begin() + 5));
  EXPECT_EQ(h.last(eos).finish, FinishReason::Stop);
  EXPECT_EQ(h.last(eos).matched_stop_token, expected[4]);
  EXPECT_EQ(h.tokens(ignored), expected);
  EXPECT_EQ(h.text(ignored), full);
  EXPECT_EQ(h.tokens(by_id).size(), 3u);
  EXPECT_EQ(h.text(by_id), full.substr(0, 4));
  EXPECT_EQ(h.last(by_str).finish, FinishReason::Stop);
  EXPECT_EQ(h.text(by_str), full.substr(0, full.find(stop)));
  EXPECT_EQ(h.last(by_str).matched_stop_string, stop);
  if (mode == Harness::Mode::Continued) EXPECT_GT(h.model.overlapped_starts, 0);
  for (auto& [id, outs] : h.outputs) {
    int finals = 0;
    for (auto& o : outs) finals += o.finished();
    EXPECT_EQ(finals, 1) << "request " << id << " must be reported finished exactly once";
  }
  h.sched.check_invariants();
  auto st = h.sched.stats();
  EXPECT_EQ(st.free_pages + st.evictable_pages, st.total_pages);
  }
}

// continue_decode: the step after a started one names its picks (-1 - row)
// at the next positions, also while requests wait for a full running set;
// none while a waiting request could be admitted or when every request ends
// by length at the started step.
TEST(Scheduler, ContinuedStepsNameTheStartedStepsPicks) {
  SchedulerConfig c;
  c.num_pages = 64;
  c.page_size = 4;
  c.max_running_requests = 2;
  Harness h(c);
  const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5, 6, 7, 8};
  const uint64_t ida = h.add(a, greedy(6)), idb = h.add(b, greedy(6));
  auto first = h.sched.next_batch();
  ASSERT_TRUE(first);
  h.model.start_step(first->forward, nullptr);
  auto next = h.sched.continue_decode(*first);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->forward.input_ids, (std::vector<int32_t>{-1, -2}));
  EXPECT_EQ(next->forward.positions, (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(next->forward.kv_indptr, (std::vector<int32_t>{0, 4, 10}));
  EXPECT_EQ(next->num_decode, 2);
  h.model.start_step(next->forward, nullptr);
  auto sampled = h.sched.sample_ids(*first, h.model.finish_step());
  h.sched.postprocess(sampled);
  sampled = h.sched.sample_ids(*next, h.model.finish_step());
  h.sched.postprocess(sampled);
  EXPECT_EQ(h.tokens(ida), expected_continuation(a, 2, kVocab));
  EXPECT_EQ(h.tokens(idb), expected_continuation(b, 2, kVocab));
  h.sched.check_invariants();

  // A request waiting while the running set is full (two of two): the
  // decode steps go on from the device's picks.
  h.add({9, 9}, greedy(3));
  auto third = h.sched.next_batch();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->entries.size(), 2u);
  h.model.start_step(third->forward, nullptr);
  auto fourth = h.sched.continue_decode(*third);
  ASSERT_TRUE(fourth);
  h.model.start_step(fourth->forward, nullptr);
  h.sched.postprocess(sampled = h.sched.sample_ids(*third, h.model.finish_step()));
  h.sched.postprocess(sampled = h.sched.sample_ids(*fourth, h.model.finish_step()));
  EXPECT_EQ(h.tokens(ida), expected_continuation(a, 4, kVocab));
  h.sched.check_invariants();

  // With room to run it, a waiting request is admitted by a step built on
  // the host.
  SchedulerConfig roomy_config = c;
  roomy_config.max_running_requests = 3;
  Harness roomy(roomy_config);
  roomy.add(a, greedy(6));
  auto started = roomy.sched.next_batch();
  roomy.model.start_step(started->forward, nullptr);
  roomy.add(b, greedy(6));
  EXPECT_FALSE(roomy.sched.continue_decode(*started));
  roomy.sched.postprocess(sampled = roomy.sched.sample_ids(*started, roomy.model.finish_step()));

  // One new token left: the started step ends the request.
  Harness last(c);
  last.add(a, greedy(1));
  auto only = last.sched.next_batch();
  last.model.start_step(only->forward, nullptr);
  EXPECT_FALSE(last.sched.continue_decode(*only));
  last.sched.postprocess(sampled = last.sched.sample_ids(*only, last.model.finish_step()));
  EXPECT_FALSE(last.sched.has_work());
}

TEST(Scheduler, AbortFreesPagesWaitingAndRunning) {
  SchedulerConfig c;
  c.num_pages = 64;
  c.max_running_requests = 1;
  c.enable_radix_cache = false;
  Harness h(c);
  uint64_t running = h.add({1, 2, 3}, greedy(50));
  uint64_t waiting = h.add({4, 5, 6}, greedy(50));
  auto b = h.sched.next_batch();
  h.sched.process(*b, h.model.forward(b->forward));
  h.sched.abort(waiting, "client gone");
  EXPECT_EQ(h.last(waiting).finish, FinishReason::Abort);
  EXPECT_EQ(h.last(waiting).abort_message, "client gone");
  h.sched.abort(running);
  EXPECT_FALSE(h.sched.next_batch());
  EXPECT_EQ(h.last(running).finish, FinishReason::Abort);
  EXPECT_EQ(h.sched.stats().free_pages, 64);
  h.sched.check_invariants();
}

TEST(Scheduler, AbortBetweenSamplingAndReportingEndsTheRequestOnce) {
  // The engine samples step N, applies new commands (a client went away),
  // builds step N + 1 (which releases aborted requests) and only then
  // reports N's tokens: the aborted request must outlive that report and
  // end with its abort, with nothing after it.
  SchedulerConfig c;
  c.num_pages = 64;
  c.enable_radix_cache = false;
  Harness h(c);
  uint64_t gone = h.add({1, 2, 3}, greedy(50));
  uint64_t stays = h.add({4, 5, 6}, greedy(5));
  auto first = h.sched.next_batch();
  auto sampled = h.step(*first);
  h.sched.abort(gone, "client gone");
  auto next = h.sched.next_batch();
  h.sched.postprocess(sampled);
  h.sched.check_invariants();
  ASSERT_EQ(h.outputs[gone].size(), 1u);
  EXPECT_EQ(h.last(gone).finish, FinishReason::Abort);
  EXPECT_EQ(h.last(gone).abort_message, "client gone");
  while (next) {
    sampled = h.step(*next);
    next = h.sched.next_batch();
    h.sched.postprocess(sampled);
    h.sched.check_invariants();
  }
  EXPECT_EQ(h.outputs[gone].size(), 1u) << "output after the abort";
  EXPECT_EQ(h.tokens(stays).size(), 5u);
  EXPECT_EQ(h.last(stays).finish, FinishReason::Length);
  EXPECT_EQ(h.sched.stats().free_pages, 64);
}

TEST(Scheduler, LongestPrefixMatchRunsCachedRequestsFirst) {
  SchedulerConfig c;
  c.num_pages = 256;
  c.max_running_requests = 1;
  c.policy = SchedulePolicy::Lpm;
  Harness h(c);
  std::mt19937 rng(3);
  auto prefix = random_prompt(rng, {}, 20);
  h.add(random_prompt(rng, prefix, 2), greedy(1));
  h.run();
  h.add(random_prompt(rng, {}, 22), greedy(1));
  uint64_t cached = h.add(random_prompt(rng, prefix, 2), greedy(1));
  auto b = h.sched.next_batch();
  ASSERT_EQ(b->entries.size(), 1u);
  EXPECT_EQ(b->entries[0].request->id, cached);
}

TEST(Scheduler, SingleSequenceLargerThanThePoolEndsWithLength) {
  SchedulerConfig c;
  c.num_pages = 10;
  Harness h(c);
  uint64_t id = h.add({1, 2, 3, 4}, greedy(100));
  h.run();
  EXPECT_EQ(h.last(id).finish, FinishReason::Length);
  EXPECT_EQ(h.tokens(id).size(), 7u);  // 10 rows hold 4 prompt + 6 computed outputs, the 7th is sampled last
  EXPECT_EQ(h.tokens(id), expected_continuation({1, 2, 3, 4}, 7, kVocab));
}

TEST(Scheduler, RunningRequestsShareTheirPrefillWithLaterArrivals) {
  SchedulerConfig c;
  c.page_size = 4;
  c.num_pages = 128;
  c.chunked_prefill_size = 16;
  Harness h(c);
  std::mt19937 rng(4);
  auto prefix = random_prompt(rng, {}, 40);
  auto first_prompt = random_prompt(rng, prefix, 2);
  uint64_t first = h.add(first_prompt, greedy(30));
  for (int i = 0; i < 4; ++i) {  // 42 prompt tokens: three chunks of 16, 16 and 10
    auto b = h.sched.next_batch();
    h.sched.process(*b, h.model.forward(b->forward));
    h.sched.check_invariants();
  }
  ASSERT_TRUE(h.outputs[first].empty() || !h.last(first).finished());
  auto second_prompt = random_prompt(rng, prefix, 3);
  uint64_t second = h.add(second_prompt, greedy(5));
  h.run();
  EXPECT_EQ(h.last(second).cached_tokens, 40);  // ten whole pages of the shared prefix
  EXPECT_EQ(h.tokens(first), expected_continuation(first_prompt, 30, kVocab));
  EXPECT_EQ(h.tokens(second), expected_continuation(second_prompt, 5, kVocab));
}
