// Row kernels of the fused HSTU layer elementwise ops (csrc/hstu_layer.cpp), AVX-512 versions
// (defined in hstu_x86.cpp, compiled for AVX-512; call only where isa() is AVX-512).  Rows
// [r0, r1) of row-major tensors; `bf16` arguments are bfloat16 bits, `f32` float; the dropout mask
// of element idx keeps it when layer_mask_hash(seed, idx) >= threshold (scale 1 / (1 - p)).
#pragma once

#include <cstdint>

#include "hstu_kernel.h"  // TRASC_HSTU_X86_ENGINES

namespace torchrec_ascend {
namespace hstu {

// murmur3's finalizer over (seed, idx): the one definition of the dropout mask
inline uint32_t layer_mask_hash(uint64_t seed, uint64_t idx) {
  uint32_t x = static_cast<uint32_t>(idx) * 0x9E3779B1u ^ static_cast<uint32_t>(idx >> 32) * 0x85EBCA77u;
  x += static_cast<uint32_t>(seed);
  x ^= static_cast<uint32_t>(seed >> 32) * 0xC2B2AE3Du;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

struct LayerDropout {
  uint64_t seed = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
  bool on = false;
};

namespace detail {
#if defined(TRASC_HSTU_X86_ENGINES)
// widths w4 of the four parts (u, v, q, k); bf16: is_bf16 selects the element type of h / outs
void avx512_silu_split(bool is_bf16, const void* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4,
                       void* const* outs);
void avx512_silu_split_bwd(bool is_bf16, const void* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4,
                           const void* const* grads, void* dh);
void avx512_norm_gate(bool is_bf16, const void* attn, const void* u, int64_t r0, int64_t r1, int64_t D,
                      const LayerDropout& drop, void* y, float* mean, float* rstd);
void avx512_norm_gate_bwd(bool is_bf16, const void* dy, const void* attn, const void* u, const float* mean,
                          const float* rstd, int64_t r0, int64_t r1, int64_t D, const LayerDropout& drop, void* dattn,
                          void* du);
void avx512_dropout(bool is_bf16, const void* x, int64_t r0, int64_t r1, int64_t D, const LayerDropout& drop, void* y);
// fp32 x -> y = LayerNorm(x) (no affine, eps 1e-6) in y's type; its backward: dx (fp32) from dy
// (plus add, fp32, where not null)
void avx512_ln_cast(bool is_bf16, const float* x, int64_t r0, int64_t r1, int64_t D, void* y, float* mean,
                    float* rstd);
void avx512_ln_cast_bwd(bool is_bf16, const void* dy, const float* x, const float* mean, const float* rstd,
                        const float* add, int64_t r0, int64_t r1, int64_t D, float* dx);
// out = dy (fp32 rows [r0, r1)) in out's type; part[c] = their column sums (fp32, row order)
void avx512_cast_colsum(bool is_bf16, const float* dy, int64_t r0, int64_t r1, int64_t D, void* out, float* part);
// dst [C, R] = src [R, C]^T for 16-bit elements, source rows [r0, r1) (r0 even)
void avx512_transpose16(const uint16_t* src, int64_t R, int64_t C, int64_t r0, int64_t r1, uint16_t* dst);
#endif
}  // namespace detail

}  // namespace hstu
}  // namespace torchrec_ascend
