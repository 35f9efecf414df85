#include "kernels/cuda/l2_prefetch.h"

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {
namespace {

constexpr int kMaxRanges = 4;
constexpr uint32_t kChunkBytes = 16384;

struct PrefetchRanges {
  const char* ptr[kMaxRanges];
  uint64_t bytes[kMaxRanges];
  uint64_t first_chunk[kMaxRanges + 1];  // prefix sums of each range's chunk count
  int count;
};

// Chunk c of the concatenated ranges goes to lane c % (32 * gridDim.x): the
// grid's lanes sweep the bytes in order, so the earliest-needed rows land first.
__global__ void __launch_bounds__(32) l2_prefetch_kernel(const __grid_constant__ PrefetchRanges r) {
  const uint64_t total = r.first_chunk[r.count];
  const uint64_t stride = uint64_t(gridDim.x) * 32;
  int range = 0;
  for (uint64_t c = uint64_t(blockIdx.x) * 32 + threadIdx.x; c < total; c += stride) {
    while (c >= r.first_chunk[range + 1]) ++range;
    const uint64_t offset = (c - r.first_chunk[range]) * kChunkBytes;
    const uint64_t left = r.bytes[range] - offset;
    const uint32_t bytes = left < kChunkBytes ? uint32_t(left) : kChunkBytes;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.ptr[range] + offset), "r"(bytes) : "memory");
#endif
  }
}

}  // namespace

void l2_prefetch(const std::vector<ByteRange>& ranges, int blocks, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(int(ranges.size()) <= kMaxRanges, "l2_prefetch: " + std::to_string(ranges.size()) +
                                                       " ranges (at most " + std::to_string(kMaxRanges) + ")");
  PrefetchRanges r{};
  r.first_chunk[0] = 0;
  for (const ByteRange& br : ranges) {
    MLA_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(br.ptr) % 16 == 0 && br.bytes % 16 == 0,
                     "l2_prefetch: a range of " + std::to_string(br.bytes) + " bytes is not 16-byte aligned");
    if (br.bytes == 0) continue;
    r.ptr[r.count] = static_cast<const char*>(br.ptr);
    r.bytes[r.count] = br.bytes;
    r.first_chunk[r.count + 1] = r.first_chunk[r.count] + (br.bytes + kChunkBytes - 1) / kChunkBytes;
    ++r.count;
  }
  if (r.count == 0 || blocks <= 0) return;
  l2_prefetch_kernel<<<blocks, 32, 0, stream>>>(r);
  check_launch("l2_prefetch");
}

}  // namespace mlaserve::cuda
