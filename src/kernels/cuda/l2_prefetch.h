#pragma once
// Pulls byte ranges of device memory into L2 without blocking the stream
// that reads them later: the backend launches it on a side stream, so the
// prefetch overlaps latency-bound kernels that leave DRAM mostly idle (a
// decode step's attention chain) and the reader finds its lines in L2.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace mlaserve::cuda {

struct ByteRange {
  const void* ptr = nullptr;  // 16-byte aligned
  size_t bytes = 0;           // a multiple of 16
};

// One launch over all ranges: `blocks` single-warp blocks, each lane issuing
// bulk L2 prefetches of up to 16 KB (cp.async.bulk.prefetch.L2).
void l2_prefetch(const std::vector<ByteRange>& ranges, int blocks, cudaStream_t stream);

}  // namespace mlaserve::cuda
