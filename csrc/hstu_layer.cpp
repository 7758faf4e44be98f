// The elementwise part of one HSTU layer on CPU, fused (modules/hstu_fused.py wraps them in
// autograd functions; torch code is the fallback):
//
//   hstu_silu_split(h) -> u, v, q, k        silu of the UVQK projection, split into four
//                                           contiguous [T, width] tensors (one pass: no silu
//                                           tensor, no copies for the attention's inputs)
//   hstu_silu_split_bwd(du, dv, dq, dk, h) -> dh
//   hstu_norm_gate(attn, u, p, seed) -> y, mean, rstd
//                                           y = dropout_p(u * LayerNorm(attn)) (no affine, eps
//                                           1e-6, statistics in fp32), y in u's dtype
//   hstu_norm_gate_bwd(dy, attn, u, mean, rstd, p, seed) -> dattn, du
//   hstu_dropout(x, p, seed) -> y;  hstu_dropout_bwd(dy, p, seed) -> dx
//   hstu_input_rows(x, table, positions, scale, p, seed) -> y
//                                           y = dropout_p(table[positions] + scale x) of fp32
//                                           rows (the encoder's input: positions' embeddings),
//                                           one pass; the same mask as hstu_dropout's on that sum
//   hstu_input_rows_bwd(dy, positions, rows, scale, p, seed) -> dx, dtable
//   hstu_ln_cast(x, dtype) -> y, mean, rstd   y = LayerNorm(x) of fp32 rows (no affine, eps 1e-6)
//                                           written in dtype: under bf16 autocast the pre-norm of
//                                           the residual stream and its cast, in one pass
//   hstu_ln_cast_bwd(dy, x, mean, rstd, add) -> dx (fp32)   (+ add: the residual stream's gradient)
//   hstu_cast_colsum(dy, dtype) -> dy', sums  dy in dtype and its column sums, one pass
//   hstu_residual_add(x, o, bias) -> y       y = x + o + bias: the fp32 residual stream plus a
//                                           projection's output in the compute dtype, one pass
//   hstu_transpose(x) -> x^T                 contiguous, 2- or 4-byte elements, blocked
//
// Dropout masks come from a counter-based hash of (seed, element index) (murmur3's finalizer):
// the backward regenerates the mask instead of storing it, and the forward does not draw one
// random number per element from torch's generator (bernoulli_ cost ~8 ns per element here,
// more than the rest of the layer's elementwise work).  A kept element is scaled by 1 / (1 - p).
// float32 and bfloat16 tensors (every output in its input's dtype; arithmetic in fp32).
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "bf16_bits.h"
#include "hstu_layer_kernels.h"
#include "hstu_math.h"
#include "isa.h"
#include "parallel.h"
#include "tensor_checks.h"
#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

struct Dropout : hstu::LayerDropout {
  Dropout(double p, int64_t s) {
    TORCH_CHECK_VALUE(p >= 0.0 && p < 1.0, "p: dropout probability must be in [0, 1), got ", p);
    seed = static_cast<uint64_t>(s);
    on = p > 0.0;
    threshold = static_cast<uint32_t>(std::min(p * 4294967296.0, 4294967295.0));
    scale = on ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
  }
  // the factor of element idx: 0 or 1 / (1 - p)
  __attribute__((always_inline)) float factor(uint64_t idx) const {
    return !on ? 1.0f : (hstu::layer_mask_hash(seed, idx) >= threshold ? scale : 0.0f);
  }
};

#if defined(TRASC_HSTU_X86_ENGINES)
// hstu_x86.cpp is compiled for AVX-512 with BW / VL / DQ / BF16: its row kernels run only where the
// CPU has all of them (the avx512_bf16 attention engine's test); elsewhere the vector clones below
inline bool avx512() {
  static const bool usable = hstu::engine_usable(hstu::Engine::kAvx512Bf16);
  return usable && isa() == Isa::kAvx512;
}
#define TRASC_LAYER_AVX512(call) \
  if (avx512()) {                \
    call;                        \
  } else
#else
#define TRASC_LAYER_AVX512(call)
#endif

__attribute__((always_inline)) inline float sigmoid(float z) { return 1.0f / (1.0f + hstu::exp_f32(-z)); }

// Row-range bodies (templates, inlined into the per-dtype functions below, which GCC clones for
// AVX-512 and AVX2 and picks at load time: TRASC_VECTOR_CLONES, isa.h).

// ------------------------------------------------------------------------- silu + split

template <typename T>
__attribute__((always_inline)) inline void silu_split_range(const T* h, int64_t r0, int64_t r1, int64_t width,
                                                            const int64_t* w4, T* const* outs) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* hr = h + r * width;
    int64_t c0 = 0;
    for (int part = 0; part < 4; ++part) {
      T* o = outs[part] + r * w4[part];
      const T* src = hr + c0;
      for (int64_t c = 0; c < w4[part]; ++c) {
        const float z = to_f(src[c]);
        o[c] = from_f<T>(z * sigmoid(z));
      }
      c0 += w4[part];
    }
  }
}

template <typename T>
__attribute__((always_inline)) inline void silu_split_bwd_range(const T* h, int64_t r0, int64_t r1, int64_t width,
                                                                const int64_t* w4, const T* const* grads, T* dh) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* hr = h + r * width;
    T* dr = dh + r * width;
    int64_t c0 = 0;
    for (int part = 0; part < 4; ++part) {
      const T* g = grads[part] + r * w4[part];
      for (int64_t c = 0; c < w4[part]; ++c) {
        const float z = to_f(hr[c0 + c]);
        const float sg = sigmoid(z);
        dr[c0 + c] = from_f<T>(to_f(g[c]) * sg * (1.0f + z * (1.0f - sg)));
      }
      c0 += w4[part];
    }
  }
}

// ------------------------------------------------------------------------- LayerNorm rows

constexpr float kEps = 1e-6f;

// 16 partial sums of f(c), c < D: a reduction GCC vectorises without reassociating one accumulator
template <typename F>
__attribute__((always_inline)) inline float sum16(int64_t D, F&& f) {
  float acc[16] = {0.0f};
  int64_t c = 0;
  for (; c + 16 <= D; c += 16)
    for (int l = 0; l < 16; ++l) acc[l] += f(c + l);
  for (; c < D; ++c) acc[0] += f(c);
  float s = 0.0f;
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}

// LayerNorm (no affine, eps 1e-6) of one row of D values x(c): its mean and 1 / sqrt(var + eps),
// two passes (no cancellation)
template <typename X>
__attribute__((always_inline)) inline void row_moments(int64_t D, X&& x, float& mean, float& rstd) {
  const float m = sum16(D, x) / static_cast<float>(D);
  const float var = sum16(D, [&](int64_t c) { return (x(c) - m) * (x(c) - m); }) / static_cast<float>(D);
  mean = m;
  rstd = 1.0f / std::sqrt(var + kEps);
}

// ------------------------------------------------------------------------- norm + gate + dropout

template <typename T>
__attribute__((always_inline)) inline void norm_gate_range(const T* attn, const T* u, int64_t r0, int64_t r1,
                                                           int64_t D, const Dropout& drop, T* y, float* mean,
                                                           float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* a = attn + r * D;
    row_moments(D, [&](int64_t c) { return to_f(a[c]); }, mean[r], rstd[r]);
    const float m = mean[r], rs = rstd[r];
    const T* ur = u + r * D;
    T* yr = y + r * D;
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(D);
    for (int64_t c = 0; c < D; ++c)
      yr[c] = from_f<T>(to_f(ur[c]) * (to_f(a[c]) - m) * rs * drop.factor(base + static_cast<uint64_t>(c)));
  }
}

template <typename T>
__attribute__((always_inline)) inline void norm_gate_bwd_range(const T* dy, const T* attn, const T* u,
                                                               const float* mean, const float* rstd, int64_t r0,
                                                               int64_t r1, int64_t D, const Dropout& drop, T* dattn,
                                                               T* du) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* a = attn + r * D;
    const T* ur = u + r * D;
    const T* g = dy + r * D;
    const float m = mean[r], rs = rstd[r];
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(D);
    // g' = dy * mask / (1 - p); du = g' * a_hat; d a_hat = g' * u
    float sum_d = 0.0f, sum_dx = 0.0f;
    T* dur = du + r * D;
    for (int64_t c = 0; c < D; ++c) {
      const float gm = to_f(g[c]) * drop.factor(base + static_cast<uint64_t>(c));
      const float xh = (to_f(a[c]) - m) * rs;
      dur[c] = from_f<T>(gm * xh);
      const float dx = gm * to_f(ur[c]);
      sum_d += dx;
      sum_dx += dx * xh;
    }
    const float md = sum_d / static_cast<float>(D), mdx = sum_dx / static_cast<float>(D);
    T* da = dattn + r * D;
    for (int64_t c = 0; c < D; ++c) {
      const float gm = to_f(g[c]) * drop.factor(base + static_cast<uint64_t>(c));
      const float xh = (to_f(a[c]) - m) * rs;
      da[c] = from_f<T>(rs * (gm * to_f(ur[c]) - md - xh * mdx));
    }
  }
}

// ------------------------------------------------------------------------- dropout

template <typename T>
__attribute__((always_inline)) inline void dropout_range(const T* x, int64_t r0, int64_t r1, int64_t D,
                                                         const Dropout& drop, T* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(D);
    for (int64_t c = 0; c < D; ++c)
      y[r * D + c] = from_f<T>(to_f(x[r * D + c]) * drop.factor(base + static_cast<uint64_t>(c)));
  }
}

// ------------------------------------------------------------------------- LayerNorm of fp32 rows, cast

template <typename T>
__attribute__((always_inline)) inline void ln_cast_range(const float* x, int64_t r0, int64_t r1, int64_t D, T* y,
                                                         float* mean, float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    row_moments(D, [&](int64_t c) { return xr[c]; }, mean[r], rstd[r]);
    const float m = mean[r], rs = rstd[r];
    T* yr = y + r * D;
    for (int64_t c = 0; c < D; ++c) yr[c] = from_f<T>((xr[c] - m) * rs);
  }
}

template <typename T>
__attribute__((always_inline)) inline void ln_cast_bwd_range(const T* dy, const float* x, const float* mean,
                                                             const float* rstd, const float* add, int64_t r0,
                                                             int64_t r1, int64_t D, float* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const T* g = dy + r * D;
    const float m = mean[r], rs = rstd[r];
    const float md = sum16(D, [&](int64_t c) { return to_f(g[c]); }) / static_cast<float>(D);
    const float mdx = sum16(D, [&](int64_t c) { return to_f(g[c]) * (xr[c] - m) * rs; }) / static_cast<float>(D);
    float* d = dx + r * D;
    if (add) {
      const float* a = add + r * D;
      for (int64_t c = 0; c < D; ++c) d[c] = a[c] + rs * (to_f(g[c]) - md - (xr[c] - m) * rs * mdx);
    } else {
      for (int64_t c = 0; c < D; ++c) d[c] = rs * (to_f(g[c]) - md - (xr[c] - m) * rs * mdx);
    }
  }
}

// out = dy in out's type and part[c] = sum of dy[r, c] over rows [r0, r1) (fp32, in row order)
template <typename O>
__attribute__((always_inline)) inline void cast_colsum_range(const float* dy, int64_t r0, int64_t r1, int64_t D,
                                                             O* out, float* part) {
  for (int64_t c = 0; c < D; ++c) part[c] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float* g = dy + r * D;
    O* o = out + r * D;
    for (int64_t c = 0; c < D; ++c) {
      part[c] += g[c];
      o[c] = O(g[c]);
    }
  }
}

// the per-dtype (vector-cloned) instances
#define TRA_LAYER_INSTANCES(T, S)                                                                                    \
  TRASC_VECTOR_CLONES void silu_split_##S(const T* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4,      \
                                       T* const* outs) {                                                            \
    silu_split_range<T>(h, r0, r1, width, w4, outs);                                                               \
  }                                                                                                                 \
  TRASC_VECTOR_CLONES void silu_split_bwd_##S(const T* h, int64_t r0, int64_t r1, int64_t width, const int64_t* w4,  \
                                           const T* const* grads, T* dh) {                                          \
    silu_split_bwd_range<T>(h, r0, r1, width, w4, grads, dh);                                                      \
  }                                                                                                                 \
  TRASC_VECTOR_CLONES void norm_gate_##S(const T* attn, const T* u, int64_t r0, int64_t r1, int64_t D,               \
                                      const Dropout& drop, T* y, float* mean, float* rstd) {                        \
    norm_gate_range<T>(attn, u, r0, r1, D, drop, y, mean, rstd);                                                    \
  }                                                                                                                 \
  TRASC_VECTOR_CLONES void norm_gate_bwd_##S(const T* dy, const T* attn, const T* u, const float* mean,              \
                                          const float* rstd, int64_t r0, int64_t r1, int64_t D, const Dropout& drop, \
                                          T* dattn, T* du) {                                                        \
    norm_gate_bwd_range<T>(dy, attn, u, mean, rstd, r0, r1, D, drop, dattn, du);                                   \
  }                                                                                                                 \
  TRASC_VECTOR_CLONES void dropout_##S(const T* x, int64_t r0, int64_t r1, int64_t D, const Dropout& drop, T* y) {    \
    dropout_range<T>(x, r0, r1, D, drop, y);                                                                        \
  }                                                                                                                 \
  TRASC_VECTOR_CLONES void ln_cast_##S(const float* x, int64_t r0, int64_t r1, int64_t D, T* y, float* mean,          \
                                    float* rstd) {                                                                  \
    ln_cast_range<T>(x, r0, r1, D, y, mean, rstd);                                                                  \
  }                                                                                                                 \
  TRASC_VECTOR_CLONES void ln_cast_bwd_##S(const T* dy, const float* x, const float* mean, const float* rstd,         \
                                        const float* add, int64_t r0, int64_t r1, int64_t D, float* dx) {           \
    ln_cast_bwd_range<T>(dy, x, mean, rstd, add, r0, r1, D, dx);                                                    \
  }                                                                                                                 \
  TRASC_VECTOR_CLONES void cast_colsum_##S(const float* dy, int64_t r0, int64_t r1, int64_t D, T* out, float* part) { \
    cast_colsum_range<T>(dy, r0, r1, D, out, part);                                                                 \
  }
TRA_LAYER_INSTANCES(float, f32)
TRA_LAYER_INSTANCES(bf16, bf16)
#undef TRA_LAYER_INSTANCES

// overloads picking the instance by pointer type
inline void silu_split(const float* h, int64_t r0, int64_t r1, int64_t w, const int64_t* w4, float* const* o) {
  silu_split_f32(h, r0, r1, w, w4, o);
}
inline void silu_split(const bf16* h, int64_t r0, int64_t r1, int64_t w, const int64_t* w4, bf16* const* o) {
  silu_split_bf16(h, r0, r1, w, w4, o);
}
inline void silu_split_bwd(const float* h, int64_t r0, int64_t r1, int64_t w, const int64_t* w4,
                           const float* const* g, float* dh) {
  silu_split_bwd_f32(h, r0, r1, w, w4, g, dh);
}
inline void silu_split_bwd(const bf16* h, int64_t r0, int64_t r1, int64_t w, const int64_t* w4, const bf16* const* g,
                           bf16* dh) {
  silu_split_bwd_bf16(h, r0, r1, w, w4, g, dh);
}
inline void norm_gate(const float* a, const float* u, int64_t r0, int64_t r1, int64_t D, const Dropout& d, float* y,
                      float* m, float* rs) {
  norm_gate_f32(a, u, r0, r1, D, d, y, m, rs);
}
inline void norm_gate(const bf16* a, const bf16* u, int64_t r0, int64_t r1, int64_t D, const Dropout& d, bf16* y,
                      float* m, float* rs) {
  norm_gate_bf16(a, u, r0, r1, D, d, y, m, rs);
}
inline void norm_gate_bwd(const float* dy, const float* a, const float* u, const float* m, const float* rs, int64_t r0,
                          int64_t r1, int64_t D, const Dropout& d, float* da, float* du) {
  norm_gate_bwd_f32(dy, a, u, m, rs, r0, r1, D, d, da, du);
}
inline void norm_gate_bwd(const bf16* dy, const bf16* a, const bf16* u, const float* m, const float* rs, int64_t r0,
                          int64_t r1, int64_t D, const Dropout& d, bf16* da, bf16* du) {
  norm_gate_bwd_bf16(dy, a, u, m, rs, r0, r1, D, d, da, du);
}
inline void dropout(const float* x, int64_t r0, int64_t r1, int64_t D, const Dropout& d, float* y) {
  dropout_f32(x, r0, r1, D, d, y);
}
inline void dropout(const bf16* x, int64_t r0, int64_t r1, int64_t D, const Dropout& d, bf16* y) {
  dropout_bf16(x, r0, r1, D, d, y);
}

inline void ln_cast(const float* x, int64_t r0, int64_t r1, int64_t D, float* y, float* m, float* rs) {
  ln_cast_f32(x, r0, r1, D, y, m, rs);
}
inline void ln_cast(const float* x, int64_t r0, int64_t r1, int64_t D, bf16* y, float* m, float* rs) {
  ln_cast_bf16(x, r0, r1, D, y, m, rs);
}
inline void ln_cast_bwd(const float* dy, const float* x, const float* m, const float* rs, const float* add, int64_t r0,
                        int64_t r1, int64_t D, float* dx) {
  ln_cast_bwd_f32(dy, x, m, rs, add, r0, r1, D, dx);
}
inline void ln_cast_bwd(const bf16* dy, const float* x, const float* m, const float* rs, const float* add, int64_t r0,
                        int64_t r1, int64_t D, float* dx) {
  ln_cast_bwd_bf16(dy, x, m, rs, add, r0, r1, D, dx);
}
inline void cast_colsum(const float* dy, int64_t r0, int64_t r1, int64_t D, float* out, float* part) {
  cast_colsum_f32(dy, r0, r1, D, out, part);
}
inline void cast_colsum(const float* dy, int64_t r0, int64_t r1, int64_t D, bf16* out, float* part) {
  cast_colsum_bf16(dy, r0, r1, D, out, part);
}

}  // namespace

std::vector<at::Tensor> hstu_silu_split(const at::Tensor& h, std::vector<int64_t> widths) {
  check_cpu_tensor("h", h, 2, {at::kFloat, at::kBFloat16});
  TORCH_CHECK_VALUE(widths.size() == 4, "widths: expected 4 (u, v, q, k), got ", widths.size());
  int64_t total = 0;
  for (int64_t w : widths) {
    TORCH_CHECK_VALUE(w >= 0, "widths: must be >= 0, got ", w);
    total += w;
  }
  TORCH_CHECK_VALUE(total == h.size(1), "widths: sum ", total, " must equal h's columns ", h.size(1));
  at::Tensor hc = h.contiguous();
  std::vector<at::Tensor> outs;
  for (int64_t w : widths) outs.push_back(at::empty({h.size(0), w}, h.options()));
  by_dtype(h, [&](auto tag) {
    using T = decltype(tag);
    T* o[4] = {outs[0].data_ptr<T>(), outs[1].data_ptr<T>(), outs[2].data_ptr<T>(), outs[3].data_ptr<T>()};
    const T* hp = hc.data_ptr<T>();
    over_rows(h.size(0), total, [&](int64_t r0, int64_t r1) {
      TRASC_LAYER_AVX512(hstu::detail::avx512_silu_split(!std::is_same_v<T, float>, hp, r0, r1, total,
                                                         widths.data(), reinterpret_cast<void* const*>(o)))
      silu_split(hp, r0, r1, total, widths.data(), o);
    });
  });
  return outs;
}

at::Tensor hstu_silu_split_bwd(const std::vector<at::Tensor>& grads, const at::Tensor& h) {
  check_cpu_tensor("h", h, 2, {at::kFloat, at::kBFloat16});
  TORCH_CHECK_VALUE(grads.size() == 4, "grads: expected 4 (du, dv, dq, dk), got ", grads.size());
  std::vector<at::Tensor> gc;
  int64_t w4[4], total = 0;
  for (int i = 0; i < 4; ++i) {
    const at::Tensor& g = grads[i];
    TORCH_CHECK_VALUE(g.dim() == 2 && g.size(0) == h.size(0), "grads[", i, "]: expected [", h.size(0), ", w], got ",
                      g.sizes());
    gc.push_back(g.to(h.scalar_type()).contiguous());
    w4[i] = g.size(1);
    total += w4[i];
  }
  TORCH_CHECK_VALUE(total == h.size(1), "grads: widths sum ", total, " must equal h's columns ", h.size(1));
  at::Tensor hc = h.contiguous();
  at::Tensor dh = at::empty_like(hc);
  by_dtype(h, [&](auto tag) {
    using T = decltype(tag);
    const T* g[4] = {gc[0].data_ptr<T>(), gc[1].data_ptr<T>(), gc[2].data_ptr<T>(), gc[3].data_ptr<T>()};
    const T* hp = hc.data_ptr<T>();
    T* d = dh.data_ptr<T>();
    over_rows(h.size(0), total, [&](int64_t r0, int64_t r1) {
      TRASC_LAYER_AVX512(hstu::detail::avx512_silu_split_bwd(!std::is_same_v<T, float>, hp, r0, r1, total, w4,
                                                             reinterpret_cast<const void* const*>(g), d))
      silu_split_bwd(hp, r0, r1, total, w4, g, d);
    });
  });
  return dh;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> hstu_norm_gate(const at::Tensor& attn, const at::Tensor& u, double p,
                                                              int64_t seed) {
  check_cpu_tensor("attn", attn, 2, {at::kFloat, at::kBFloat16});
  check_cpu_tensor("u", u, 2, {at::kFloat, at::kBFloat16});
  check_same_shape("u", u, "attn", attn);
  const Dropout drop(p, seed);
  at::Tensor uc = u.contiguous(), ac = attn.to(u.scalar_type()).contiguous();
  at::Tensor y = at::empty_like(uc);
  at::Tensor mean = at::empty({attn.size(0)}, attn.options().dtype(at::kFloat)), rstd = at::empty_like(mean);
  by_dtype(uc, [&](auto tag) {
    using T = decltype(tag);
    const T *a = ac.data_ptr<T>(), *up = uc.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    float *mp = mean.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    over_rows(ac.size(0), ac.size(1), [&](int64_t r0, int64_t r1) {
      TRASC_LAYER_AVX512(
          hstu::detail::avx512_norm_gate(!std::is_same_v<T, float>, a, up, r0, r1, ac.size(1), drop, yp, mp, rp))
      norm_gate(a, up, r0, r1, ac.size(1), drop, yp, mp, rp);
    });
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor> hstu_norm_gate_bwd(const at::Tensor& dy, const at::Tensor& attn, const at::Tensor& u,
                                                      const at::Tensor& mean, const at::Tensor& rstd, double p,
                                                      int64_t seed) {
  check_cpu_tensor("attn", attn, 2, {at::kFloat, at::kBFloat16});
  check_cpu_tensor("u", u, 2, {at::kFloat, at::kBFloat16});
  check_same_shape("u", u, "attn", attn);
  check_same_shape("dy", dy, "u", u);
  check_cpu_tensor("mean", mean, 1, {at::kFloat}, attn.size(0));
  check_cpu_tensor("rstd", rstd, 1, {at::kFloat}, attn.size(0));
  const Dropout drop(p, seed);
  at::Tensor uc = u.contiguous(), ac = attn.to(u.scalar_type()).contiguous(), gc = dy.to(u.scalar_type()).contiguous();
  at::Tensor mc = mean.contiguous(), rc = rstd.contiguous();
  at::Tensor da = at::empty_like(ac), du = at::empty_like(uc);
  by_dtype(uc, [&](auto tag) {
    using T = decltype(tag);
    const T *g = gc.data_ptr<T>(), *a = ac.data_ptr<T>(), *up = uc.data_ptr<T>();
    const float *mp = mc.data_ptr<float>(), *rp = rc.data_ptr<float>();
    T *dap = da.data_ptr<T>(), *dup = du.data_ptr<T>();
    over_rows(ac.size(0), ac.size(1), [&](int64_t r0, int64_t r1) {
      TRASC_LAYER_AVX512(hstu::detail::avx512_norm_gate_bwd(!std::is_same_v<T, float>, g, a, up, mp, rp, r0, r1,
                                                             ac.size(1), drop, dap, dup))
      norm_gate_bwd(g, a, up, mp, rp, r0, r1, ac.size(1), drop, dap, dup);
    });
  });
  return {da.to(attn.scalar_type()), du};
}

// ------------------------------------------------------------------------- input rows

TRASC_VECTOR_CLONES void input_rows(const float* x, const float* table, const int64_t* pos, int64_t r0, int64_t r1,
                                    int64_t D, float scale, const Dropout& drop, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* t = table + pos[r] * D;
    const float* xr = x + r * D;
    float* yr = y + r * D;
    const uint64_t base = static_cast<uint64_t>(r * D);
    for (int64_t c = 0; c < D; ++c) yr[c] = (t[c] + scale * xr[c]) * drop.factor(base + c);
  }
}

// rows in order on one thread: rows of different sequences add into the same table rows
TRASC_VECTOR_CLONES void input_rows_bwd(const float* dy, const int64_t* pos, int64_t T, int64_t D, float scale,
                                        const Dropout& drop, float* dx, float* dtable) {
  for (int64_t r = 0; r < T; ++r) {
    float* dt = dtable + pos[r] * D;
    const float* g = dy + r * D;
    float* d = dx + r * D;
    const uint64_t base = static_cast<uint64_t>(r * D);
    for (int64_t c = 0; c < D; ++c) {
      const float m = g[c] * drop.factor(base + c);
      d[c] = scale * m;
      dt[c] += m;
    }
  }
}

void check_positions(const at::Tensor& positions, int64_t T, int64_t rows) {
  check_cpu_tensor("positions", positions, 1, {at::kLong}, T);
  if (T == 0) return;
  const at::Tensor lo = positions.min(), hi = positions.max();
  TORCH_CHECK_VALUE(lo.item<int64_t>() >= 0 && hi.item<int64_t>() < rows, "positions: must be in [0, ", rows,
                    ") (the table's rows), got [", lo.item<int64_t>(), ", ", hi.item<int64_t>(), "]");
}

at::Tensor hstu_input_rows(const at::Tensor& x, const at::Tensor& table, const at::Tensor& positions, double scale,
                           double p, int64_t seed) {
  check_cpu_tensor("x", x, 2, {at::kFloat});
  check_cpu_tensor("table", table, 2, {at::kFloat});
  TORCH_CHECK_VALUE(table.size(1) == x.size(1), "table: expected ", x.size(1), " columns (x's), got ",
                    table.size(1));
  const int64_t T = x.size(0), D = x.size(1);
  check_positions(positions, T, table.size(0));
  const Dropout drop(p, seed);
  const at::Tensor xc = x.contiguous(), tc = table.contiguous(), pc = positions.contiguous();
  at::Tensor y = at::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  const float* tp = tc.data_ptr<float>();
  const int64_t* pp = pc.data_ptr<int64_t>();
  float* yp = y.data_ptr<float>();
  const float s = static_cast<float>(scale);
  over_rows(T, D, [&](int64_t r0, int64_t r1) { input_rows(xp, tp, pp, r0, r1, D, s, drop, yp); });
  return y;
}

std::tuple<at::Tensor, at::Tensor> hstu_input_rows_bwd(const at::Tensor& dy, const at::Tensor& positions,
                                                       int64_t rows, double scale, double p, int64_t seed) {
  check_cpu_tensor("dy", dy, 2, {at::kFloat});
  const int64_t T = dy.size(0), D = dy.size(1);
  check_positions(positions, T, rows);
  const Dropout drop(p, seed);
  const at::Tensor gc = dy.contiguous(), pc = positions.contiguous();
  at::Tensor dx = at::empty_like(gc);
  at::Tensor dtable = at::zeros({rows, D}, gc.options());
  input_rows_bwd(gc.data_ptr<float>(), pc.data_ptr<int64_t>(), T, D, static_cast<float>(scale), drop,
                 dx.data_ptr<float>(), dtable.data_ptr<float>());
  return {dx, dtable};
}

at::Tensor hstu_dropout(const at::Tensor& x, double p, int64_t seed) {
  check_cpu_tensor("x", x, 2, {at::kFloat, at::kBFloat16});
  const Dropout drop(p, seed);
  at::Tensor xc = x.contiguous(), y = at::empty_like(xc);
  by_dtype(xc, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = xc.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    over_rows(xc.size(0), xc.size(1), [&](int64_t r0, int64_t r1) {
      TRASC_LAYER_AVX512(hstu::detail::avx512_dropout(!std::is_same_v<T, float>, xp, r0, r1, xc.size(1), drop, yp))
      dropout(xp, r0, r1, xc.size(1), drop, yp);
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> hstu_ln_cast(const at::Tensor& x, at::ScalarType dtype) {
  check_cpu_tensor("x", x, 2, {at::kFloat});
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16, "dtype: must be float32 or bfloat16, got ", dtype);
  at::Tensor xc = x.contiguous();
  const int64_t T = xc.size(0), D = xc.size(1);
  at::Tensor y = at::empty({T, D}, xc.options().dtype(dtype));
  at::Tensor mean = at::empty({T}, xc.options()), rstd = at::empty_like(mean);
  by_dtype(y, [&](auto tag) {
    using O = decltype(tag);
    const float* xp = xc.data_ptr<float>();
    O* yp = y.data_ptr<O>();
    float *mp = mean.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    over_rows(T, D, [&](int64_t r0, int64_t r1) {
      TRASC_LAYER_AVX512(hstu::detail::avx512_ln_cast(!std::is_same_v<O, float>, xp, r0, r1, D, yp, mp, rp))
      ln_cast(xp, r0, r1, D, yp, mp, rp);
    });
  });
  return {y, mean, rstd};
}

at::Tensor hstu_ln_cast_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
                            const c10::optional<at::Tensor>& add) {
  check_cpu_tensor("dy", dy, 2, {at::kFloat, at::kBFloat16});
  check_cpu_tensor("x", x, 2, {at::kFloat});
  check_same_shape("dy", dy, "x", x);
  check_cpu_tensor("mean", mean, 1, {at::kFloat}, x.size(0));
  check_cpu_tensor("rstd", rstd, 1, {at::kFloat}, x.size(0));
  at::Tensor xc = x.contiguous(), gc = dy.contiguous(), mc = mean.contiguous(), rc = rstd.contiguous(), ac;
  if (add.has_value() && add->defined()) {
    check_cpu_tensor("add", *add, 2, {at::kFloat});
    check_same_shape("add", *add, "x", x);
    ac = add->contiguous();
  }
  const int64_t T = xc.size(0), D = xc.size(1);
  at::Tensor dx = at::empty_like(xc);
  const float* ap = ac.defined() ? ac.data_ptr<float>() : nullptr;
  by_dtype(gc, [&](auto tag) {
    using G = decltype(tag);
    const G* g = gc.data_ptr<G>();
    const float *xp = xc.data_ptr<float>(), *mp = mc.data_ptr<float>(), *rp = rc.data_ptr<float>();
    float* d = dx.data_ptr<float>();
    over_rows(T, D, [&](int64_t r0, int64_t r1) {
      TRASC_LAYER_AVX512(
          hstu::detail::avx512_ln_cast_bwd(!std::is_same_v<G, float>, g, xp, mp, rp, ap, r0, r1, D, d))
      ln_cast_bwd(g, xp, mp, rp, ap, r0, r1, D, d);
    });
  });
  return dx;
}

// Rows per block of hstu_cast_colsum's sums: each block sums in fp32 in row order, the blocks are
// added in double in block order (the same result on any number of threads)
constexpr int64_t kColsumRows = 256;

std::tuple<at::Tensor, at::Tensor> hstu_cast_colsum(const at::Tensor& dy, at::ScalarType dtype) {
  check_cpu_tensor("dy", dy, 2, {at::kFloat});
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16, "dtype: must be float32 or bfloat16, got ", dtype);
  at::Tensor gc = dy.contiguous();
  const int64_t T = gc.size(0), D = gc.size(1), nb = (T + kColsumRows - 1) / kColsumRows;
  at::Tensor out = at::empty({T, D}, gc.options().dtype(dtype));
  at::Tensor parts = at::empty({nb, D}, gc.options());
  by_dtype(out, [&](auto tag) {
    using O = decltype(tag);
    const float* g = gc.data_ptr<float>();
    O* op = out.data_ptr<O>();
    float* pp = parts.data_ptr<float>();
    parallel_over(nb, T * D, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * kColsumRows, r1 = std::min(T, r0 + kColsumRows);
        TRASC_LAYER_AVX512(hstu::detail::avx512_cast_colsum(!std::is_same_v<O, float>, g, r0, r1, D, op, pp + b * D))
        cast_colsum(g, r0, r1, D, op, pp + b * D);
      }
    });
  });
  at::Tensor total = at::zeros({D}, gc.options().dtype(at::kDouble));
  double* tp = total.data_ptr<double>();
  const float* pp = parts.data_ptr<float>();
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < D; ++c) tp[c] += pp[b * D + c];
  return {out, total.to(at::kFloat)};
}

namespace {
// y = x + o + b over rows [r0, r1): the fp32 residual plus a projection's output (its dtype) and
// the fp32 bias (b may be null)
template <typename O>
TRASC_VECTOR_CLONES void residual_add_rows(const float* x, const O* o, const float* b, int64_t r0, int64_t r1,
                                        int64_t D, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    const O* orow = o + r * D;
    float* yr = y + r * D;
    if (b) {
      for (int64_t c = 0; c < D; ++c) yr[c] = xr[c] + (to_f(orow[c]) + b[c]);
    } else {
      for (int64_t c = 0; c < D; ++c) yr[c] = xr[c] + to_f(orow[c]);
    }
  }
}

// dst[c, r] = src[r, c] over rows [r0, r1), in 32 x 32 blocks (both sides' lines stay in L1)
template <typename E>
TRASC_VECTOR_CLONES void transpose_rows(const E* src, int64_t R, int64_t C, int64_t r0, int64_t r1, E* dst) {
  constexpr int64_t kB = 32;
  for (int64_t rb = r0; rb < r1; rb += kB) {
    const int64_t re = std::min(rb + kB, r1);
    for (int64_t cb = 0; cb < C; cb += kB) {
      const int64_t ce = std::min(cb + kB, C);
      for (int64_t c = cb; c < ce; ++c)
        for (int64_t r = rb; r < re; ++r) dst[c * R + r] = src[r * C + c];
    }
  }
}
}  // namespace

at::Tensor hstu_transpose(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.device().is_cpu() && x.dim() == 2, "x: expected a 2-D CPU tensor, got ", x.sizes(), " on ",
                    x.device());
  TORCH_CHECK_VALUE(x.element_size() == 2 || x.element_size() == 4, "x: element size must be 2 or 4 bytes, got ",
                    x.element_size(), " (", x.scalar_type(), ")");
  at::Tensor xc = x.contiguous();
  const int64_t R = xc.size(0), C = xc.size(1);
  at::Tensor y = at::empty({C, R}, xc.options());
  if (xc.numel() == 0) return y;
  // row ranges of the source (whole 32-row blocks: the AVX-512 body pairs rows from an even start)
  const int64_t blocks = (R + 31) / 32;
  over_rows(blocks, 32 * C, [&](int64_t b0, int64_t b1) {
    const int64_t r0 = b0 * 32, r1 = std::min(R, b1 * 32);
    if (xc.element_size() == 2) {
      const uint16_t* sp = static_cast<const uint16_t*>(xc.data_ptr());
      uint16_t* dp = static_cast<uint16_t*>(y.data_ptr());
      TRASC_LAYER_AVX512(hstu::detail::avx512_transpose16(sp, R, C, r0, r1, dp))
      transpose_rows(sp, R, C, r0, r1, dp);
    } else
      transpose_rows(static_cast<const uint32_t*>(xc.data_ptr()), R, C, r0, r1, static_cast<uint32_t*>(y.data_ptr()));
  });
  return y;
}

at::Tensor hstu_residual_add(const at::Tensor& x, const at::Tensor& o, const c10::optional<at::Tensor>& bias) {
  check_cpu_tensor("x", x, 2, {at::kFloat});
  check_cpu_tensor("o", o, 2, {at::kFloat, at::kBFloat16});
  check_same_shape("o", o, "x", x);
  at::Tensor xc = x.contiguous(), oc = o.contiguous(), bc;
  const int64_t T = xc.size(0), D = xc.size(1);
  if (bias.has_value() && bias->defined()) {
    bc = contiguous_cpu_tensor("bias", *bias, 1, {at::kFloat}, D);
  }
  at::Tensor y = at::empty_like(xc);
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  by_dtype(oc, [&](auto tag) {
    using O = decltype(tag);
    const float* xp = xc.data_ptr<float>();
    const O* op = oc.data_ptr<O>();
    float* yp = y.data_ptr<float>();
    over_rows(T, D, [&](int64_t r0, int64_t r1) { residual_add_rows(xp, op, bp, r0, r1, D, yp); });
  });
  return y;
}

void bind_hstu_layer(pybind11::module& m) {
  m.def("hstu_residual_add", &hstu_residual_add, "x + o + bias (fp32 x and bias, o fp32 / bf16) -> fp32, one pass",
        pybind11::arg("x"), pybind11::arg("o"), pybind11::arg("bias") = pybind11::none());
  m.def("hstu_transpose", &hstu_transpose, "x^T as a contiguous tensor (2- or 4-byte elements), blocked");
  m.def("hstu_ln_cast", &hstu_ln_cast,
        "(y, mean, rstd): y = LayerNorm(x) of fp32 rows (no affine, eps 1e-6) written in dtype (fp32 / bf16)");
  m.def("hstu_ln_cast_bwd", &hstu_ln_cast_bwd,
        "dx (fp32) of hstu_ln_cast from dy (fp32 / bf16), plus add (fp32, e.g. the residual's gradient) when given",
        pybind11::arg("dy"), pybind11::arg("x"), pybind11::arg("mean"), pybind11::arg("rstd"),
        pybind11::arg("add") = pybind11::none());
  m.def("hstu_cast_colsum", &hstu_cast_colsum,
        "(dy in dtype, dy's column sums in fp32) of fp32 rows dy, one pass (a residual's backward: the output's "
        "gradient for a half GEMM and its bias's gradient)");
  m.def("hstu_silu_split", &hstu_silu_split, "u, v, q, k = split(silu(h), widths) as contiguous tensors (fused)");
  m.def("hstu_silu_split_bwd", &hstu_silu_split_bwd, "dh of hstu_silu_split from (du, dv, dq, dk) and h");
  m.def("hstu_norm_gate", &hstu_norm_gate,
        "(y, mean, rstd): y = dropout_p(u * LayerNorm(attn)), no affine, eps 1e-6, mask from (seed, index)");
  m.def("hstu_norm_gate_bwd", &hstu_norm_gate_bwd, "(dattn, du) of hstu_norm_gate");
  m.def("hstu_input_rows", &hstu_input_rows,
        "dropout_p(table[positions] + scale x) of fp32 rows, one pass (hstu_dropout's mask on that sum)");
  m.def("hstu_input_rows_bwd", &hstu_input_rows_bwd,
        "(dx, dtable) of hstu_input_rows from dy: dx = scale m dy, dtable[positions[r]] += m dy[r] (rows in order)");
  m.def("hstu_dropout", &hstu_dropout,
        "x * mask / (1 - p), mask from (seed, index) (its own backward: the same call on the gradient)");
}

}  // namespace torchrec_ascend
