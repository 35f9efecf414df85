#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

using namespace mlaserve;

TEST(ThreadPool, CoversRangeExactlyOnce) {
  std::vector<std::atomic<int>> hits(10007);
  parallel_for(int64_t(hits.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, PropagatesExceptions) {
  EXPECT_THROW(parallel_for(100, 1, [](int64_t b, int64_t) {
                 if (b == 0) throw std::runtime_error("boom");
               }),
               std::runtime_error);
  // The pool stays usable afterwards.
  std::atomic<int64_t> sum = 0;
  parallel_for(100, 1, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100);
}
