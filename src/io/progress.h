#pragma once
// Progress of a long byte-counted job (reading or writing a checkpoint):
// on a terminal, one line on stderr redrawn in place with bytes done, rate
// and time left; otherwise (logs, CI) a plain log line every few seconds and
// a summary at the end.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace mlaserve {

std::string format_bytes(double bytes);     // "1.23 GB", "512 KB", "17 B"
std::string format_duration(double seconds);  // "0:07", "1:02:03"

class ByteProgress {
 public:
  ByteProgress(std::string label, uint64_t total_bytes);
  ~ByteProgress();
  ByteProgress(const ByteProgress&) = delete;
  ByteProgress& operator=(const ByteProgress&) = delete;

  // Counts `bytes` more as done; cheap and thread-safe (redraws are rate
  // limited, and only one thread draws at a time).
  void add(uint64_t bytes);
  // Prints the final line once; the destructor calls it too.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  void report(bool final);

  std::string label_;
  uint64_t total_;
  bool tty_;
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> next_report_ns_;
  std::mutex mu_;
  Clock::time_point start_;
  bool finished_ = false;
};

}  // namespace mlaserve
