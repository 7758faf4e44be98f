// CPU kernels for the sparse-feature ops on TorchRec's training path (ops/sparse.py):
// cumsums, permutes of keyed jagged batches, block bucketize, bounds check, segment sums,
// KJT index select and the pooled-embedding permutes.  Semantics are fbgemm's (the torch
// reference in ops/reference/sparse.py is the spec; tests compare both with fbgemm-gpu-cpu).
//
// Structure: every kernel first computes segment offsets (cheap, sequential over segments),
// then moves data with one memcpy per segment, parallel over segments (parallel_over in
// parallel.h: small inputs stay on the calling thread).  Values of any dtype are moved as bytes.
// Inconsistent structure (negative lengths, sums that do not match the values) is a
// ValueError, never an out-of-bounds access.
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "direct.h"
#include "interleaved_timing.h"
#include "isa.h"
#include "parallel.h"
#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

// f(index_t{}) for an int32/int64 tensor; ValueError naming `arg` otherwise.
template <typename F>
void dispatch_index(const at::Tensor& t, const char* arg, F&& f) {
  if (t.scalar_type() == at::kInt) {
    f(int32_t{});
  } else if (t.scalar_type() == at::kLong) {
    f(int64_t{});
  } else {
    TORCH_CHECK_VALUE(false, arg, ": expected int32 or int64, got ", t.scalar_type());
  }
}

// An int32/int64 tensor as int64 values.
std::vector<int64_t> as_i64(const at::Tensor& t, const char* arg) {
  std::vector<int64_t> out(t.numel());
  auto c = t.contiguous();
  dispatch_index(c, arg, [&](auto z) {
    using index_t = decltype(z);
    const index_t* p = c.data_ptr<index_t>();
    std::copy(p, p + c.numel(), out.begin());
  });
  return out;
}

// The entries of an int32/int64 tensor as int64: the tensor's own memory when it is a contiguous
// int64 tensor (no copy, no allocation), else a converted copy.  ValueError naming `arg` for
// other dtypes.
class I64Span {
 public:
  I64Span(const at::Tensor& t, const char* arg) {
    if (t.scalar_type() == at::kLong && t.is_contiguous()) {
      keep_ = t;
      p_ = t.data_ptr<int64_t>();
      n_ = t.numel();
    } else {
      copy_ = as_i64(t, arg);
      p_ = copy_.data();
      n_ = static_cast<int64_t>(copy_.size());
    }
  }
  int64_t operator[](int64_t i) const { return p_[i]; }
  int64_t size() const { return n_; }

 private:
  at::Tensor keep_;
  std::vector<int64_t> copy_;
  const int64_t* p_ = nullptr;
  int64_t n_ = 0;
};

// Exclusive prefix sum of lengths (n + 1 entries; the last is the total).  Negative lengths
// are a ValueError naming `arg`.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths, const char* arg) {
  std::vector<int64_t> off(lengths.size() + 1);
  off[0] = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    TORCH_CHECK_VALUE(lengths[i] >= 0, arg, ": lengths must be >= 0, entry ", i, " is ",
                      lengths[i]);
    off[i + 1] = off[i] + lengths[i];
  }
  return off;
}

#if defined(__x86_64__)
// a + b in lanes of index_t.
template <typename index_t>
__attribute__((target("avx2"))) inline __m256i add_lanes(__m256i a, __m256i b) {
  if constexpr (sizeof(index_t) == 8) return _mm256_add_epi64(a, b);
  else return _mm256_add_epi32(a, b);
}

// out[j] = base + j for j < len, up to the first kAlign-byte boundary of out; returns that j.
template <int64_t kAlign, typename index_t>
inline int64_t fill_iota_head(index_t* out, int64_t len, int64_t base) {
  int64_t j = 0;
  for (; j < len && (reinterpret_cast<uintptr_t>(out + j) & (kAlign - 1)) != 0; ++j) {
    out[j] = static_cast<index_t>(base + j);
  }
  return j;
}

// out[j] = base + j for j in [0, len) with aligned 32-byte AVX2 stores, two per step: the stores
// bound this loop when the output sits in cache.  A segment starts anywhere in the output, so the
// head up to a 32-byte boundary is written first (every other unaligned store split a cache
// line).  offsets_range of a 1 MB int64 output on a 2-core Intel Xeon (AVX-512), thread CPU time:
// this loop 19.1 us, fbgemm 20.4 us; with aligned 64-byte AVX-512 stores 20.1 us, unaligned ones
// 1.10x fbgemm, so AVX-512 machines run this loop too.  AVX2 against SSE2: about 15% less time
// (A/B on an AVX2 machine).  The function starts on a 64-byte boundary, so its 34-byte loop (at
// +0x80) sits in one 64-byte line whatever is linked before it.  Two builds of the same source,
// offsets_range, AMD EPYC Zen 2 (alternating with fbgemm's 29.1-29.5 us, thread CPU time): the
// loop across a line (at +0x30 in one) 31.1 us, inside one (at +0x10) 28.4-29.0 us; aligned
// 27.9-28.2 us.
template <typename index_t>
__attribute__((target("avx2"), aligned(64))) void fill_iota_avx2(index_t* __restrict__ out,
                                                                 int64_t len, int64_t base) {
  constexpr int64_t kLanes = 32 / sizeof(index_t);
  int64_t j = fill_iota_head<32>(out, len, base);
  const int64_t b = base + j;
  __m256i v0, step;
  if constexpr (sizeof(index_t) == 8) {
    v0 = _mm256_set_epi64x(b + 3, b + 2, b + 1, b);
    step = _mm256_set1_epi64x(kLanes);
  } else {
    const auto b32 = static_cast<int32_t>(b);
    v0 = _mm256_add_epi32(_mm256_set1_epi32(b32), _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0));
    step = _mm256_set1_epi32(kLanes);
  }
  __m256i v1 = add_lanes<index_t>(v0, step);
  const __m256i step2 = add_lanes<index_t>(step, step);
  for (; j + 2 * kLanes <= len; j += 2 * kLanes) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + j), v0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + j + kLanes), v1);
    v0 = add_lanes<index_t>(v0, step2);
    v1 = add_lanes<index_t>(v1, step2);
  }
  for (; j < len; ++j) out[j] = static_cast<index_t>(base + j);
}
#endif

// out[j] = base + j for j in [0, len): the fill of offsets_range / expand_into_jagged_permute.
// AVX2 where isa() allows (csrc/isa.h); elsewhere a plain loop, which -O3 vectorises for
// the baseline ISA (SSE2 on x86-64, NEON on aarch64).
template <typename index_t>
inline void fill_iota(index_t* __restrict__ out, int64_t len, int64_t base) {
#if defined(__x86_64__)
  if (len >= 8 && isa() >= Isa::kAvx2) {
    fill_iota_avx2(out, len, base);
    return;
  }
#endif
  for (int64_t j = 0; j < len; ++j) out[j] = static_cast<index_t>(base + j);
}

// A new CPU tensor of `like`'s dtype, without a dispatcher round trip (~0.3 us of a 3 us op).
at::Tensor new_cpu(at::IntArrayRef shape, const at::Tensor& like) {
  return at::Tensor(at::detail::empty_cpu(shape, like.scalar_type()));
}

// Bytes of one row (dim-0 slice) of a contiguous tensor.
int64_t row_bytes(const at::Tensor& t) {
  int64_t inner = 1;
  for (int64_t d = 1; d < t.dim(); ++d) inner *= t.size(d);
  return inner * static_cast<int64_t>(t.element_size());
}

// A tensor shaped like `like` with `rows` rows.
at::Tensor empty_rows(const at::Tensor& like, int64_t rows) {
  auto shape = like.sizes().vec();
  shape[0] = rows;
  return new_cpu(shape, like);
}

// n rows of a 4- or 8-byte type: short runs inline, long ones through memcpy (wider stores).
template <typename T>
inline void copy_rows(T* __restrict__ out, const T* __restrict__ in, int64_t n) {
  if (n * static_cast<int64_t>(sizeof(T)) >= 512) {
    std::memcpy(out, in, n * sizeof(T));
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = in[i];
}

// Segment copy: out rows [dst[s], dst[s] + len[s]) = in rows [src[s], ...), for every segment s,
// of the values and (when given) the weights in the same pass.  Parallel over segments; `work`
// (moved rows) decides whether to use threads.  Returns the weights' output.
c10::optional<at::Tensor> copy_segments(const at::Tensor& in, at::Tensor& out,
                                        const c10::optional<at::Tensor>& w_in,
                                        const std::vector<int64_t>& src,
                                        const std::vector<int64_t>& dst,
                                        const std::vector<int64_t>& len) {
  at::Tensor w, w_out;
  if (w_in.has_value()) {
    w = w_in->contiguous();
    w_out = empty_rows(w, out.size(0));
  }
  const int64_t rb = row_bytes(in), wb = w.defined() ? row_bytes(w) : 0;
  const int64_t n_seg = static_cast<int64_t>(len.size());
  if (n_seg > 0 && out.size(0) > 0 && rb + wb > 0) {
    const char* ip = static_cast<const char*>(in.data_ptr());
    char* op = static_cast<char*>(out.data_ptr());
    const char* wp = wb ? static_cast<const char*>(w.data_ptr()) : nullptr;
    char* wop = wb ? static_cast<char*>(w_out.data_ptr()) : nullptr;
    const int64_t total = out.size(0);
    parallel_over(n_seg, total * std::max<int64_t>(rb / 4, 1), [&](int64_t s0, int64_t s1) {
      // the usual KJT: 8-byte ids and 4-byte weights (or none), segments of ~100 rows: an
      // inline loop per segment beats two memcpy calls
      if (rb == 8 && (wb == 0 || wb == 4)) {
        const auto* iv = reinterpret_cast<const uint64_t*>(ip);
        auto* ov = reinterpret_cast<uint64_t*>(op);
        const auto* iw = reinterpret_cast<const uint32_t*>(wp);
        auto* ow = reinterpret_cast<uint32_t*>(wop);
        for (int64_t s = s0; s < s1; ++s) {
          const int64_t l = len[s], from = src[s], to = dst[s];
          copy_rows(ov + to, iv + from, l);
          if (wb) copy_rows(ow + to, iw + from, l);
        }
        return;
      }
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t l = len[s];
        if (l <= 0) continue;
        if (rb) std::memcpy(op + dst[s] * rb, ip + src[s] * rb, l * rb);
        if (wb) std::memcpy(wop + dst[s] * wb, wp + src[s] * wb, l * wb);
      }
    });
  }
  if (!w_in.has_value()) return c10::nullopt;
  return w_out;
}

void check_rows(const at::Tensor& t, int64_t need, const char* arg, const char* what) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(0) >= need, arg, ": has ",
                    t.dim() ? t.size(0) : 0, " rows but ", what, " need ", need);
}

// Output segments back to back: dst offsets of `len`, checked against a caller-given total.
std::vector<int64_t> dst_offsets(const std::vector<int64_t>& len, c10::optional<int64_t> given,
                                 const char* arg) {
  std::vector<int64_t> dst(len.size());
  int64_t acc = 0;
  for (size_t i = 0; i < len.size(); ++i) {
    dst[i] = acc;
    acc += len[i];
  }
  TORCH_CHECK_VALUE(!given.has_value() || *given == acc, arg, ": is ", given.value_or(0),
                    " but the permuted lengths sum to ", acc);
  dst.push_back(acc);
  return dst;
}

using PermuteOut = std::tuple<at::Tensor, at::Tensor, c10::optional<at::Tensor>>;

}  // namespace

// ------------------------------------------------------------------------------ cumsums

// d[i] = s[0] + ... + s[i] for i in [0, n) (int wrap-around as fbgemm's loop).  Eight entries
// per step: eight loads, a three-level prefix in registers, eight stores, so the running total
// takes one add per eight entries instead of one per entry (30% under the one-add loop at 1k
// entries, measured).
template <typename index_t>
void inclusive_scan(const index_t* __restrict__ s, index_t* __restrict__ d, int64_t n) {
  using u = std::make_unsigned_t<index_t>;  // unsigned: wrap-around is defined
  u acc = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    u a[8];
    for (int k = 0; k < 8; ++k) a[k] = static_cast<u>(s[i + k]);
    for (int k = 1; k < 8; k += 2) a[k] += a[k - 1];  // pairs
    a[2] += a[1], a[3] += a[1], a[6] += a[5], a[7] += a[5];  // quads
    a[4] += a[3], a[5] += a[3], a[6] += a[3], a[7] += a[3];  // eights
    for (int k = 0; k < 8; ++k) d[i + k] = static_cast<index_t>(acc + a[k]);
    acc += a[7];
  }
  for (; i < n; ++i) d[i] = static_cast<index_t>(acc += static_cast<u>(s[i]));
}

// d[i] = s[0] + ... + s[i] in the input's own type, one entry after the other (floating types:
// the order of fbgemm's CPU loop, so the sums are the same bits).
template <typename scalar_t>
void sequential_scan(const scalar_t* __restrict__ s, scalar_t* __restrict__ d, int64_t n) {
  scalar_t acc = 0;
  for (int64_t i = 0; i < n; ++i) d[i] = acc = static_cast<scalar_t>(acc + s[i]);
}

// inclusive scan of n entries: the eight-wide integer scan, the sequential one otherwise
template <typename scalar_t>
void scan(const scalar_t* s, scalar_t* d, int64_t n) {
  if constexpr (std::is_integral_v<scalar_t>) {
    inclusive_scan(s, d, n);
  } else {
    sequential_scan(s, d, n);
  }
}

// the dtypes fbgemm's cumsums take: int32 / int64 at full speed, and the floating types
template <typename F>
void dispatch_cumsum(const at::Tensor& t, F&& f) {
  if (t.scalar_type() == at::kInt) {
    f(int32_t{});
  } else if (t.scalar_type() == at::kLong) {
    f(int64_t{});
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "cumsum",
                                    [&] { f(scalar_t{}); });
  }
}

// [0, cumsum] along the last dim of a 1-D or 2-D tensor (fbgemm takes both; TorchRec's KJT
// paths pass 2-D [T, B] lengths too).
at::Tensor asynchronous_complete_cumsum_rows(const at::Tensor& t_in) {
  TORCH_CHECK(t_in.dim() == 1 || t_in.dim() == 2,
              "asynchronous_complete_cumsum: t_in must be 1-D or 2-D, got ", t_in.dim(), "-D");
  auto x = t_in.expect_contiguous();
  const int64_t rows = x->dim() == 2 ? x->size(0) : 1;
  const int64_t n = x->size(-1);
  auto out = x->dim() == 2 ? new_cpu({rows, n + 1}, *x)
                           : new_cpu({n + 1}, *x);
  dispatch_cumsum(*x, [&](auto z) {
    using scalar_t = decltype(z);
    const scalar_t* s = x->data_ptr<scalar_t>();
    scalar_t* d = out.data_ptr<scalar_t>();
    for (int64_t r = 0; r < rows; ++r) {
      scalar_t* dst = d + r * (n + 1);
      dst[0] = 0;
      scan(s + r * n, dst + 1, n);
    }
  });
  return out;
}

// Running sum over all entries of a tensor (any shape, as fbgemm: row-major order), same
// shape; `Inclusive` chooses whether entry i counts itself.
template <bool Inclusive>
static at::Tensor running_sum(const at::Tensor& t_in) {
  auto x = t_in.expect_contiguous();
  const int64_t n = x->numel();
  auto out = new_cpu(x->sizes(), *x);
  if (n == 0) return out;
  dispatch_cumsum(*x, [&](auto z) {
    using scalar_t = decltype(z);
    const scalar_t* s = x->data_ptr<scalar_t>();
    scalar_t* d = out.data_ptr<scalar_t>();
    if constexpr (Inclusive) {
      scan(s, d, n);
    } else {  // exclusive: 0, then the inclusive sums of all but the last entry
      d[0] = 0;
      scan(s, d + 1, n - 1);
    }
  });
  return out;
}

at::Tensor asynchronous_exclusive_cumsum(const at::Tensor& t_in) {
  return running_sum<false>(t_in);
}

at::Tensor asynchronous_inclusive_cumsum(const at::Tensor& t_in) {
  return running_sum<true>(t_in);
}

// ------------------------------------------------------------------------------ permutes

// Features are rows of lengths [T_in, B]: input feature p owns one contiguous run of values, so
// output feature t is a single copy of input feature permute[t]'s run.
PermuteOut permute_2D_sparse_data(const at::Tensor& permute, const at::Tensor& lengths,
                                  const at::Tensor& values, const c10::optional<at::Tensor>& weights,
                                  c10::optional<int64_t> permuted_lengths_sum) {
  TORCH_CHECK_VALUE(lengths.dim() >= 1, "lengths: expected [T, B]");
  const int64_t t_in = lengths.size(0);
  const int64_t b = t_in ? lengths.numel() / t_in : 0;
  const auto perm = as_i64(permute, "permute");
  const auto lens = as_i64(lengths, "lengths");
  const auto off = offsets_of(lens, "lengths");
  const int64_t t_out = static_cast<int64_t>(perm.size());
  std::vector<int64_t> src(t_out), len(t_out);
  for (int64_t t = 0; t < t_out; ++t) {
    TORCH_CHECK_VALUE(perm[t] >= 0 && perm[t] < t_in, "permute: entry ", t, " is ", perm[t],
                      ", outside [0, ", t_in, ")");
    src[t] = off[perm[t] * b];
    len[t] = off[(perm[t] + 1) * b] - src[t];
  }
  auto dst = dst_offsets(len, permuted_lengths_sum, "permuted_lengths_sum");
  check_rows(values, off.back(), "values", "the lengths");
  if (weights.has_value()) check_rows(*weights, off.back(), "weights", "the lengths");

  auto out_len_shape = lengths.sizes().vec();
  out_len_shape[0] = t_out;
  auto lc = lengths.contiguous();
  auto out_lengths = new_cpu(out_len_shape, lc);
  const int64_t lb = b * static_cast<int64_t>(lc.element_size());
  const char* lp = static_cast<const char*>(lc.data_ptr());
  char* olp = static_cast<char*>(out_lengths.data_ptr());
  for (int64_t t = 0; t < t_out && lb > 0; ++t) std::memcpy(olp + t * lb, lp + perm[t] * lb, lb);

  auto v = values.contiguous();
  auto out_values = empty_rows(v, dst.back());
  dst.pop_back();
  auto out_weights = copy_segments(v, out_values, weights, src, dst, len);
  return {out_lengths, out_values, out_weights};
}

PermuteOut permute_1D_sparse_data(const at::Tensor& permute, const at::Tensor& lengths,
                                  const at::Tensor& values, const c10::optional<at::Tensor>& weights,
                                  c10::optional<int64_t> permuted_lengths_sum) {
  // lengths of any shape are read as one flat list of segments (fbgemm's rule)
  const auto lens = as_i64(lengths, "lengths");
  const auto off = offsets_of(lens, "lengths");
  const auto perm = as_i64(permute, "permute");
  const int64_t n_seg = static_cast<int64_t>(lens.size());
  const int64_t n_out = static_cast<int64_t>(perm.size());
  std::vector<int64_t> src(n_out), len(n_out);
  for (int64_t i = 0; i < n_out; ++i) {
    TORCH_CHECK_VALUE(perm[i] >= 0 && perm[i] < n_seg, "permute: entry ", i, " is ", perm[i],
                      ", outside [0, ", n_seg, ")");
    src[i] = off[perm[i]];
    len[i] = lens[perm[i]];
  }
  auto dst = dst_offsets(len, permuted_lengths_sum, "permuted_lengths_sum");
  check_rows(values, off.back(), "values", "the lengths");
  if (weights.has_value()) check_rows(*weights, off.back(), "weights", "the lengths");

  auto out_lengths = new_cpu({n_out}, lengths);
  dispatch_index(lengths, "lengths", [&](auto z) {
    using index_t = decltype(z);
    index_t* p = out_lengths.data_ptr<index_t>();
    for (int64_t i = 0; i < n_out; ++i) p[i] = static_cast<index_t>(len[i]);
  });
  auto v = values.contiguous();
  auto out_values = empty_rows(v, dst.back());
  dst.pop_back();
  auto out_weights = copy_segments(v, out_values, weights, src, dst, len);
  return {out_lengths, out_values, out_weights};
}

// out[s[i]] = i for i in [0, n) up to the first entry outside [0, n); returns its position (n
// when there is none).  Four entries per step with one combined range test: the loop does the
// loads and stores of fbgemm's unchecked loop plus one predictable branch per four entries (one
// test per entry measured ~5-20% slower than the unchecked loop on this random-store-bound
// scatter).  Not inlined: inside the caller GCC reloaded n from the stack on every entry.  With
// kPrefetch, the line of the entry kPf positions on is prefetched for writing (PREFETCHW): the
// stores then find their lines owned, and more of them are in flight than the store buffer alone
// keeps -- on some CPUs (invert_permute of 127k int64: 0.995x -> 0.90-0.92x fbgemm's time at a
// distance of 16 to 128, 2-core Intel Xeon); on others the prefetches only cost (AMD EPYC Zen 2:
// 0.117-0.126 ms without, 0.148-0.158 with, standalone loop; also at 16k-4M entries), so
// prefetch_scatter_pays() measures which once.
template <bool kPrefetch, typename index_t>
static __attribute__((noinline)) TRASC_TARGET_PRFCHW int64_t scatter_positions(const index_t* __restrict__ s,
                                                        index_t* __restrict__ d, int64_t n) {
  using uindex_t = std::make_unsigned_t<index_t>;
  const uint64_t un = static_cast<uint64_t>(n);
  int64_t i = 0;
  constexpr int64_t kPf = 32;
  // d[s[i + k]] = i + k for k < 4, unless one of the four is outside [0, n): then false, and
  // nothing is written (the tail loop below finds which)
  auto step = [&](int64_t i) __attribute__((always_inline)) {
    const uint64_t a0 = static_cast<uindex_t>(s[i]), a1 = static_cast<uindex_t>(s[i + 1]);
    const uint64_t a2 = static_cast<uindex_t>(s[i + 2]), a3 = static_cast<uindex_t>(s[i + 3]);
    if (__builtin_expect((a0 >= un) | (a1 >= un) | (a2 >= un) | (a3 >= un), 0)) return false;
    d[a0] = static_cast<index_t>(i);
    d[a1] = static_cast<index_t>(i + 1);
    d[a2] = static_cast<index_t>(i + 2);
    d[a3] = static_cast<index_t>(i + 3);
    return true;
  };
  if constexpr (kPrefetch) {
    for (; i + 4 + kPf <= n; i += 4) {  // with the prefetch of the entries kPf on
      for (int k = 0; k < 4; ++k) {
        const uint64_t f = static_cast<uindex_t>(s[i + kPf + k]);
        __builtin_prefetch(d + (f < un ? f : 0), 1, 3);
      }
      if (!step(i)) break;
    }
  }
  for (; i + 4 <= n; i += 4) {
    if (!step(i)) break;
  }
  for (; i < n; ++i) {  // the tail, and the step holding the first bad entry
    const uint64_t a = static_cast<uindex_t>(s[i]);
    if (__builtin_expect(a >= un, 0)) break;
    d[a] = static_cast<index_t>(i);
  }
  return i;
}

// Whether scatter_positions' prefetches pay on this CPU: both loops on a shuffled permutation of
// 2^17 int64 entries (1 MiB out, the benchmark's size), 9 interleaved rounds after a warm-up
// (interleaved_timing.h); the lower median wins.  Measured once per process (~3 ms).
static bool prefetch_scatter_pays() {
  static const bool pays = [] {
    constexpr int64_t n = int64_t(1) << 17;
    std::vector<int64_t> perm(n), out(n);
    for (int64_t i = 0; i < n; ++i) perm[i] = i;
    uint64_t x = 0x9E3779B97F4A7C15ull;  // a fixed shuffle
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(perm[i], perm[static_cast<int64_t>(next_fixed_random(x) % static_cast<uint64_t>(i + 1))]);
    const std::vector<double> med = interleaved_median_seconds(2, 9, [&](size_t i) {
      if (i == 0) scatter_positions<true>(perm.data(), out.data(), n);
      else scatter_positions<false>(perm.data(), out.data(), n);
    });
    return med[0] < med[1];
  }();
  return pays;
}

at::Tensor invert_permute(const at::Tensor& permute) {
  TORCH_CHECK_VALUE(permute.dim() == 1, "permute: expected 1-D");
  auto p = permute.expect_contiguous();
  const int64_t n = p->numel();
  auto out = new_cpu({n}, *p);
  dispatch_index(*p, "permute", [&](auto z) {
    using index_t = decltype(z);
    const index_t* s = p->data_ptr<index_t>();
    index_t* d = out.data_ptr<index_t>();
    const int64_t bad = prefetch_scatter_pays() ? scatter_positions<true>(s, d, n) : scatter_positions<false>(s, d, n);
    TORCH_CHECK_VALUE(bad == n, "permute: entry ", bad, " is ",
                      bad < n ? static_cast<int64_t>(s[bad]) : 0, ", outside [0, ", n, ")");
  });
  return out;
}

at::Tensor expand_into_jagged_permute(const at::Tensor& permute, const at::Tensor& input_offset,
                                      const at::Tensor& output_offset, int64_t output_size) {
  const I64Span perm(permute, "permute");
  const I64Span in_off(input_offset, "input_offset");
  const I64Span out_off(output_offset, "output_offset");
  const int64_t t = static_cast<int64_t>(perm.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(in_off.size()) == t + 1 &&
                        static_cast<int64_t>(out_off.size()) == t + 1,
                    "input_offset, output_offset: need len(permute) + 1 entries");
  TORCH_CHECK_VALUE(out_off[t] == output_size, "output_size: is ", output_size,
                    " but output_offset ends at ", out_off[t]);
  auto out = new_cpu({output_size}, input_offset);
  dispatch_index(input_offset, "input_offset", [&](auto z) {
    using index_t = decltype(z);
    index_t* d = out.data_ptr<index_t>();
    parallel_over(t, output_size, [&](int64_t t0, int64_t t1) {
      // each segment is checked right before it is written (one pass over the inputs; a bad
      // entry raises before anything outside [0, output_size) could be written)
      for (int64_t i = t0; i < t1; ++i) {
        const int64_t p = perm[i], j0 = out_off[i], j1 = out_off[i + 1];
        TORCH_CHECK_VALUE(p >= 0 && p < t, "permute: entry ", i, " out of range");
        TORCH_CHECK_VALUE(j0 >= 0 && j0 <= j1 && j1 <= output_size,
                          "output_offset: must start at >= 0 and not decrease");
        fill_iota(d + j0, j1 - j0, in_off[p]);
      }
    });
  });
  return out;
}

at::Tensor offsets_range(const at::Tensor& offsets, int64_t range_size) {
  TORCH_CHECK_VALUE(offsets.dim() == 1, "offsets: expected 1-D");
  auto o = offsets.contiguous();
  auto out = new_cpu({range_size}, o);
  const int64_t n = o.numel();
  dispatch_index(o, "offsets", [&](auto z) {
    using index_t = decltype(z);
    const index_t* s = o.data_ptr<index_t>();
    index_t* d = out.data_ptr<index_t>();
    TORCH_CHECK_VALUE(n > 0 ? s[0] == 0 : range_size == 0, "offsets: must start at 0");
    parallel_over(n, range_size, [&](int64_t i0, int64_t i1) {
      const index_t* starts = s;  // locals: the stores below may not reload them
      index_t* dst = d;
      const int64_t count = n, total = range_size;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t start = starts[i];
        const int64_t end = i + 1 < count ? static_cast<int64_t>(starts[i + 1]) : total;
        TORCH_CHECK_VALUE(start >= 0 && start <= end && end <= total, "offsets: entry ", i,
                          " spans [", start, ", ", end,
                          "), outside 0 <= start <= end <= range_size=", total);
        fill_iota(dst + start, end - start, 0);
      }
    });
  });
  return out;
}

// ------------------------------------------------------------------------------ segment sums

// s[0] + ... + s[len - 1] in eight interleaved partial sums (independent chains the compiler
// vectorises; one chain waits an add latency per entry), in at::opmath_type (float for
// half/bfloat16).  Floats therefore round differently from fbgemm's one-chain loop in the value
// type: within the sum's rounding error, not bit for bit.
template <typename scalar_t>
at::opmath_type<scalar_t> sum_range(const scalar_t* __restrict__ s, int64_t len) {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t a[8] = {};
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    for (int k = 0; k < 8; ++k) a[k] += static_cast<acc_t>(s[j + k]);
  }
  acc_t r = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  for (; j < len; ++j) r += static_cast<acc_t>(s[j]);
  return r;
}

at::Tensor segment_sum_csr(int64_t batch_size, const at::Tensor& csr_seg, const at::Tensor& values) {
  const auto seg = as_i64(csr_seg, "csr_seg");
  const int64_t n = std::max<int64_t>(static_cast<int64_t>(seg.size()) - 1, 0);
  auto v = values.contiguous();
  auto out = new_cpu({n}, v);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(seg[i] >= 0 && seg[i] <= seg[i + 1] && seg[i + 1] * batch_size <= v.numel(),
                      "csr_seg: segment ", i, " is outside the values");
  }
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, v.scalar_type(), "segment_sum_csr", [&] {
    const scalar_t* s = v.data_ptr<scalar_t>();
    scalar_t* d = out.data_ptr<scalar_t>();
    const int64_t work = n ? (seg[n] - seg[0]) * batch_size : 0;
    parallel_over(n, work, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t j0 = seg[i] * batch_size;
        d[i] = static_cast<scalar_t>(sum_range(s + j0, seg[i + 1] * batch_size - j0));
      }
    });
  });
  return out;
}

// ------------------------------------------------------------------------------ KJT select dim 1

std::vector<at::Tensor> keyed_jagged_index_select_dim1(
    const at::Tensor& values, const at::Tensor& lengths, const at::Tensor& offsets,
    const at::Tensor& indices, int64_t batch_size, const c10::optional<at::Tensor>& weights,
    c10::optional<int64_t> selected_lengths_sum) {
  TORCH_CHECK_VALUE(batch_size > 0 && lengths.numel() % batch_size == 0,
                    "batch_size: must be > 0 and divide len(lengths)");
  const auto lens = as_i64(lengths, "lengths");
  const auto off = as_i64(offsets, "offsets");
  const auto sel = as_i64(indices, "indices");
  TORCH_CHECK_VALUE(off.size() == lens.size() + 1, "offsets: needs len(lengths) + 1 entries");
  const int64_t keys = static_cast<int64_t>(lens.size()) / batch_size;
  const int64_t n_sel = static_cast<int64_t>(sel.size());
  std::vector<int64_t> src(keys * n_sel), len(keys * n_sel);
  for (int64_t k = 0; k < keys; ++k) {
    for (int64_t i = 0; i < n_sel; ++i) {
      TORCH_CHECK_VALUE(sel[i] >= 0 && sel[i] < batch_size, "indices: entry ", i, " is ", sel[i],
                        ", outside [0, ", batch_size, ")");
      const int64_t j = k * batch_size + sel[i];
      TORCH_CHECK_VALUE(lens[j] >= 0 && off[j] >= 0 && off[j] + lens[j] <= values.size(0),
                        "lengths, offsets: bag ", j, " is outside the values");
      src[k * n_sel + i] = off[j];
      len[k * n_sel + i] = lens[j];
    }
  }
  auto dst = dst_offsets(len, selected_lengths_sum, "selected_lengths_sum");
  auto out_lengths = new_cpu({keys * n_sel}, lengths);
  dispatch_index(lengths, "lengths", [&](auto z) {
    using index_t = decltype(z);
    index_t* p = out_lengths.data_ptr<index_t>();
    for (int64_t i = 0; i < keys * n_sel; ++i) p[i] = static_cast<index_t>(len[i]);
  });
  auto v = values.contiguous();
  auto out_values = empty_rows(v, dst.back());
  dst.pop_back();
  auto out_weights = copy_segments(v, out_values, weights, src, dst, len);
  std::vector<at::Tensor> out = {out_values, out_lengths};
  if (out_weights.has_value()) out.push_back(*out_weights);
  return out;
}

// ------------------------------------------------------------------------------ pooled permutes

// out[b, inv_off[t] : inv_off[t+1]] = in[b, off[p[t]] : off[p[t]+1]], for [B, C, ...] input.
at::Tensor permute_pooled_embs(const at::Tensor& pooled_embs, const at::Tensor& offset_dim_list,
                               const at::Tensor& permute_list, const at::Tensor& inv_offset_dim_list,
                               const at::Tensor& inv_permute_list) {
  TORCH_CHECK_VALUE(pooled_embs.dim() >= 2, "pooled_embs: expected [B, sum D, ...]");
  auto x = pooled_embs.contiguous();
  auto out = at::empty_like(x);
  if (x.numel() == 0) return out;
  const auto off = as_i64(offset_dim_list, "offset_dim_list");
  const auto perm = as_i64(permute_list, "permute_list");
  const auto inv_off = as_i64(inv_offset_dim_list, "inv_offset_dim_list");
  const int64_t t = static_cast<int64_t>(perm.size());
  const int64_t b = x.size(0), cols = x.size(1);
  const int64_t cb = x.numel() / (b * cols) * static_cast<int64_t>(x.element_size());  // bytes per column
  TORCH_CHECK_VALUE(static_cast<int64_t>(off.size()) == t + 1 &&
                        static_cast<int64_t>(inv_off.size()) == t + 1,
                    "offset_dim_list, inv_offset_dim_list: need len(permute_list) + 1 entries");
  for (int64_t i = 0; i < t; ++i) {
    TORCH_CHECK_VALUE(perm[i] >= 0 && perm[i] < t, "permute_list: entry ", i, " out of range");
    const int64_t w = off[perm[i] + 1] - off[perm[i]];
    TORCH_CHECK_VALUE(off[perm[i]] >= 0 && w >= 0 && off[perm[i] + 1] <= cols && inv_off[i] >= 0 &&
                          inv_off[i] + w <= cols && inv_off[i + 1] - inv_off[i] == w,
                      "offset_dim_list, inv_offset_dim_list: block ", i, " is inconsistent with ",
                      cols, " columns");
  }
  const char* ip = static_cast<const char*>(x.data_ptr());
  char* op = static_cast<char*>(out.data_ptr());
  const int64_t rb = cols * cb;
  parallel_over(b, x.numel(), [&](int64_t b0, int64_t b1) {
    for (int64_t r = b0; r < b1; ++r) {
      for (int64_t i = 0; i < t; ++i) {
        const int64_t w = off[perm[i] + 1] - off[perm[i]];
        std::memcpy(op + r * rb + inv_off[i] * cb, ip + r * rb + off[perm[i]] * cb, w * cb);
      }
    }
  });
  return out;
}

// ------------------------------------------------------------------------------ bounds check

// fbgemm's CPU bounds check (BoundsCheckMode FATAL=0, WARNING=1, IGNORE=2, NONE=3, V2_* = 4..6
// as their v1 modes).  Offsets are repaired sequentially (bag k+1 starts where the repaired bag
// k ends); ids are then checked per bag, in parallel, with the fix count reduced at the end.
// Offsets of another dtype than the indices are checked on a converted copy (as fbgemm does:
// repairs do not reach the caller's tensor).
void bounds_check_indices(const at::Tensor& rows_per_table, at::Tensor& indices, at::Tensor& offsets,
                          int64_t bounds_check_mode, at::Tensor& warning,
                          const c10::optional<at::Tensor>& weights,
                          const c10::optional<at::Tensor>& B_offsets, int64_t /*max_B*/,
                          const c10::optional<at::Tensor>& /*b_t_map*/, int64_t /*info_B_num_bits*/,
                          int64_t /*info_B_mask*/, int64_t /*bounds_check_version*/,
                          bool /*prefetch_pipeline*/) {
  int64_t mode = bounds_check_mode >= 4 ? (bounds_check_mode == 4 ? 2 : bounds_check_mode == 5 ? 1 : 0)
                                        : bounds_check_mode;
  if (mode == 3) return;
  TORCH_CHECK_VALUE(indices.is_contiguous() && offsets.is_contiguous(),
                    "indices, offsets: must be contiguous (they are repaired in place)");
  const auto rows = as_i64(rows_per_table, "rows_per_table");
  const int64_t t_count = static_cast<int64_t>(rows.size());
  const int64_t n = indices.numel();
  const int64_t total_b = offsets.numel() - 1;
  TORCH_CHECK_VALUE(total_b >= 0, "offsets: needs at least one element");
  if (weights.has_value() && weights->numel() != 0) {
    TORCH_CHECK_VALUE(weights->size(0) == n, "weights: size ", weights->size(0),
                      " is not equal to indices size ", n);
  }
  // table of each bag
  std::vector<int64_t> bag_start_of_table(t_count + 1);
  if (B_offsets.has_value()) {
    const auto bo = as_i64(*B_offsets, "B_offsets");
    TORCH_CHECK_VALUE(static_cast<int64_t>(bo.size()) == t_count + 1 && bo[t_count] == total_b,
                      "B_offsets: needs T + 1 entries ending at the number of bags");
    bag_start_of_table.assign(bo.begin(), bo.end());
  } else {
    TORCH_CHECK_VALUE(t_count > 0 && total_b % t_count == 0, "offsets: size ", offsets.numel(),
                      " is not B * T + 1 for T=", t_count);
    for (int64_t t = 0; t <= t_count; ++t) bag_start_of_table[t] = t * (total_b / t_count);
  }
  at::Tensor offs = offsets.scalar_type() == indices.scalar_type() ? offsets
                                                                   : offsets.to(indices.scalar_type());
  int64_t fixes = 0;
  dispatch_index(indices, "indices", [&](auto z) {
    using index_t = decltype(z);
    index_t* o = offs.data_ptr<index_t>();
    index_t* idx = indices.data_ptr<index_t>();
    if (static_cast<int64_t>(o[total_b]) != n) {
      TORCH_CHECK_VALUE(mode != 0, "offsets: last offset ", static_cast<int64_t>(o[total_b]),
                        " != number of indices ", n);
      ++fixes;
      o[total_b] = static_cast<index_t>(n);
    }
    for (int64_t k = 0; k < total_b; ++k) {
      int64_t s = o[k], e = o[k + 1];
      if (s < 0 || s > e || e > n) {
        TORCH_CHECK_VALUE(mode != 0, "offsets: bag ", k, " spans [", s, ", ", e,
                          ") outside 0 <= start <= end <= ", n);
        ++fixes;
        s = std::max<int64_t>(0, std::min(s, n));
        e = std::max(s, std::min(e, n));
        o[k] = static_cast<index_t>(s);
        o[k + 1] = static_cast<index_t>(e);
      }
    }
    std::vector<int64_t> bad_per_table(t_count, 0);
    for (int64_t t = 0; t < t_count; ++t) {
      const int64_t b0 = bag_start_of_table[t], b1 = bag_start_of_table[t + 1];
      const int64_t num_rows = rows[t];
      const int64_t work = static_cast<int64_t>(o[b1]) - static_cast<int64_t>(o[b0]);
      std::atomic<int64_t> bad{0};
      parallel_over(b1 - b0, work, [&](int64_t k0, int64_t k1) {
        int64_t local = 0;
        for (int64_t i = o[b0 + k0]; i < static_cast<int64_t>(o[b0 + k1]); ++i) {
          const int64_t v = idx[i];
          if (v == -1 || (v >= 0 && v < num_rows)) continue;
          TORCH_CHECK_VALUE(mode != 0, "indices: indices[", i, "]=", v, " of table ", t,
                            " is outside [0, ", num_rows, ")");
          ++local;
          idx[i] = 0;
        }
        bad += local;
      });
      bad_per_table[t] = bad.load();
    }
    for (auto c : bad_per_table) fixes += c;
  });
  if (mode == 1) {
    warning.zero_();
    warning.add_(fixes);
  }
}

// ------------------------------------------------------------------------------ block bucketize

namespace {

// The split of one feature's ids, copied out of Bucketizer once per bag so the per-id code
// reads locals (registers) rather than eight per-feature vectors.
struct FeatureSplit {
  int64_t b, g, lnb, local, my_size;
  double inv_local;
  bool keep;
  const int64_t* bd;  // uneven boundaries, or nullptr
  int64_t nb;

  // (bucket, new id) of id x, with fbgemm's unsigned reading of x.
  template <typename index_t>
  inline std::pair<int64_t, index_t> operator()(index_t x) const {
    using uindex_t = std::make_unsigned_t<index_t>;
    const uindex_t u = static_cast<uindex_t>(x);
    int64_t p;
    index_t nx;
    if (bd != nullptr) {
      int64_t lb;
      if (b == 0) {
        const int64_t folded = static_cast<int64_t>(u % static_cast<uindex_t>(g));
        const int64_t cmp = folded * bd[nb - 1] / g;
        lb = std::upper_bound(bd, bd + nb, cmp) - bd - 1;
      } else if (x < 0) {
        lb = nb - 1;
      } else {
        lb = std::upper_bound(bd, bd + nb, static_cast<int64_t>(x)) - bd - 1;
      }
      const bool in_range = lb < my_size;
      p = in_range ? lb : static_cast<int64_t>(u % static_cast<uindex_t>(my_size));
      if (b == 0) {
        nx = static_cast<index_t>(u / static_cast<uindex_t>(g));
      } else if (in_range) {
        nx = static_cast<index_t>(static_cast<int64_t>(x) - bd[std::max<int64_t>(lb, 0)]);
      } else {
        nx = static_cast<index_t>(u / static_cast<uindex_t>(my_size));
      }
    } else if (x >= 0 && static_cast<int64_t>(x) < b * g) {
      const int64_t xv = static_cast<int64_t>(x);
      int64_t q, r;
      if (xv < (int64_t{1} << 52)) {
        // exact below 2^52: the product is within one of the quotient, fixed by one step
        // (a 64-bit integer divide is not pipelined; a multiply is)
        q = static_cast<int64_t>(static_cast<double>(xv) * inv_local);
        r = xv - q * local;
        if (r < 0) {
          --q;
          r += local;
        } else if (r >= local) {
          ++q;
          r -= local;
        }
      } else {
        q = xv / local;
        r = xv % local;
      }
      p = q;
      nx = static_cast<index_t>(r);
    } else {
      p = static_cast<int64_t>(u % static_cast<uindex_t>(g)) / std::max<int64_t>(lnb, 1);
      nx = static_cast<index_t>(u / static_cast<uindex_t>(g));
    }
    if (keep) nx = x;
    return {p, nx};
  }
};

struct Bucketizer {
  // per feature
  std::vector<int64_t> blk, gnb, lnb;
  std::vector<double> inv_local;  // 1 / (blk * lnb): the even split divides by multiplying
  std::vector<uint8_t> keep;
  std::vector<std::vector<int64_t>> bounds;  // uneven: boundaries per feature (empty: even)
  int64_t my_size = 1;

  FeatureSplit feature(int64_t t) const {
    const auto& bd = bounds[t];
    return FeatureSplit{blk[t], gnb[t], lnb[t], blk[t] * lnb[t], my_size, inv_local[t],
                        keep[t] != 0, bd.empty() ? nullptr : bd.data(),
                        static_cast<int64_t>(bd.size())};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, c10::optional<at::Tensor>, c10::optional<at::Tensor>,
           c10::optional<at::Tensor>>
block_bucketize_sparse_features(const at::Tensor& lengths, const at::Tensor& indices,
                                bool bucketize_pos, bool sequence, const at::Tensor& block_sizes,
                                int64_t my_size, const c10::optional<at::Tensor>& weights,
                                const c10::optional<at::Tensor>& batch_size_per_feature,
                                int64_t /*max_B*/,
                                const c10::optional<std::vector<at::Tensor>>& block_bucketize_pos,
                                bool keep_orig_idx, const c10::optional<at::Tensor>& total_num_blocks,
                                const c10::optional<at::Tensor>& keep_orig_idx_per_feature) {
  TORCH_CHECK_VALUE(my_size > 0, "my_size: must be > 0");
  const auto lens = as_i64(lengths, "lengths");
  const auto off = offsets_of(lens, "lengths");
  const int64_t n_len = static_cast<int64_t>(lens.size());
  const int64_t n = indices.numel();
  TORCH_CHECK_VALUE(off.back() == n, "lengths: sum to ", off.back(), " but there are ", n,
                    " indices");
  Bucketizer bk;
  bk.my_size = my_size;
  bk.blk = as_i64(block_sizes, "block_sizes");
  const int64_t t_count = static_cast<int64_t>(bk.blk.size());
  if (total_num_blocks.has_value()) {
    bk.gnb = as_i64(*total_num_blocks, "total_num_blocks");
    TORCH_CHECK_VALUE(static_cast<int64_t>(bk.gnb.size()) == t_count,
                      "total_num_blocks: needs one entry per feature");
    for (int64_t t = 0; t < t_count; ++t) {
      TORCH_CHECK_VALUE(bk.gnb[t] > 0, "total_num_blocks: entries must be > 0");
      // fbgemm's rule (RuntimeError): every feature's blocks split evenly over the buckets
      TORCH_CHECK(bk.gnb[t] % my_size == 0, "block_bucketize_sparse_features: total_num_blocks[",
                  t, "] = ", bk.gnb[t], " must be a multiple of my_size (", my_size, ")");
    }
  } else {
    bk.gnb.assign(t_count, my_size);
  }
  bk.lnb.resize(t_count);
  bk.inv_local.resize(t_count);
  for (int64_t t = 0; t < t_count; ++t) {
    bk.lnb[t] = bk.gnb[t] / my_size;
    const int64_t local = bk.blk[t] * bk.lnb[t];
    bk.inv_local[t] = local > 0 ? 1.0 / static_cast<double>(local) : 0.0;
  }
  bk.keep.assign(t_count, keep_orig_idx ? 1 : 0);
  if (keep_orig_idx_per_feature.has_value()) {
    auto k = keep_orig_idx_per_feature->to(at::kBool).contiguous();
    TORCH_CHECK_VALUE(k.numel() == t_count, "keep_orig_idx_per_feature: needs one entry per feature");
    for (int64_t t = 0; t < t_count; ++t) bk.keep[t] = k.data_ptr<bool>()[t] ? 1 : 0;
  }
  bk.bounds.assign(t_count, {});
  const bool uneven = block_bucketize_pos.has_value() && !block_bucketize_pos->empty();
  if (uneven) {
    TORCH_CHECK_VALUE(static_cast<int64_t>(block_bucketize_pos->size()) == t_count,
                      "block_bucketize_pos: needs one tensor per feature");
    for (int64_t t = 0; t < t_count; ++t) {
      bk.bounds[t] = as_i64((*block_bucketize_pos)[t], "block_bucketize_pos");
      TORCH_CHECK_VALUE(!bk.bounds[t].empty(), "block_bucketize_pos: feature ", t,
                        " has no boundaries");
    }
  }
  for (int64_t t = 0; t < t_count; ++t) {
    TORCH_CHECK_VALUE(uneven || bk.blk[t] == 0 || bk.lnb[t] > 0,
                      "total_num_blocks: entries must be >= my_size");
  }
  // feature of each bag
  std::vector<int32_t> bag_table(n_len);
  if (batch_size_per_feature.has_value()) {
    const auto bpf = as_i64(*batch_size_per_feature, "batch_size_per_feature");
    TORCH_CHECK_VALUE(static_cast<int64_t>(bpf.size()) == t_count,
                      "batch_size_per_feature: needs one entry per feature");
    int64_t k = 0;
    for (int64_t t = 0; t < t_count; ++t) {
      TORCH_CHECK_VALUE(bpf[t] >= 0 && k + bpf[t] <= n_len,
                        "batch_size_per_feature: must sum to len(lengths)");
      for (int64_t j = 0; j < bpf[t]; ++j) bag_table[k++] = static_cast<int32_t>(t);
    }
    TORCH_CHECK_VALUE(k == n_len, "batch_size_per_feature: must sum to len(lengths)");
  } else {
    TORCH_CHECK_VALUE(t_count > 0 ? n_len % t_count == 0 : n_len == 0,
                      "lengths: ", n_len, " entries is not B * T for T=", t_count);
    const int64_t b = t_count ? n_len / t_count : 0;
    for (int64_t k = 0; k < n_len; ++k) bag_table[k] = static_cast<int32_t>(k / std::max<int64_t>(b, 1));
  }

  auto out_lengths = at::zeros({my_size * n_len}, lengths.options());
  auto out_indices = new_cpu({n}, indices);
  c10::optional<at::Tensor> out_weights, out_pos, unbucketize;
  at::Tensor w;
  if (weights.has_value()) {
    w = weights->contiguous();
    TORCH_CHECK_VALUE(w.dim() >= 1 && w.size(0) == n, "weights: needs one entry per index");
    out_weights = empty_rows(w, n);
  }
  if (bucketize_pos) out_pos = new_cpu({n}, indices);
  if (sequence) unbucketize = new_cpu({n}, indices);
  auto idx_c = indices.contiguous();
  std::vector<int32_t> bucket(n);
  std::vector<int64_t> count(my_size * n_len, 0);  // [p * n_len + bag]

  dispatch_index(idx_c, "indices", [&](auto z) {
    using index_t = decltype(z);
    const index_t* x = idx_c.data_ptr<index_t>();
    index_t* ox = out_indices.data_ptr<index_t>();
    std::vector<index_t> new_id(n);  // pass 1 computes (bucket, new id) once per id
    // pass 1: bucket and new id of every id, counts per (bucket, bag).  Raw pointers and a
    // per-bag count in locals: through the captured vectors every store would make the compiler
    // reload their data pointers and the count.
    parallel_over(n_len, n, [&](int64_t k0, int64_t k1) {
      int32_t* bkt = bucket.data();
      index_t* nid = new_id.data();
      int64_t* cnt = count.data();
      const int64_t buckets = my_size, stride = n_len;
      std::vector<int64_t> bag_count(buckets);
      for (int64_t k = k0; k < k1; ++k) {
        const FeatureSplit split = bk.feature(bag_table[k]);
        std::fill(bag_count.begin(), bag_count.end(), 0);
        int64_t* bc = bag_count.data();
        for (int64_t i = off[k], end = off[k + 1]; i < end; ++i) {
          const auto r = split(x[i]);
          const int64_t p = r.first;
          if (__builtin_expect(p < 0 || p >= buckets, 0)) {
            TORCH_CHECK_VALUE(false, "indices: id ", static_cast<int64_t>(x[i]), " of feature ",
                              bag_table[k], " maps to bucket ", p, ", outside [0, my_size=",
                              buckets, "): check block_sizes / block_bucketize_pos / "
                              "total_num_blocks");
          }
          bkt[i] = static_cast<int32_t>(p);
          nid[i] = r.second;
          ++bc[p];
        }
        for (int64_t p = 0; p < buckets; ++p) cnt[p * stride + k] = bc[p];
      }
    });
    // bucket-major output offsets (exclusive scan over (bucket, bag))
    std::vector<int64_t> cursor(my_size * n_len);
    int64_t acc = 0;
    for (int64_t j = 0; j < my_size * n_len; ++j) {
      cursor[j] = acc;
      acc += count[j];
    }
    dispatch_index(lengths, "lengths", [&](auto zl) {
      using len_t = decltype(zl);
      len_t* ol = out_lengths.data_ptr<len_t>();
      for (int64_t j = 0; j < my_size * n_len; ++j) ol[j] = static_cast<len_t>(count[j]);
    });
    // pass 2: place every id; a (bucket, bag) slot is written only by its bag's iteration
    const int64_t wb = w.defined() ? row_bytes(w) : 0;
    const char* wp = w.defined() ? static_cast<const char*>(w.data_ptr()) : nullptr;
    char* owp = out_weights.has_value() ? static_cast<char*>(out_weights->data_ptr()) : nullptr;
    index_t* opos = out_pos.has_value() ? out_pos->data_ptr<index_t>() : nullptr;
    index_t* unb = unbucketize.has_value() ? unbucketize->data_ptr<index_t>() : nullptr;
    // the placing loop, with the weight row as a typed load/store where it is 4 or 8 bytes
    // (char* stores would alias every captured variable; a memcpy call per id is slow too)
    auto place = [&](auto wz) {
      using w_t = decltype(wz);
      const w_t* wv = reinterpret_cast<const w_t*>(wp);
      w_t* owv = reinterpret_cast<w_t*>(owp);
      const int32_t* bkt = bucket.data();
      const index_t* nid = new_id.data();
      const int64_t stride = n_len;
      parallel_over(n_len, n, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t i0 = off[k], i1 = off[k + 1];
          int64_t* cur = cursor.data() + k;
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t dst = cur[bkt[i] * stride]++;
            ox[dst] = nid[i];
            if constexpr (!std::is_same_v<w_t, char>) {
              if (owv) owv[dst] = wv[i];
            } else {
              if (owp) std::memcpy(owp + dst * wb, wp + i * wb, wb);
            }
            if (opos) opos[dst] = static_cast<index_t>(i - i0);
            if (unb) unb[i] = static_cast<index_t>(dst);
          }
        }
      });
    };
    if (wb == 0 || wb == 4) {
      place(uint32_t{});
    } else if (wb == 8) {
      place(uint64_t{});
    } else {
      place(char{});
    }
  });
  return {out_lengths, out_indices, out_weights, out_pos, unbucketize};
}

void bind_sparse(pybind11::module& m) {
  // ops.describe(): invert_permute's measured choice (measured now if no call has yet)
  m.def("_prefetch_scatter_pays", &prefetch_scatter_pays);
  m.def("asynchronous_complete_cumsum_rows", &asynchronous_complete_cumsum_rows);
  m.def("asynchronous_exclusive_cumsum", &asynchronous_exclusive_cumsum);
  m.def("asynchronous_inclusive_cumsum", &asynchronous_inclusive_cumsum);
  m.def("permute_2D_sparse_data", &permute_2D_sparse_data);
  m.def("permute_1D_sparse_data", &permute_1D_sparse_data);
  m.def("invert_permute", &invert_permute);
  m.def("expand_into_jagged_permute", &expand_into_jagged_permute);
  m.def("offsets_range", &offsets_range);
  m.def("segment_sum_csr", &segment_sum_csr);
  m.def("keyed_jagged_index_select_dim1", &keyed_jagged_index_select_dim1);
  m.def("permute_pooled_embs", &permute_pooled_embs);
  m.def("bounds_check_indices", &bounds_check_indices);
  m.def("block_bucketize_sparse_features", &block_bucketize_sparse_features);

  // direct dispatcher kernels (direct.h): the registry installs them for these ops
  auto& t = direct::table();
  t.push_back(direct::entry<&asynchronous_complete_cumsum_rows>("asynchronous_complete_cumsum"));
  t.push_back(direct::entry<&asynchronous_exclusive_cumsum>("asynchronous_exclusive_cumsum"));
  t.push_back(direct::entry<&asynchronous_inclusive_cumsum>("asynchronous_inclusive_cumsum"));
  t.push_back(direct::entry<&permute_2D_sparse_data>("permute_2D_sparse_data"));
  t.push_back(direct::entry<&permute_1D_sparse_data>("permute_1D_sparse_data"));
  t.push_back(direct::entry<&invert_permute>("invert_permute"));
  t.push_back(direct::entry<&expand_into_jagged_permute>("expand_into_jagged_permute"));
  t.push_back(direct::entry<&offsets_range>("offsets_range"));
  t.push_back(direct::entry<&segment_sum_csr>("segment_sum_csr"));
  t.push_back(direct::entry<&keyed_jagged_index_select_dim1>("keyed_jagged_index_select_dim1"));
  t.push_back(direct::entry<&permute_pooled_embs>("permute_pooled_embs"));
  t.push_back(direct::entry<&permute_pooled_embs>("permute_pooled_embs_auto_grad"));
  t.push_back(direct::entry<&permute_pooled_embs>("permute_pooled_embs_auto_grad_split"));
  t.push_back(direct::entry<&permute_pooled_embs>("permute_pooled_embs_split"));
  t.push_back(direct::entry<&bounds_check_indices>("bounds_check_indices"));
  t.push_back(direct::entry<&block_bucketize_sparse_features>("block_bucketize_sparse_features"));
}

}  // namespace torchrec_ascend
