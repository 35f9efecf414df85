#pragma once
// A few worker threads for request preparation (JSON parsing, chat
// templates, tokenization), so a long prompt never stalls the io thread and
// with it every other connection.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlaserve::server {

class WorkQueue {
 public:
  explicit WorkQueue(int threads);
  ~WorkQueue();  // runs what is queued, then joins
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void submit(std::function<void()> task);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace mlaserve::server
