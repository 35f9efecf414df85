#include "io/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace mlaserve {
namespace {

// A terminal gets a smooth redraw; a log file gets a line now and then.
constexpr int64_t kTtyIntervalNs = 100'000'000;
constexpr int64_t kLogIntervalNs = 5'000'000'000;

}  // namespace

std::string format_bytes(double bytes) {
  static constexpr const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string format_duration(double seconds) {
  int64_t s = seconds > 0 ? int64_t(seconds + 0.5) : 0;
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

ByteProgress::ByteProgress(std::string label, uint64_t total_bytes)
    : label_(std::move(label)), total_(total_bytes), tty_(::isatty(STDERR_FILENO) == 1), start_(Clock::now()) {
  next_report_ns_ = tty_ ? 0 : kLogIntervalNs;
}

ByteProgress::~ByteProgress() { finish(); }

void ByteProgress::add(uint64_t bytes) {
  done_.fetch_add(bytes, std::memory_order_relaxed);
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  int64_t due = next_report_ns_.load(std::memory_order_relaxed);
  if (now < due) return;
  // One thread wins the right to draw this interval.
  if (!next_report_ns_.compare_exchange_strong(due, now + (tty_ ? kTtyIntervalNs : kLogIntervalNs))) return;
  std::unique_lock lk(mu_, std::try_to_lock);
  if (lk.owns_lock() && !finished_) report(false);
}

void ByteProgress::finish() {
  std::lock_guard lk(mu_);
  if (finished_) return;
  report(true);
  finished_ = true;
}

void ByteProgress::report(bool final) {
  double secs = std::chrono::duration<double>(Clock::now() - start_).count();
  double done = double(done_.load(std::memory_order_relaxed));
  double rate = secs > 0 ? done / secs : 0.0;
  if (final) {
    std::string line = fmt::format("{}: {} in {:.1f} s ({}/s)", label_, format_bytes(done), secs, format_bytes(rate));
    if (tty_) {
      std::fprintf(stderr, "\r\033[K");
      std::fflush(stderr);
    }
    spdlog::info("{}", line);
    return;
  }
  double pct = total_ ? 100.0 * done / double(total_) : 100.0;
  std::string left = rate > 0 ? format_duration((double(total_) - done) / rate) : "?";
  std::string line = fmt::format("{}: {} / {} ({:.0f}%), {}/s, {} left", label_, format_bytes(done),
                                 format_bytes(double(total_)), pct, format_bytes(rate), left);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
  } else {
    spdlog::info("{}", line);
  }
}

}  // namespace mlaserve
