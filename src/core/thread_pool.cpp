#include "core/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mlaserve {
namespace {

thread_local bool t_in_worker = false;

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this, i] { loop(i + 1); });
  }
  ~Pool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  // Runs job(i) for i in [0, size()), the caller taking i = 0.
  void run(const std::function<void(int)>& job) {
    std::unique_lock run_lk(run_mu_);  // one parallel region at a time
    {
      std::lock_guard lk(mu_);
      job_ = &job;
      pending_ = int(workers_.size());
      ++generation_;
      error_ = nullptr;
    }
    cv_.notify_all();
    std::exception_ptr mine;
    t_in_worker = true;
    try {
      job(0);
    } catch (...) {
      mine = std::current_exception();
    }
    t_in_worker = false;
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop(int index) {
    t_in_worker = true;
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      try {
        (*job)(index);
      } catch (...) {
        std::lock_guard lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      {
        std::lock_guard lk(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p(cpu_threads());
  return p;
}

}  // namespace

int cpu_threads() {
  static int n = [] {
    if (const char* e = std::getenv("MLASERVE_THREADS")) {
      int v = std::atoi(e);
      if (v > 0) return v;
    }
    return std::max(1, int(std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t max_chunks = (n + grain - 1) / grain;
  if (t_in_worker || max_chunks <= 1 || cpu_threads() == 1) {
    fn(0, n);
    return;
  }
  Pool& p = pool();
  int64_t chunks = std::min<int64_t>(max_chunks, p.size());
  int64_t per = (n + chunks - 1) / chunks;
  p.run([&](int i) {
    int64_t b = int64_t(i) * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

}  // namespace mlaserve
