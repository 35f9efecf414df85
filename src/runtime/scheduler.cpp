#include "runtime/scheduler.h"

#include <algorithm>
#include <climits>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"

namespace mlaserve::runtime {

namespace {

// SGLang's defaults for the admission reserve (see new_token_ratio_).
constexpr double kInitNewTokenRatio = 0.7;
constexpr double kMinNewTokenRatio = 0.1;
constexpr double kNewTokenRatioDecay = (kInitNewTokenRatio - kMinNewTokenRatio) / 600.0;
// Longest-prefix-match ordering costs a tree walk per waiting request; past
// this queue length it falls back to FCFS, as SGLang does.
constexpr size_t kLpmMaxQueue = 128;

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::None: break;
  }
  return "";
}

SchedulePolicy parse_schedule_policy(const std::string& name) {
  if (name == "fcfs") return SchedulePolicy::Fcfs;
  if (name == "lpm") return SchedulePolicy::Lpm;
  fail("unknown schedule policy '{}' (fcfs, lpm)", name);
}

Scheduler::Scheduler(SchedulerConfig config, TextStreamFactory text_streams)
    : config_(std::move(config)),
      text_streams_(std::move(text_streams)),
      allocator_(config_.num_pages, config_.page_size),
      new_token_ratio_(kInitNewTokenRatio) {
  MLA_CHECK(config_.max_running_requests >= 1, "--max-running-requests must be >= 1");
  MLA_CHECK(config_.context_length >= 2, "--context-length must be >= 2");
  if (config_.enable_radix_cache) radix_ = std::make_unique<RadixCache>(allocator_);
}

Scheduler::~Scheduler() = default;

void Scheduler::add(std::unique_ptr<Request> r) {
  MLA_CHECK(r->prompt_len >= 1 && r->prompt_len == int(r->tokens.size()), "request {} has an empty prompt", r->id);
  r->arrival = next_arrival_++;
  if (!r->detokenizer && text_streams_) r->detokenizer = text_streams_(r->params.skip_special_tokens);
  r->stop_matcher.emplace(r->params.stop);
  if (r->params.repetition_penalty != 1.0f) r->history.add_prompt(r->tokens);
  r->rng.emplace(r->params.seed ? *r->params.seed : std::random_device{}());
  if (r->params.max_new_tokens == 0) {
    finish(*r, FinishReason::Length, RequestOutput{});
    return;
  }
  waiting_.push_back(std::move(r));
}

void Scheduler::abort(uint64_t id, const std::string& message) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == id) {
      auto r = std::move(*it);
      waiting_.erase(it);
      r->abort_message = message;
      if (!r->final_reported) finish(*r, FinishReason::Abort, RequestOutput{});
      return;
    }
  }
  for (auto& r : running_) {
    if (r->id == id) {
      r->aborted = true;
      r->abort_message = message;
    }
  }
}

void Scheduler::abort_all(const std::string& message) {
  while (!waiting_.empty()) abort(waiting_.front()->id, message);
  for (auto& r : running_) {
    r->aborted = true;
    r->abort_message = message;
  }
  release_aborted();
}

void Scheduler::release_aborted() {
  for (size_t i = 0; i < running_.size();) {
    if (!running_[i]->aborted) {
      ++i;
      continue;
    }
    auto r = std::move(running_[i]);
    running_.erase(running_.begin() + long(i));
    release_kv(*r);
    if (!r->final_reported) finish(*r, FinishReason::Abort, RequestOutput{});
    if (r->awaiting_postprocess) {
      // Aborted after its token was sampled, before that token was reported
      // (the engine builds the next step in between): the pending postprocess
      // still names it, so it stays alive until the next step's sampling, and
      // its abort was its final output.
      r->final_reported = true;
      retired_.push_back(std::move(r));
    }
  }
  // Retracted, then ended by a stop string while its token was postprocessed.
  std::erase_if(waiting_, [](const std::unique_ptr<Request>& r) { return r->aborted && r->final_reported; });
}

std::unique_ptr<Request> Scheduler::take_running(const Request& r) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](auto& p) { return p.get() == &r; });
  MLA_CHECK(it != running_.end(), "request {} is not running", r.id);
  auto owned = std::move(*it);
  running_.erase(it);
  return owned;
}

void Scheduler::release_kv(Request& r) {
  const int ps = config_.page_size;
  if (radix_) {
    // Computed whole pages go to the tree; where it already had them, the
    // request's duplicates are freed (its locked prefix pages are the tree's own).
    int full = std::min(r.kv_len / ps, int(r.pages.size()));
    int existed_pages = 0;
    if (full > 0)
      existed_pages = radix_->insert(std::span(r.tokens).first(size_t(full) * ps), std::span(r.pages).first(full)) / ps;
    MLA_CHECK(existed_pages >= r.locked_pages, "request {}: its cached prefix vanished from the radix tree", r.id);
    allocator_.free(std::span(r.pages).subspan(r.locked_pages, existed_pages - r.locked_pages));
    allocator_.free(std::span(r.pages).subspan(full));
    if (r.locked_node) radix_->unlock(r.locked_node);
  } else {
    allocator_.free(r.pages);
  }
  r.pages.clear();
  r.kv_len = 0;
  r.locked_node = nullptr;
  r.locked_pages = 0;
}

void Scheduler::cache_prefix(Request& r) {
  if (!radix_) return;
  const int ps = config_.page_size;
  const int full = std::min(r.kv_len / ps, int(r.pages.size()));
  if (full <= r.locked_pages) return;
  auto tokens = std::span(r.tokens).first(size_t(full) * ps);
  const int existed_pages = radix_->insert(tokens, std::span(r.pages).first(full)) / ps;
  MLA_CHECK(existed_pages >= r.locked_pages, "request {}: its cached prefix vanished from the radix tree", r.id);
  // Where the tree already had these tokens (another request computed them
  // meanwhile), its pages win and ours are freed.
  allocator_.free(std::span(r.pages).subspan(r.locked_pages, existed_pages - r.locked_pages));
  auto m = radix_->match_prefix(tokens);
  MLA_CHECK(int(m.pages.size()) == full, "request {}: radix tree holds {} of {} just-inserted pages", r.id,
            m.pages.size(), full);
  std::copy(m.pages.begin(), m.pages.end(), r.pages.begin());
  radix_->lock(m.node);
  if (r.locked_node) radix_->unlock(r.locked_node);
  r.locked_node = m.node;
  r.locked_pages = full;
}

void Scheduler::finish(Request& r, FinishReason reason, RequestOutput&& out) {
  out.id = r.id;
  out.finish = reason;
  out.abort_message = r.abort_message;
  out.prompt_tokens = r.prompt_len;
  out.completion_tokens = r.num_output();
  out.cached_tokens = std::max(r.cached_tokens, 0);
  totals_.finished_requests++;
  totals_.prompt_tokens += r.prompt_len;
  totals_.cached_prompt_tokens += out.cached_tokens;
  if (r.on_output) r.on_output(std::move(out));
}

void Scheduler::retract(Request& r) {
  auto owned = take_running(r);
  release_kv(*owned);
  totals_.retractions++;
  new_token_ratio_ = kInitNewTokenRatio;
  // Back into the queue in arrival order, so it is re-admitted before newer ones.
  auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](auto& w) { return w->arrival > owned->arrival; });
  waiting_.insert(pos, std::move(owned));
}

int Scheduler::decode_reserve_pages(const Request& r) const {
  int remaining_out = std::max(r.params.max_new_tokens - r.num_output(), 0);
  int64_t tokens = std::max(r.pending_tokens() - 1, 0) + int64_t(remaining_out * new_token_ratio_);
  return pages_for_tokens(tokens, config_.page_size);
}

bool Scheduler::make_room(int pages, const Request* keep) {
  while (allocator_.num_free() < pages) {
    if (radix_ && radix_->evict(pages - allocator_.num_free()) > 0) continue;
    if (running_.empty() || running_.back().get() == keep) return false;
    retract(*running_.back());
  }
  return true;
}

bool Scheduler::ensure_pages(Request& r, int tokens) {
  int need = pages_for_tokens(tokens, config_.page_size) - int(r.pages.size());
  if (need <= 0) return true;
  if (allocator_.num_free() < need && radix_) radix_->evict(need - allocator_.num_free());
  auto fresh = allocator_.alloc(need);
  if (!fresh) return false;
  r.pages.insert(r.pages.end(), fresh->begin(), fresh->end());
  return true;
}

void Scheduler::sort_waiting() {
  if (config_.policy != SchedulePolicy::Lpm || !radix_ || waiting_.size() > kLpmMaxQueue) return;
  std::vector<std::pair<int, size_t>> keyed;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    auto& t = waiting_[i]->tokens;
    keyed.emplace_back(radix_->prefix_length(std::span(t).first(t.size() - 1)), i);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::deque<std::unique_ptr<Request>> sorted;
  for (auto& [_, i] : keyed) sorted.push_back(std::move(waiting_[i]));
  waiting_ = std::move(sorted);
}

bool Scheduler::admit(Request& r, int& budget, int reserved_pages) {
  RadixCache::Match m;
  m.page_size = config_.page_size;
  if (radix_) {
    // The last token is always recomputed: its logits are needed.
    m = radix_->match_prefix(std::span(r.tokens).first(r.tokens.size() - 1));
    radix_->lock(m.node);
  }
  int n = std::min(int(r.tokens.size()) - m.num_tokens(), budget);
  int need = pages_for_tokens(m.num_tokens() + n, config_.page_size) - int(m.pages.size());
  int available = allocator_.num_free() + (radix_ ? radix_->evictable_pages() : 0);
  // With nothing running, admit whatever fits at all, so a big request is
  // never starved by the reserve it would only need for later steps.
  int own_reserve = pages_for_tokens(int64_t(r.params.max_new_tokens * new_token_ratio_), config_.page_size);
  bool fits = running_.empty() ? need <= available : need + reserved_pages + own_reserve <= available;
  if (fits && radix_ && allocator_.num_free() < need) radix_->evict(need - allocator_.num_free());
  auto fresh = fits ? allocator_.alloc(need) : std::nullopt;
  if (!fresh) {
    if (radix_) radix_->unlock(m.node);
    return false;
  }
  r.pages = m.pages;
  r.pages.insert(r.pages.end(), fresh->begin(), fresh->end());
  r.kv_len = m.num_tokens();
  r.locked_node = radix_ ? m.node : nullptr;
  r.locked_pages = int(m.pages.size());
  if (r.cached_tokens < 0) r.cached_tokens = std::min(r.kv_len, r.prompt_len);
  return true;
}

namespace {

// r's next n tokens (from kv_len) as one sequence of the batch, attending to
// everything before them; or, with a placeholder, the one token after its
// last (continue_decode), whose input id is the placeholder. A logits row
// when the sequence reaches the request's end.
void append_entry(ScheduledBatch& b, Request& r, int n, int page_size, std::optional<int32_t> placeholder = {}) {
  ForwardBatch& f = b.forward;
  if (f.q_indptr.empty()) {
    f.q_indptr.push_back(0);
    f.kv_indptr.push_back(0);
  }
  const int pos0 = placeholder ? int(r.tokens.size()) : r.kv_len;
  auto slot = [&](int pos) { return r.pages[size_t(pos / page_size)] * page_size + pos % page_size; };
  for (int i = 0; i < n; ++i) {
    int pos = pos0 + i;
    f.input_ids.push_back(placeholder ? *placeholder : r.tokens[size_t(pos)]);
    f.positions.push_back(pos);
    f.out_slots.push_back(slot(pos));
  }
  // Every slot the sequence attends to, a page at a time: the whole context
  // is listed each step, and a division per position cost ~3.3 ms a step at
  // 64 requests x 8192 tokens against ~1.3 this way (page size 64: 3.1
  // against 2.2; a stand-alone copy of both loops on the development VM).
  const int kv_end = pos0 + n;
  if (page_size == 1) {
    f.kv_slots.insert(f.kv_slots.end(), r.pages.begin(), r.pages.begin() + kv_end);
  } else {
    for (int pos = 0; pos < kv_end; pos += page_size) {
      const int32_t first = r.pages[size_t(pos / page_size)] * page_size;
      for (int i = 0, end = std::min(page_size, kv_end - pos); i < end; ++i) f.kv_slots.push_back(first + i);
    }
  }
  f.q_indptr.push_back(int32_t(f.input_ids.size()));
  f.kv_indptr.push_back(int32_t(f.kv_slots.size()));
  ScheduledBatch::Entry e{&r, n};
  if (placeholder || pos0 + n == int(r.tokens.size())) {
    e.logit_row = int(f.logit_rows.size());
    f.logit_rows.push_back(int32_t(f.input_ids.size()) - 1);
  }
  b.entries.push_back(e);
}

}  // namespace

std::optional<ScheduledBatch> Scheduler::next_batch() {
  release_aborted();
  for (;;) {
    auto b = build_batch();
    if (b || running_.empty()) return b;
    // Only partly prefilled requests are left and none of them can get a
    // page: the youngest gives its pages back so the others can go on.
    retract(*running_.back());
  }
}

std::optional<ScheduledBatch> Scheduler::build_batch() {
  ScheduledBatch b;
  const int ps = config_.page_size;

  // 1. One decode token for every running request that has finished its
  // prefill, oldest first; the youngest give way when pages run out.
  std::vector<Request*> decode;
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    if (r.pending_tokens() != 1) continue;
    if (!ensure_pages(r, r.kv_len + 1)) {
      int need = pages_for_tokens(r.kv_len + 1, ps) - int(r.pages.size());
      if (!make_room(need, &r) || !ensure_pages(r, r.kv_len + 1)) {
        if (running_.size() == 1) {
          // Alone and still out of pages: the pool cannot hold this sequence.
          auto owned = take_running(r);
          release_kv(*owned);
          if (owned->awaiting_postprocess) {
            owned->finish_after_postprocess = FinishReason::Length;  // reported with its last token
          } else {
            RequestOutput out;
            if (owned->detokenizer) out.text = owned->stop_matcher->push(owned->detokenizer->flush()).text;
            out.text += owned->stop_matcher->flush();
            finish(*owned, FinishReason::Length, std::move(out));
          }
          retired_.push_back(std::move(owned));
          break;
        }
        retract(r);  // it was the youngest
        break;
      }
    }
    decode.push_back(&r);
  }
  for (Request* r : decode) append_entry(b, *r, 1, ps);
  b.num_decode = int(decode.size());

  // 2. Prefill: continue partly prefilled requests, then admit new ones.
  int budget = config_.chunked_prefill_size > 0 ? std::max(config_.chunked_prefill_size - b.num_decode, 0) : INT_MAX;
  for (auto& rp : running_) {
    Request& r = *rp;
    if (r.pending_tokens() <= 1 || budget <= 0) continue;
    int n = std::min(r.pending_tokens(), budget);
    if (!ensure_pages(r, r.kv_len + n)) continue;
    append_entry(b, r, n, ps);
    budget -= n;
  }
  sort_waiting();
  int reserved = 0;
  for (auto& r : running_) reserved += decode_reserve_pages(*r);
  while (!waiting_.empty() && int(running_.size()) < config_.max_running_requests && budget > 0) {
    Request& r = *waiting_.front();
    if (!admit(r, budget, reserved)) break;
    int n = std::min(r.pending_tokens(), budget);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    append_entry(b, r, n, ps);
    budget -= n;
    reserved += decode_reserve_pages(r);
  }

  if (b.entries.empty()) return std::nullopt;
  finish_building(b);
  return b;
}

void Scheduler::finish_building(ScheduledBatch& b) {
  auto every_row = [&](auto pred) {
    return std::all_of(b.entries.begin(), b.entries.end(),
                       [&](const ScheduledBatch::Entry& e) { return e.logit_row < 0 || pred(e.request->params); });
  };
  if (every_row(needs_only_argmax)) {
    b.sampling = ScheduledBatch::SamplingPath::DeviceArgmax;
  } else if (every_row(can_sample_on_device)) {
    b.sampling = ScheduledBatch::SamplingPath::DeviceSample;
    b.device_rows.resize(b.forward.logit_rows.size());
    for (const auto& e : b.entries) {
      if (e.logit_row < 0) continue;
      const SamplingParams& p = e.request->params;
      b.device_rows[size_t(e.logit_row)] = {p.temperature, p.top_k, p.top_p, p.min_p, e.request->rng->uniform()};
    }
  }
  if (b.num_decode > 0) new_token_ratio_ = std::max(kMinNewTokenRatio, new_token_ratio_ - kNewTokenRatioDecay);
  totals_.last_batch_tokens = b.forward.num_tokens();
  totals_.last_batch_seqs = int(b.entries.size());
}

std::optional<ScheduledBatch> Scheduler::continue_decode(const ScheduledBatch& started) {
  // Waiting requests wait for a host-built step only where one could admit
  // them: not while the running set is full.
  const bool can_admit = !waiting_.empty() && int(running_.size()) < config_.max_running_requests;
  if (started.sampling == ScheduledBatch::SamplingPath::HostLogits || can_admit || running_.empty())
    return std::nullopt;
  std::unordered_map<const Request*, int> row_of;  // each request's logits row in `started`
  for (const auto& e : started.entries) row_of[e.request] = e.logit_row;
  for (const auto& r : running_) {
    auto it = row_of.find(r.get());
    if (r->aborted || it == row_of.end() || it->second < 0) return std::nullopt;
  }
  ScheduledBatch b;
  for (const auto& rp : running_) {
    Request& r = *rp;
    const int pos = int(r.tokens.size());  // where started's pick goes
    if (r.num_output() + 1 >= r.params.max_new_tokens || pos + 1 >= config_.context_length) continue;
    if (!ensure_pages(r, pos + 1)) return std::nullopt;
    append_entry(b, r, 1, config_.page_size, -1 - row_of[&r]);
  }
  if (b.entries.empty()) return std::nullopt;
  b.num_decode = int(b.entries.size());
  finish_building(b);
  return b;
}

std::vector<const ScheduledBatch::Entry*> Scheduler::begin_sampling(const ScheduledBatch& b) {
  std::vector<const ScheduledBatch::Entry*> to_sample;
  for (const auto& e : b.entries) {
    Request& r = *e.request;
    // Its final output went out after this step started (a continued step's
    // row of a request the step before ended): nothing more to do for it.
    if (r.final_reported) continue;
    r.kv_len += e.num_tokens;
    if (e.num_tokens > 1 && !r.aborted) cache_prefix(r);
    if (e.logit_row >= 0 && !r.aborted) to_sample.push_back(&e);
  }
  // The previous step's postprocessing is done, and no started step holds
  // these requests any more (a continued step held them up to here).
  retired_.clear();
  return to_sample;
}

Scheduler::SampledStep Scheduler::sample(const ScheduledBatch& b, const Tensor& logits) {
  const int64_t vocab = logits.defined() && logits.ndim() == 2 ? logits.dim(1) : 0;
  MLA_CHECK(b.forward.logit_rows.empty() || (logits.dtype() == mlaserve::DType::F32 &&
                                              logits.dim(0) == int64_t(b.forward.logit_rows.size())),
            "model returned logits {} for {} rows", shape_str(logits.shape()), b.forward.logit_rows.size());
  std::vector<const ScheduledBatch::Entry*> to_sample = begin_sampling(b);
  // Rows are independent (each request has its own RNG and history), and a
  // row is a whole vocabulary: spread them over the cores.
  std::vector<SampledToken> sampled(to_sample.size());
  parallel_for(int64_t(to_sample.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto& e = *to_sample[size_t(i)];
      Request& r = *e.request;
      std::span<const float> row(logits.data<float>() + e.logit_row * vocab, size_t(vocab));
      sampled[size_t(i)] = sample_token(row, r.params, r.history, *r.rng);
    }
  });
  return commit_sampled(to_sample, std::move(sampled));
}

Scheduler::SampledStep Scheduler::sample_ids(const ScheduledBatch& b, std::span<const int32_t> ids) {
  MLA_CHECK(b.sampling != ScheduledBatch::SamplingPath::HostLogits,
            "sample_ids: the batch has rows that need their whole logits on the host");
  MLA_CHECK(ids.size() == b.forward.logit_rows.size(), "model returned {} ids for {} rows", ids.size(),
            b.forward.logit_rows.size());
  std::vector<const ScheduledBatch::Entry*> to_sample = begin_sampling(b);
  std::vector<SampledToken> sampled(to_sample.size());
  for (size_t i = 0; i < to_sample.size(); ++i) {
    sampled[i].id = ids[size_t(to_sample[i]->logit_row)];
  }
  return commit_sampled(to_sample, std::move(sampled));
}

Scheduler::SampledStep Scheduler::commit_sampled(const std::vector<const ScheduledBatch::Entry*>& to_sample,
                                                 std::vector<SampledToken> sampled) {
  SampledStep step;
  for (size_t i = 0; i < to_sample.size(); ++i) {
    Request& r = *to_sample[i]->request;
    SampledStep::Item it{&r, std::move(sampled[i])};
    const int32_t id = it.token.id;
    r.tokens.push_back(id);
    r.history.add_output(id);
    totals_.generated_tokens++;
    it.stop_token = (!r.params.ignore_eos && contains(config_.eos_token_ids, id)) || contains(r.params.stop_token_ids, id);
    if (it.stop_token) {
      it.reason = FinishReason::Stop;
    } else if (r.num_output() >= r.params.max_new_tokens || int(r.tokens.size()) >= config_.context_length) {
      it.reason = FinishReason::Length;
    }
    r.awaiting_postprocess = true;
    if (it.reason != FinishReason::None) {
      auto owned = take_running(r);
      release_kv(*owned);
      retired_.push_back(std::move(owned));
    }
    step.items.push_back(std::move(it));
  }
  return step;
}

void Scheduler::postprocess(SampledStep& step) {
  for (auto& it : step.items) {
    Request& r = *it.request;
    r.awaiting_postprocess = false;
    if (r.final_reported) continue;  // aborted since it was sampled: already ended
    RequestOutput out;
    out.token_ids = {it.token.id};
    if (r.params.logprobs || r.params.top_logprobs > 0) out.logprobs.push_back(it.token);
    FinishReason reason = it.reason;
    if (it.stop_token) {
      out.matched_stop_token = it.token.id;
    } else if (r.detokenizer) {
      auto res = r.stop_matcher->push(r.detokenizer->push(it.token.id));
      out.text = std::move(res.text);
      if (res.stopped) {
        reason = FinishReason::Stop;
        out.matched_stop_string = res.matched;
      }
    }
    if (reason == FinishReason::None) reason = r.finish_after_postprocess;
    if (reason == FinishReason::None) {
      r.on_output(std::move(out));
      continue;
    }
    if (!out.matched_stop_string) {
      // Text held back for a stop string that never came, or an incomplete
      // UTF-8 tail, is released at the end.
      if (r.detokenizer) out.text += r.stop_matcher->push(r.detokenizer->flush()).text;
      out.text += r.stop_matcher->flush();
    }
    finish(r, reason, std::move(out));
    r.final_reported = true;
    // Ended by its text while it may already sit in the next step or the
    // queue: dropped (not reported again) before it is sampled again.
    if (it.reason == FinishReason::None && r.finish_after_postprocess == FinishReason::None) r.aborted = true;
  }
}

void Scheduler::process(const ScheduledBatch& b, const Tensor& logits) {
  SampledStep step = sample(b, logits);
  postprocess(step);
}

bool Scheduler::flush_cache() { return !radix_ || radix_->reset(); }

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = totals_;
  s.running = int(running_.size());
  s.waiting = int(waiting_.size());
  s.total_pages = allocator_.num_pages();
  s.free_pages = allocator_.num_free();
  s.cached_pages = radix_ ? radix_->total_pages() : 0;
  s.evictable_pages = radix_ ? radix_->evictable_pages() : 0;
  return s;
}

void Scheduler::check_invariants() const {
  std::vector<int32_t> tree_pages;
  if (radix_) {
    radix_->check_invariants();
    radix_->collect_pages(tree_pages);
  }
  std::unordered_set<int32_t> tree(tree_pages.begin(), tree_pages.end());
  std::unordered_set<int32_t> owned;
  for (auto& r : running_) {
    MLA_CHECK(r->kv_len <= int(r->pages.size()) * config_.page_size, "request {}: kv_len {} beyond its {} pages",
              r->id, r->kv_len, r->pages.size());
    for (size_t i = 0; i < r->pages.size(); ++i) {
      int32_t p = r->pages[i];
      MLA_CHECK(allocator_.in_use(p), "page {} of request {} is free", p, r->id);
      if (int(i) < r->locked_pages) {
        MLA_CHECK(tree.count(p), "page {} of request {}'s cached prefix is not in the tree", p, r->id);
      } else {
        MLA_CHECK(!tree.count(p), "page {} is owned by both request {} and the tree", p, r->id);
        MLA_CHECK(owned.insert(p).second, "page {} is owned by two requests", p);
      }
    }
  }
  for (auto& r : waiting_) MLA_CHECK(r->pages.empty(), "waiting request {} holds pages", r->id);
  int in_use = allocator_.num_pages() - allocator_.num_free();
  MLA_CHECK(in_use == int(tree.size() + owned.size()),
            "{} pages in use but the tree holds {} and requests {}: pages leaked", in_use, tree.size(), owned.size());
}

}  // namespace mlaserve::runtime
