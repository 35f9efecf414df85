#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "runtime/stop_matcher.h"

using namespace mlaserve::runtime;

namespace {

std::vector<float> log_probs(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(float(std::log(x)));
  return l;
}

std::map<int32_t, double> frequencies(const std::vector<float>& logits, const SamplingParams& p, int n) {
  Rng rng(123);
  TokenHistory h;
  std::map<int32_t, double> f;
  for (int i = 0; i < n; ++i) f[sample_token(logits, p, h, rng).id] += 1.0 / n;
  return f;
}

}  // namespace

TEST(Sampler, GreedyIsExactArgmaxFirstOnTies) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f, 2.9999f};
  SamplingParams p;
  p.temperature = 0;
  Rng rng(1);
  TokenHistory h;
  EXPECT_EQ(sample_token(logits, p, h, rng).id, 1);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(sample_token(logits, p, h, rng).id, 1);
}

TEST(Sampler, TemperatureOneFollowsTheDistribution) {
  auto logits = log_probs({0.5, 0.3, 0.2});
  auto f = frequencies(logits, SamplingParams{}, 20000);
  EXPECT_NEAR(f[0], 0.5, 0.02);
  EXPECT_NEAR(f[1], 0.3, 0.02);
  EXPECT_NEAR(f[2], 0.2, 0.02);
}

TEST(Sampler, TemperatureSharpens) {
  // p^(1/T) renormalized: T = 0.5 gives 0.25 : 0.09 : 0.04.
  auto logits = log_probs({0.5, 0.3, 0.2});
  SamplingParams p;
  p.temperature = 0.5f;
  auto f = frequencies(logits, p, 20000);
  EXPECT_NEAR(f[0], 0.25 / 0.38, 0.02);
  EXPECT_NEAR(f[2], 0.04 / 0.38, 0.02);
}

TEST(Sampler, TopKTopPMinPCutTheTail) {
  auto logits = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.top_k = 2;
  auto f = frequencies(logits, p, 10000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);
  EXPECT_NEAR(f[0], 0.625, 0.03);

  p = {};
  p.top_p = 0.6f;  // 0.5 is not enough, 0.5 + 0.3 is
  f = frequencies(logits, p, 10000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);

  p = {};
  p.min_p = 0.35f;  // threshold 0.175: keeps 0.5 and 0.3
  f = frequencies(logits, p, 10000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);
  EXPECT_GT(f[1], 0.3);
}

TEST(Sampler, SameSeedSameTokens) {
  auto logits = log_probs({0.25, 0.25, 0.25, 0.25});
  SamplingParams p;
  TokenHistory h;
  Rng a(42), b(42), c(43);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(sample_token(logits, p, h, a).id);
    sb.push_back(sample_token(logits, p, h, b).id);
    sc.push_back(sample_token(logits, p, h, c).id);
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampler, PenaltiesChangeTheGreedyChoice) {
  std::vector<float> logits = {2.0f, 1.5f, -1.0f};
  SamplingParams p;
  p.temperature = 0;
  Rng rng(1);
  TokenHistory h;
  h.add_prompt(std::vector<int32_t>{0});
  p.repetition_penalty = 1.5f;  // 2.0 / 1.5 = 1.33 < 1.5
  EXPECT_EQ(sample_token(logits, p, h, rng).id, 1);

  p = {};
  p.temperature = 0;
  p.frequency_penalty = 0.3f;  // token 0 seen twice in the output: 2.0 - 0.6 = 1.4
  TokenHistory out;
  out.add_output(0);
  EXPECT_EQ(sample_token(logits, p, out, rng).id, 0);
  out.add_output(0);
  EXPECT_EQ(sample_token(logits, p, out, rng).id, 1);

  p.frequency_penalty = 0;
  p.presence_penalty = 0.6f;  // 2.0 - 0.6 = 1.4 regardless of count
  EXPECT_EQ(sample_token(logits, p, out, rng).id, 1);
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  auto logits = log_probs({0.5, 0.3, 0.2});
  for (auto& l : logits) l += 7.0f;  // shift invariance
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  Rng rng(1);
  TokenHistory h;
  auto s = sample_token(logits, p, h, rng);
  EXPECT_EQ(s.id, 0);
  EXPECT_NEAR(s.logprob, std::log(0.5), 1e-5);
  ASSERT_EQ(s.top.size(), 2u);
  EXPECT_EQ(s.top[1].first, 1);
  EXPECT_NEAR(s.top[1].second, std::log(0.3), 1e-5);
}

TEST(SamplingParams, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  try {
    p.validate();
    FAIL();
  } catch (const mlaserve::Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  p = {};
  p.max_new_tokens = -1;
  EXPECT_THROW(p.validate(), mlaserve::Error);
  p = {};
  p.temperature = NAN;
  EXPECT_THROW(p.validate(), mlaserve::Error);
  EXPECT_NO_THROW(SamplingParams{}.validate());
}

TEST(StopMatcher, NeverEmitsAStopStringSplitAnywhere) {
  const std::string text = "hello wor STOP! tail";
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      StopMatcher m({"STOP!", "zzz"});
      std::string out;
      bool stopped = false;
      for (auto piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
        auto r = m.push(piece);
        out += r.text;
        if (r.stopped) {
          stopped = true;
          EXPECT_EQ(r.matched, "STOP!");
          break;
        }
      }
      EXPECT_TRUE(stopped);
      EXPECT_EQ(out, "hello wor ") << a << "," << b;
    }
  }
}

TEST(StopMatcher, HoldsBackOnlyPossiblePrefixesAndFlushesThem) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xxab").text, "xx");
  EXPECT_EQ(m.push("x").text, "abx");
  EXPECT_EQ(m.push("a").text, "");
  EXPECT_EQ(m.flush(), "a");
  StopMatcher none({});
  EXPECT_EQ(none.push("abc").text, "abc");
}
