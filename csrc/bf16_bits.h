// bf16 <-> fp32 as plain bit operations that GCC vectorises (round to nearest even; NaN stays
// NaN): the row kernels' loads and stores of bfloat16 tensors (hstu_layer.cpp, rows.cpp), and
// their dispatch on the two dtypes.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace torchrec_ascend {

using bf16 = c10::BFloat16;

__attribute__((always_inline)) inline float to_f(float x) { return x; }
__attribute__((always_inline)) inline float to_f(bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
__attribute__((always_inline)) inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : r);
}
template <typename T>
__attribute__((always_inline)) inline T from_f(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return bf16(bf16_bits(x), bf16::from_bits());
  }
}
// p[i] as fp32 (bf16: its bits read as a uint16_t; GCC finds no vector type for a loop's loads
// of the c10::BFloat16 struct itself in some loops)
template <typename T>
__attribute__((always_inline)) inline float load_f(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else {
    const uint32_t u = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
}
// stores v at p[i] in T (bf16: its bits written as a uint16_t, a store GCC vectorises in every
// loop, where a c10::BFloat16 assignment can keep a loop scalar)
template <typename T>
__attribute__((always_inline)) inline void store_f(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, float>) {
    p[i] = v;
  } else {
    reinterpret_cast<uint16_t*>(p)[i] = bf16_bits(v);
  }
}

// f(float{}) for a float32 tensor, f(bf16{}) otherwise (the caller has checked it is one of the two)
template <typename Tensor, typename F>
void by_dtype(const Tensor& t, F&& f) {
  if (t.scalar_type() == c10::ScalarType::Float) f(float{});
  else f(bf16{});
}

}  // namespace torchrec_ascend
