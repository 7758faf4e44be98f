// Scalar math the HSTU kernels share, written so that GCC vectorises loops over it (no calls, no
// branches on data): exp for fp32 by range reduction and a polynomial.
#pragma once

#include <cstdint>
#include <cstring>

namespace torchrec_ascend {
namespace hstu {

// Cephes' expf: exp(x) = 2^n (1 + r + r^2 P(r)) with x = n ln2 + r, ln2 split in two constants
// (r = (x - n kExpLn2Hi) - n kExpLn2Lo) and P's coefficients, highest power first.
constexpr float kExpLn2Hi = 0.693359375f, kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp(x) for fp32: x = n ln2 + r (|r| <= ln2 / 2, the two-constant reduction), Cephes' degree-6
// polynomial (~1 ulp); x clamped to [-87, 88] (no-trapping-math lets GCC if-convert the clamp).
__attribute__((always_inline)) inline float exp_f32(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (x - n * kExpLn2Hi) - n * kExpLn2Lo;
  float p = kExpPoly[0];
  for (int k = 1; k < 6; ++k) p = p * r + kExpPoly[k];
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace hstu
}  // namespace torchrec_ascend
