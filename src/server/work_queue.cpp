#include "server/work_queue.h"

#include <spdlog/spdlog.h>

#include <exception>

namespace mlaserve::server {

WorkQueue::WorkQueue(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkQueue::submit(std::function<void()> task) {
  {
    std::lock_guard lk(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkQueue::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      task();
    } catch (const std::exception& e) {
      // Tasks report their own errors; this only keeps a bug from killing the worker.
      spdlog::error("request preparation failed: {}", e.what());
    }
  }
}

}  // namespace mlaserve::server
