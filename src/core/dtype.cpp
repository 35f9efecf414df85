#include "core/dtype.h"

#include <array>
#include <cmath>

namespace mlaserve {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F8_E4M3: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
  static constexpr std::array<DType, 7> all = {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3,
                                               DType::I32, DType::I64, DType::U8};
  for (DType t : all) {
    if (dtype_name(t) == s) {
      *out = t;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(float(mant | 0x400), exp - 25);
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= sign;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = uint32_t(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  int exp = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    ++exp;
  }
  if (exp >= 31) return sign | 0x7c00;
  return sign | uint16_t(exp << 10) | uint16_t(mant);
}

float fp8e4m3_to_f32(uint8_t v) {
  int sign = v >> 7;
  int exp = (v >> 3) & 0xf;
  int mant = v & 7;
  float r;
  if (exp == 15 && mant == 7) {
    r = NAN;
  } else if (exp == 0) {
    r = std::ldexp(float(mant), -9);
  } else {
    r = std::ldexp(float(8 + mant), exp - 10);
  }
  return sign ? -r : r;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;
  if (a < std::ldexp(1.0f, -6)) {  // subnormal: multiples of 2^-9
    int m = int(std::nearbyint(a * 512.0f));
    return sign | uint8_t(m);  // m == 8 is exactly the smallest normal (exp 1, mant 0)
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e
  int mant = int(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));
  int exp = e - 1 + 7;
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7e;
  return sign | uint8_t(exp << 3) | uint8_t(mant);
}

}  // namespace mlaserve
