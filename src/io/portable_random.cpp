#include "io/portable_random.h"

#include <cmath>

namespace mlaserve {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

double portable_log(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s) with
  // s = (m - 1) / (m + 1), |s| <= 0.1716, summed as an odd series to s^17.
  // frexp, +, *, / are exact or correctly rounded in IEEE arithmetic.
  int e;
  double m = std::frexp(x, &e);
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e -= 1;
  }
  double s = (m - 1.0) / (m + 1.0);
  double s2 = s * s;
  double series =
      1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11 + s2 * (1.0 / 13 +
                                                                                              s2 * (1.0 / 15 + s2 * (1.0 / 17))))))));
  return double(e) * 0.69314718055994530942 + 2.0 * s * series;
}

PortableRng::PortableRng(uint64_t seed) {
  uint64_t st = seed;
  for (uint64_t& w : s_) w = splitmix64(st);
}

uint64_t PortableRng::next_u64() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double PortableRng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

double PortableRng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u, v, s;
  do {
    u = 2.0 * uniform() - 1.0;
    v = 2.0 * uniform() - 1.0;
    s = u * u + v * v;
  } while (s >= 1.0 || s == 0.0);
  double f = std::sqrt(-2.0 * portable_log(s) / s);  // sqrt is correctly rounded
  spare_ = v * f;
  has_spare_ = true;
  return u * f;
}

}  // namespace mlaserve
