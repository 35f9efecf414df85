#pragma once
// A fixed pool of worker threads for the CPU backend: parallel_for splits a
// range into contiguous chunks, one per worker, and waits for all of them.
#include <cstdint>
#include <functional>

namespace mlaserve {

// Number of worker threads (all cores unless MLASERVE_THREADS is set).
int cpu_threads();

// Calls fn(begin, end) on disjoint chunks covering [0, n); chunks are at
// least `grain` long. Runs inline when the range is small or when called
// from inside a worker (no nested parallelism).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace mlaserve
