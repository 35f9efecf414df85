#pragma once
// Element types of checkpoints and activations, and the scalar conversions
// the CPU reference uses (bf16, f16, fp8 e4m3 <-> f32).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mlaserve {

enum class DType : uint8_t { F32, BF16, F16, F8_E4M3, I32, I64, U8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);          // safetensors spelling: "BF16", "F8_E4M3", ...
bool parse_dtype(std::string_view s, DType* out);  // false for unknown names

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN stays NaN (as torch's .to(bfloat16)).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities,
// 0x7f/0xff are NaN, largest finite 448.
float fp8e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to +-448 (what DeepSeek's quantizers do
// after clamping); NaN maps to NaN.
uint8_t f32_to_fp8e4m3(float f);

constexpr float kFp8E4M3Max = 448.0f;

}  // namespace mlaserve
