#pragma once
// Random numbers that are bit-identical on every machine, compiler and
// standard library, so a checkpoint made from a seed here equals the one
// made on the GPU machine (whose transformers outputs are our golden data).
// std::normal_distribution differs between libstdc++ versions and libm's
// log/cos may differ in the last bit between glibc versions, so this uses
// xoshiro256** (seeded by splitmix64) and Marsaglia's polar form of
// Box-Muller with a logarithm built from IEEE basic arithmetic only.
#include <cstdint>
#include <string_view>

namespace mlaserve {

uint64_t splitmix64(uint64_t& state);
// A stable 64-bit hash of a name (FNV-1a), for per-tensor streams.
uint64_t hash_name(std::string_view s);
// Natural log for finite x > 0, accurate to about 1e-15 relative.
double portable_log(double x);

class PortableRng {
 public:
  explicit PortableRng(uint64_t seed);
  uint64_t next_u64();
  double uniform();  // [0, 1), 53 random bits
  double normal();   // standard normal

 private:
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace mlaserve
