// CPU kernels for the table-batched embedding (TBE) ops (ops/embedding.py), in fbgemm's
// pt2-wrapper argument order:
//  * lookup forwards: pooled (sum / mean, optionally per-index weighted) and sequence (no pooling);
//  * fused backwards: per-row gradient, then SGD / Adagrad / RowWiseAdagrad / Adam applied in place
//    on the weights and optimizer states, once per distinct row;
//  * the data-parallel dense lookup (forward with its own autograd node, as fbgemm's kernel does,
//    and its backward: gradient of the dense weights and of the per-index weights).
// Semantics are the torch reference's (ops/reference/embedding.py): fbgemm's layout, fp32
// accumulation (fp64 for fp64 weights), indices past offsets[-1] belong to no bag (zero rows in
// sequence output, no gradient), and a row outside the weights is a ValueError (fbgemm trusts
// bounds_check_indices instead).
// Parallel over bags (pooled forward), indices (sequence forward) or distinct rows (backward: the
// (row, position) pairs are radix-sorted by row, so every row is read and written by one thread).
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "direct.h"
#include "interleaved_timing.h"
#include "isa.h"
#include "parallel.h"
#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

constexpr int64_t kPoolMean = 1, kPoolNone = 2;

std::vector<int64_t> i64(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// fbgemm SparseType -> dtype (FP32, FP16, BF16); fp64 weights always give fp64.
at::ScalarType out_dtype(const at::Tensor& w, int64_t output_dtype) {
  if (w.scalar_type() == at::kDouble) return at::kDouble;
  switch (output_dtype) {
    case 0: return at::kFloat;
    case 1: return at::kHalf;
    case 5: return at::kBFloat16;
    default: return w.scalar_type();
  }
}

// The tensor that holds the data: host (CPU training) when non-empty, else dev (either may be
// undefined: fbgemm's autograd passes None for the placements a table does not use).
const at::Tensor& pick(const at::Tensor& host, const at::Tensor& dev) {
  return host.defined() && host.numel() > 0 ? host : dev;
}

// o[d] += s * row[d]: the pooled inner loop.  fp32 gets an AVX2/FMA clone picked at load time
// (the extension is built for the baseline ISA); other types a generic loop.
__attribute__((target_clones("arch=haswell", "default")))
void axpy_f32(float* __restrict o, const float* __restrict row, float s, int64_t D) {
  for (int64_t d = 0; d < D; ++d) o[d] += s * row[d];
}

template <typename acc, typename scalar_t>
inline void axpy(acc* o, const scalar_t* row, acc s, int64_t D) {
  if constexpr (std::is_same_v<acc, float> && std::is_same_v<scalar_t, float>) {
    axpy_f32(o, row, s, D);
  } else {
    for (int64_t d = 0; d < D; ++d) o[d] += s * static_cast<acc>(row[d]);
  }
}

// sum of x[d]^2 over d < D in 16 independent partial sums: one running sum is a chain of
// dependent adds (the compiler keeps a float sum in order), ~4 cycles per element, which made
// the RowWiseAdagrad backward 2.2x fbgemm's CPU time at D=256.  fp32 gets an AVX2/FMA clone.
__attribute__((target_clones("arch=haswell", "default")))
float sum_sq_f32(const float* __restrict x, int64_t D) {
  float part[16] = {};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    for (int j = 0; j < 16; ++j) part[j] += x[d + j] * x[d + j];
  }
  float s = 0;
  for (; d < D; ++d) s += x[d] * x[d];
  for (int j = 0; j < 16; ++j) s += part[j];
  return s;
}

template <typename acc>
inline acc sum_sq(const acc* x, int64_t D) {
  if constexpr (std::is_same_v<acc, float>) {
    return sum_sq_f32(x, D);
  } else {
    acc s = 0;
    for (int64_t d = 0; d < D; ++d) s += x[d] * x[d];
    return s;
  }
}

// w[d] = a * w[d] - b * g[d]: the SGD and RowWiseAdagrad weight update, fp32 with AVX-512 and
// AVX2/FMA clones (the lambdas of fused_backward are built for the baseline ISA: SSE).
__attribute__((target_clones("avx512f", "arch=haswell", "default")))
void scale_sub_f32(float* __restrict w, const float* __restrict g, float a, float b, int64_t D) {
  for (int64_t d = 0; d < D; ++d) w[d] = a * w[d] - b * g[d];
}

constexpr int64_t kAhead = 8;  // rows prefetched ahead of the one being summed

// Ask for a row ahead of its use (rows are random: the hardware prefetcher cannot guess them),
// into L1, or into L2 only when `far` (see Source below).
template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t D, bool far = false) {
  const char* p = reinterpret_cast<const char*>(row);
  const int64_t bytes = D * static_cast<int64_t>(sizeof(scalar_t));
  if (far) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
  } else {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
  }
}

// Bags k < n_bags span [offs[k], offs[k + 1]) inside the N indices.
void check_offsets(const std::vector<int64_t>& offs, int64_t n_bags, int64_t N) {
  for (int64_t k = 0; k < n_bags; ++k) {
    TORCH_CHECK_VALUE(offs[k] >= 0 && offs[k] <= offs[k + 1] && offs[k + 1] <= N,
                      "offsets: bag ", k, " spans [", offs[k], ", ", offs[k + 1],
                      ") outside the ", N, " indices");
  }
}

// Where the rows a pooling kernel sums come from, which decides how far ahead they are fetched:
//  * kMemory: rows of the weights, random and mostly not cached (the forwards), where the CPU
//    gains by it (far_prefetch_pays: not on a Zen 2 AMD EPYC, whose forwards use kLlc).  The whole row
//    kFarAhead positions on is asked for into L2 (_MM_HINT_T1) and the block of the row
//    kNearAhead on into L1.  Prefetching only into L1 (T0, 8-16 rows ahead) held the full-shape
//    forward at 12.8 ms for 130 MB of rows: the L1's few miss buffers were the limit; with the L2
//    stage it took 6.7-7.4 ms (AVX-512 AMD EPYC, D=256, 4 x 50k-row tables; the AVX2 loop on the
//    same CPU: 11.7 -> 7.0-7.9 ms, standalone loop timings).
//  * kLlc: rows of weights small enough to stay in the last-level cache (at most half of it:
//    fits_llc with kWeightsLlcShare, csrc/isa.h): only the L1 stage.  There the L2 stage's
//    sixteen extra prefetches per row cost more than they hide (quick-shape forward, 4 x 10k
//    rows, 41 MB: 0.93 ms with it, 0.78-0.83 without, fbgemm 0.75-0.79).  The AVX-512 sum asks
//    for the first kLlcLines of a 16-line block kLlcAhead rows on and leaves the rest of the row
//    to the L2's stream prefetcher (the row is one ascending run): fewer software prefetches
//    hold fewer of the L1's miss buffers.  Quick-shape forward against fbgemm (thread CPU time,
//    alternating): all 16 lines 8 ahead 1.005x, 8 lines 12 ahead 0.97x, 12 lines 10 ahead
//    0.96x, none 1.03x.  2-core Intel Xeon, AVX-512, 480 MB L3 reported.  The AVX2 sum asks for
//    every line of its block, llc_ahead_avx2() rows on: about kLlcLinesInFlight lines in flight.
//  * kCache: slices of the output gradient, which sits in L2 (the backward's per-row sums): only
//    the L1 stage, kCacheAhead positions on.
enum class Source { kMemory, kLlc, kCache };
constexpr int64_t kFarAhead = 32, kNearAhead = 8, kCacheAhead = 16;
constexpr int64_t kLlcAhead = 10, kLlcLines = 12;
// The AVX2 kLlc sum's rows ahead for a block of kV registers (kV / 2 lines of a row): about 40
// lines in flight, 5 to 16 rows on.  Full-shape forwards (D=256, 4 x 50k rows, AMD EPYC Zen 2,
// against fbgemm, alternating, thread CPU time): the two 128-column passes of the sum 8 ahead
// 1.03-1.04x, 5 ahead 1.00-1.01x (3: 1.05x, 4 and 6: 1.01-1.02x); the weighted sum's third pass
// (16 columns, one line a row) 5 ahead 1.02x, 10 ahead 1.005-1.009x, 16 ahead 0.997-1.003x, 40
// ahead 1.02x.
constexpr int64_t kLlcLinesInFlight = 40;
constexpr int64_t llc_ahead_avx2(int kV) {
  return std::clamp<int64_t>(kLlcLinesInFlight / std::max(kV / 2, 1), 5, 16);
}
// Weights up to half the LLC count as resident: the full-shape forward (4 x 50k rows, 205 MB;
// the Xeon reports 480 MB) took 0.93-0.95x fbgemm's time on the kLlc path against 0.98-1.00x on
// kMemory (6 alternating runs, thread CPU time).
constexpr int64_t kWeightsLlcShare = 2;
constexpr int64_t kLlcPrefixBytes = 256;  // RowPrefetcher's share of an LLC-resident row

// p, hidden from the optimiser: without it GCC folds a block's column offset d0 into sixteen
// per-load offsets (rows[i] + (4 * d0 + 64 * j)), which it keeps in spare vector registers and on
// the stack and reloads for every row; with it every load is rows[i] + d0 plus a constant.
template <typename T>
inline T* opaque(T* p) {
  asm("" : "+r"(p));
  return p;
}

// The pooling kernels take the rows they sum as `Rows`, where rows[i] is row i's first float:
// an array of row pointers (const float* const*: the backward's gradient slices) or IndexedRows.

// Rows of one table addressed by their indices: row i is base + idx[i] * D (the indices checked
// first: any_row_outside).  The pooled forward sums these, as fbgemm's kernel does; a pass writing
// the chunk's checked row pointers for the sums to read back cost ~2.5% of the full-shape forward
// (perf, AMD EPYC Zen 2, AVX2, where that pass was scalar).
template <typename index_t>
struct IndexedRows {
  const float* base;
  const index_t* idx;
  int64_t D;
  const float* operator[](int64_t i) const { return base + static_cast<int64_t>(idx[i]) * D; }
};

// rows[i + ahead] where that is readable (rows[] may run past the bag into the next ones:
// n_ahead rows are readable), else rows[i], which is already cached: a branch-free prefetch.
template <typename Rows>
inline const char* row_ahead(const Rows& rows, int64_t i, int64_t ahead, int64_t n_ahead,
                             int64_t d0) {
  return opaque(reinterpret_cast<const char*>(rows[i + ahead < n_ahead ? i + ahead : i] + d0));
}

// The whole row kFarAhead positions on into L2 (kMemory only), D floats.
template <Source kSrc, typename Rows>
inline void prefetch_far(const Rows& rows, int64_t i, int64_t n_ahead, int64_t D) {
  if constexpr (kSrc == Source::kMemory) {
    const char* p = row_ahead(rows, i, kFarAhead, n_ahead, 0);
    for (int64_t b = 0; b < D * 4; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
  }
}

constexpr int64_t near_ahead(Source src) { return src == Source::kCache ? kCacheAhead : kNearAhead; }

// Asks for p's line into L1 after v is computed, in program order (v is only named: the
// instruction does not read it).  With _mm_prefetch GCC hoisted a row's eight prefetches above its
// sixteen adds, and perf put 16% of the quick-shape sum's samples on one of them (a burst of
// prefetches waits for the L1's miss buffers); so they stay between the adds, as in fbgemm's kernel.
__attribute__((target("avx2"), always_inline)) inline void prefetch_after(const char* p, __m256 v) {
  asm volatile("prefetcht0 %1" : : "x"(v), "m"(*p));
}

// Adds row i's block (d0 on, 8 kV columns; times s[i] when kWeighted) to a[], asking for the same
// block of row `ahead` (a row pointer) into L1 when kPrefetch.
template <bool kWeighted, bool kPrefetch, int kV, typename Rows>
__attribute__((target("avx2,fma"), always_inline)) inline void add_row_block_avx2(
    __m256* a, const Rows& rows, const float* s, int64_t i, const float* ahead, int64_t d0) {
  const char* p = nullptr;
  if constexpr (kPrefetch) p = opaque(reinterpret_cast<const char*>(ahead + d0));
  const float* r = opaque(rows[i] + d0);
  if constexpr (kWeighted) {
    const __m256 sv = _mm256_set1_ps(s[i]);
#pragma GCC unroll 16
    for (int j = 0; j < kV; ++j) {
      a[j] = _mm256_fmadd_ps(sv, _mm256_loadu_ps(r + 8 * j), a[j]);
      if (kPrefetch && j % 2 == 0) prefetch_after(p + 32 * j, a[j]);
    }
  } else {
#pragma GCC unroll 16
    for (int j = 0; j < kV; ++j) {
      a[j] = _mm256_add_ps(_mm256_loadu_ps(r + 8 * j), a[j]);
      if (kPrefetch && j % 2 == 0) prefetch_after(p + 32 * j, a[j]);
    }
  }
}

// o[0, D) = sum_i s[i] * rows[i][0, D) (s == nullptr: all 1; 0 for no rows), fp32 with AVX2/FMA:
// columns in blocks of 8 kV held in kV registers across all rows of the bag (the output is
// written once per block, not once per row, and need not be zeroed first); the same block of a
// row ahead (llc_ahead_avx2 for kLlc, else near_ahead) is prefetched into L1 and, in the first
// block's pass, the whole row further ahead into L2 (see Source).  The rows with no readable row
// that far on (the chunk's last few) are summed by a second loop without the prefetch, so the
// main loop has no per-row clamp of the row ahead (full-shape forward 8 rows ahead, Zen 2:
// 1.03-1.04x -> 1.01-1.03x fbgemm's time).  The weighted and unweighted sums are separate loops
// (no per-row test of s).  Blocks of 128 columns (all sixteen registers: the adds take their row
// operand from memory) read a D=256 row in two passes, not four: quick-shape forward
// 1.08-1.13x -> 1.02-1.05x fbgemm's time (AMD EPYC Zen 2, AVX2); the weighted sum's blocks are of
// 120 (fifteen sums beside the scale's register; sixteen kept two of them on the stack).
template <bool kWeighted, Source kSrc, int kV, typename Rows>
__attribute__((target("avx2,fma"))) inline void pool_block_avx2(
    float* o, const Rows& rows, const float* s, int64_t n, int64_t n_ahead, int64_t d0,
    int64_t D) {
  constexpr int64_t ahead = kSrc == Source::kLlc ? llc_ahead_avx2(kV) : near_ahead(kSrc);
  const int64_t n_main = std::max<int64_t>(0, std::min(n, n_ahead - ahead));
  __m256 a[kV];
#pragma GCC unroll 16
  for (int j = 0; j < kV; ++j) a[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i < n_main; ++i) {
    if (d0 == 0) prefetch_far<kSrc>(rows, i, n_ahead, D);
    add_row_block_avx2<kWeighted, true, kV>(a, rows, s, i, rows[i + ahead], d0);
  }
  for (; i < n; ++i) add_row_block_avx2<kWeighted, false, kV>(a, rows, s, i, nullptr, d0);
#pragma GCC unroll 16
  for (int j = 0; j < kV; ++j) _mm256_storeu_ps(o + d0 + 8 * j, a[j]);
}

// The blocks of 8 kV columns from d0 on while whole ones fit D (d0 is left after the last).
template <Source kSrc, int kV, typename Rows>
__attribute__((target("avx2,fma"))) inline void pool_blocks_avx2(float* o, const Rows& rows, const float* s,
                                                                 int64_t n, int64_t n_ahead, int64_t& d0, int64_t D) {
  for (; d0 + 8 * kV <= D; d0 += 8 * kV) {
    if (s) {
      pool_block_avx2<true, kSrc, kV>(o, rows, s, n, n_ahead, d0, D);
    } else {
      pool_block_avx2<false, kSrc, kV>(o, rows, s, n, n_ahead, d0, D);
    }
  }
}

template <Source kSrc, typename Rows>
__attribute__((target("avx2,fma")))
void pool_f32_avx2(float* o, const Rows& rows, const float* s, int64_t n, int64_t n_ahead, int64_t D) {
  int64_t d0 = 0;
  if (s) {
    pool_blocks_avx2<kSrc, 15>(o, rows, s, n, n_ahead, d0, D);
  } else {
    pool_blocks_avx2<kSrc, 16>(o, rows, s, n, n_ahead, d0, D);
  }
  pool_blocks_avx2<kSrc, 8>(o, rows, s, n, n_ahead, d0, D);
  pool_blocks_avx2<kSrc, 4>(o, rows, s, n, n_ahead, d0, D);
  pool_blocks_avx2<kSrc, 2>(o, rows, s, n, n_ahead, d0, D);
  pool_blocks_avx2<kSrc, 1>(o, rows, s, n, n_ahead, d0, D);
  if (d0 < D) {
    std::fill(o + d0, o + D, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float f = s ? s[i] : 1.0f;
      for (int64_t d = d0; d < D; ++d) o[d] += f * rows[i][d];
    }
  }
}

// The vector paths isa() allows now (csrc/isa.h: the CPU's, capped in tests).
inline bool have_avx2() { return isa() >= Isa::kAvx2; }
inline bool have_avx512() { return isa() >= Isa::kAvx512; }

// pool_f32_avx2 with AVX-512: columns in blocks of 256 held in sixteen zmm registers, so a row of
// up to 256 floats is read in one pass (the blocks of 64 read a D=256 row four times).
template <bool kWeighted, Source kSrc, typename Rows>
__attribute__((target("avx512f"))) inline void pool_block_avx512(
    float* o, const Rows& rows, const float* s, int64_t n, int64_t n_ahead, int64_t d0,
    int64_t D) {
  __m512 a[16];
  for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    if (d0 == 0) prefetch_far<kSrc>(rows, i, n_ahead, D);
    constexpr int64_t kAheadRows = kSrc == Source::kLlc ? kLlcAhead : near_ahead(kSrc);
    constexpr int kLines = kSrc == Source::kLlc ? kLlcLines : 16;  // of the block's 16
    const char* p = row_ahead(rows, i, kAheadRows, n_ahead, d0);
    for (int c = 0; c < 64 * kLines; c += 64) _mm_prefetch(p + c, _MM_HINT_T0);
    const float* r = opaque(rows[i] + d0);
    if constexpr (kWeighted) {
      const __m512 sv = _mm512_set1_ps(s[i]);
      for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(sv, _mm512_loadu_ps(r + 16 * j), a[j]);
    } else {
      for (int j = 0; j < 16; ++j) a[j] = _mm512_add_ps(_mm512_loadu_ps(r + 16 * j), a[j]);
    }
  }
  for (int j = 0; j < 16; ++j) _mm512_storeu_ps(o + d0 + 16 * j, a[j]);
}

template <Source kSrc, typename Rows>
__attribute__((target("avx512f")))
void pool_f32_avx512(float* o, const Rows& rows, const float* s, int64_t n, int64_t n_ahead,
                     int64_t D) {
  int64_t d0 = 0;
  for (; d0 + 256 <= D; d0 += 256) {
    if (s) {
      pool_block_avx512<true, kSrc>(o, rows, s, n, n_ahead, d0, D);
    } else {
      pool_block_avx512<false, kSrc>(o, rows, s, n, n_ahead, d0, D);
    }
  }
  for (; d0 + 16 <= D; d0 += 16) {  // the rest, sixteen columns at a time
    __m512 a = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
      if (d0 == 0) prefetch_far<kSrc>(rows, i, n_ahead, D);  // D < 256: no block pass did
      a = _mm512_fmadd_ps(_mm512_set1_ps(s ? s[i] : 1.0f), _mm512_loadu_ps(rows[i] + d0), a);
    }
    _mm512_storeu_ps(o + d0, a);
  }
  if (d0 < D) {
    std::fill(o + d0, o + D, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float f = s ? s[i] : 1.0f;
      for (int64_t d = d0; d < D; ++d) o[d] += f * rows[i][d];
    }
  }
}

// The pooled sum of one bag (or one row's gradient), written to o[0, D) (no need to zero it), on
// the widest path the CPU has (callers check have_avx2() first).
template <Source kSrc, typename Rows>
inline void pool_f32(float* o, const Rows& rows, const float* s, int64_t n, int64_t n_ahead,
                     int64_t D) {
  if (have_avx512()) {
    pool_f32_avx512<kSrc>(o, rows, s, n, n_ahead, D);
  } else {
    pool_f32_avx2<kSrc>(o, rows, s, n, n_ahead, D);
  }
}

// Whether the two-stage prefetch of Source::kMemory pays over Source::kLlc's L1 stage alone for
// rows that come from memory, on this CPU.  It depends on what the CPU does with a prefetch into
// L2: the D=256 full-shape forward (4 x 50k rows, 205 MB) took 6.7-7.4 ms with it and 12.8 ms
// without on an AVX-512 AMD EPYC, but 11.5-12.5 ms with it and 9.4-10.0 ms without on a Zen 2
// AMD EPYC (fbgemm 9.1-9.7 ms; the whole row 32 ahead is more than its L1 holds), and the Xeon's
// was no faster with it.  Measured once per process, on first use: both sums over bags of 64
// random rows (D=256) of a 64 MiB table, past the L3 a core sees on those CPUs (16-32 MiB per
// core complex), fresh rows every run, 7 interleaved rounds (interleaved_timing.h; ~30 ms, most
// of it faulting the table in).
static bool far_prefetch_pays() {
  static const bool pays = [] {
    constexpr int64_t kD = 256, kRows = (int64_t(64) << 20) / (kD * 4), kBag = 64, kBags = 64, kRounds = 7;
    constexpr int64_t kPerRun = kBag * kBags;
    std::vector<float> table(kRows * kD, 1.0f), out(kD);
    std::vector<int64_t> idx(kPerRun * 2 * (kRounds + 1));
    uint64_t x = 0x9E3779B97F4A7C15ull;  // fixed random rows
    for (auto& r : idx) r = static_cast<int64_t>(next_fixed_random(x) % static_cast<uint64_t>(kRows));
    int64_t run = 0;
    const std::vector<double> med = interleaved_median_seconds(2, kRounds, [&](size_t i) {
      const int64_t* rp = idx.data() + (run++) * kPerRun;  // rows no earlier run read
      for (int64_t b = 0; b < kBags; ++b) {
        const IndexedRows<int64_t> bag{table.data(), rp + b * kBag, kD};
        const int64_t ahead = kPerRun - b * kBag;
        if (i == 0) pool_f32<Source::kMemory>(out.data(), bag, nullptr, kBag, ahead, kD);
        else pool_f32<Source::kLlc>(out.data(), bag, nullptr, kBag, ahead, kD);
      }
    });
    return med[0] < med[1];
  }();
  return pays;
}

// -1: far_prefetch_pays() decides; 0 / 1: the two-stage prefetch forced off / on (tests: both
// paths run on any CPU; _set_far_prefetch).
std::atomic<int> far_prefetch_override{-1};
int set_far_prefetch(int mode) { return far_prefetch_override.exchange(mode); }
static bool use_far_prefetch() {
  const int o = far_prefetch_override.load(std::memory_order_relaxed);
  return o >= 0 ? o == 1 : far_prefetch_pays();
}

// Prefetches the row of position i + kAhead while position i is summed, across bag ends (short
// bags are the common case: stopping at a bag's end would leave their rows unfetched).  Bags
// [k0, k1) cover positions [offs[k0], offs[k1]); advance() is called with ascending i.  At most
// the first `max_dim` elements of a row are asked for (kLlcPrefixBytes for weights in the LLC: the L2's
// stream prefetcher brings the rest of the ascending row, and fewer software prefetches hold
// fewer L1 miss buffers; the quick-shape nobag forward went 1.00 -> 0.98x fbgemm's time with the
// first 512 bytes and 0.97-0.98x with the first 256 (1024: 1.00x), 2-core Intel Xeon).
template <typename scalar_t, typename index_t>
struct RowPrefetcher {
  const std::vector<int64_t>& offs;
  const std::vector<int64_t>& w_off;
  const int64_t* dims;  // per feature, or nullptr: every feature has dim D
  int64_t D, B, end, wn;
  const scalar_t* wp;
  const index_t* ip;
  int64_t kp;  // bag of the prefetched position
  int64_t max_dim = std::numeric_limits<int64_t>::max();
  int64_t tp = -1, base = 0, Dp = 0;  // its table, the table's first weight and dim (tp < 0: not yet)

  void advance(int64_t i) {
    const int64_t j = i + kAhead;
    if (j >= end) return;
    bool moved = tp < 0;
    while (offs[kp + 1] <= j) {
      ++kp;
      moved = true;
    }
    if (moved) {  // the table of a new bag: one division per bag, not per row
      tp = kp / B;
      base = w_off[tp];
      Dp = dims ? dims[tp] : D;
    }
    const int64_t next = base + static_cast<int64_t>(ip[j]) * Dp;
    if (next >= 0 && next + Dp <= wn) prefetch_row(wp + next, std::min(Dp, max_dim));
  }
};

[[noreturn]] __attribute__((noinline, cold)) void row_outside(int64_t pos, int64_t idx) {
  TORCH_CHECK_VALUE(false, "indices: indices[", pos, "]=", idx, " addresses a row outside the "
                    "weights (run bounds_check_indices first)");
  __builtin_unreachable();
}

// The row of indices[pos] = idx, starting at `start`, lies inside the weights.  Inlined into the
// per-index loops, with the message built out of line (as a call per index it cost a few % of
// the pooled forward).
template <typename index_t>
inline __attribute__((always_inline)) void check_row(int64_t start, int64_t D, int64_t numel,
                                                     int64_t pos, index_t idx) {
  if (__builtin_expect(!(idx >= 0 && start >= 0 && start + D <= numel), 0)) {
    row_outside(pos, static_cast<int64_t>(idx));
  }
}

// Whether an index of idx[0, n) lies outside [0, last], four at a time with AVX2 (callers check
// have_avx2()); the caller finds the bad one (check_row names it).  Checking a bag just before
// summing it brings its indices into L1 for the sum.
template <typename index_t>
__attribute__((target("avx2"))) bool any_row_outside(const index_t* idx, int64_t n, int64_t last) {
  const __m256i hi = _mm256_set1_epi64x(last), zero = _mm256_setzero_si256();
  __m256i bad = zero;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256i x;
    if constexpr (sizeof(index_t) == 8) {
      x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + i));
    } else {
      x = _mm256_cvtepi32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(idx + i)));
    }
    bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_cmpgt_epi64(x, hi), _mm256_cmpgt_epi64(zero, x)));
  }
  bool out = !_mm256_testz_si256(bad, bad);
  for (; i < n; ++i) out |= idx[i] < 0 || static_cast<int64_t>(idx[i]) > last;
  return out;
}

at::Tensor pooled(const at::Tensor& weights_in, const at::Tensor& weights_offsets,
                  const at::Tensor& D_offsets, int64_t total_D, const at::Tensor& indices_in,
                  const at::Tensor& offsets_in, int64_t pooling_mode,
                  const c10::optional<at::Tensor>& indice_weights, int64_t output_dtype) {
  auto w = weights_in.contiguous();
  auto indices = indices_in.contiguous();
  const auto w_off = i64(weights_offsets);
  const auto d_off = i64(D_offsets);
  const auto offs = i64(offsets_in);
  const int64_t T = static_cast<int64_t>(w_off.size());
  TORCH_CHECK_VALUE(T > 0 && static_cast<int64_t>(d_off.size()) == T + 1,
                    "D_offsets: needs len(weights_offsets) + 1 entries");
  const int64_t B = (static_cast<int64_t>(offs.size()) - 1) / T;
  const int64_t N = indices.numel();
  const at::ScalarType acc_t = w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Every bag zeroes its own slice just before it is summed (in L1 then), when the bags' slices
  // cover the output; at::zeros of the whole output cost ~1.3% of the quick-shape forward.
  const bool bags_cover = d_off[T] == total_D && d_off[0] == 0;
  auto out = bags_cover ? at::empty({B, total_D}, w.options().dtype(acc_t))
                        : at::zeros({B, total_D}, w.options().dtype(acc_t));
  at::Tensor iw;
  if (indice_weights.has_value() && indice_weights->numel() > 0) {
    iw = indice_weights->to(acc_t).contiguous();
    TORCH_CHECK_VALUE(iw.numel() == N, "indice_weights: needs one weight per index");
  }
  check_offsets(offs, T * B, N);
  const int64_t wn = w.numel();
  std::vector<int64_t> dims(T);
  for (int64_t t = 0; t < T; ++t) dims[t] = d_off[t + 1] - d_off[t];
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, w.scalar_type(), "tbe_pooled", [&] {
    using acc = at::opmath_type<scalar_t>;
    const scalar_t* wp = w.data_ptr<scalar_t>();
    acc* op = out.data_ptr<acc>();
    const acc* iwp = iw.defined() ? iw.data_ptr<acc>() : nullptr;
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "tbe_pooled_idx", [&] {
      const index_t* ip = indices.data_ptr<index_t>();
      const int64_t work = (offs[T * B] - offs[0]) * std::max<int64_t>(total_D / T, 1);
      const bool blocked = std::is_same_v<scalar_t, float> && have_avx2();
      // the blocked sum for where the weights' rows come from (see Source; far_prefetch_pays)
      const bool resident = fits_llc(wn * static_cast<int64_t>(sizeof(scalar_t)), kWeightsLlcShare);
      using Rows = IndexedRows<index_t>;
      const auto pool = blocked && !resident && use_far_prefetch() ? &pool_f32<Source::kMemory, Rows>
                                                                     : &pool_f32<Source::kLlc, Rows>;
      parallel_over(T * B, work, [&](int64_t k0, int64_t k1) {
        RowPrefetcher<scalar_t, index_t> ahead{offs, w_off, dims.data(), 0, B, offs[k1], wn, wp, ip, k0};
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t t = k / B, b = k % B;
          const int64_t D = d_off[t + 1] - d_off[t];
          acc* o = op + b * total_D + d_off[t];
          // the blocked sums write the bag's slice; the scalar loop adds to it
          if (bags_cover && !blocked) std::memset(static_cast<void*>(o), 0, sizeof(acc) * D);
          if (blocked) {
            // fp32 on AVX2: the bag's indices checked (a bad one raises, named), then its blocked
            // sum, prefetching rows ahead up to the end of the chunk's bags of this table (one base)
            const int64_t base = w_off[t], first = offs[k], n = offs[k + 1] - first;
            const int64_t room = D > 0 ? wn - base - D : -1;  // the last row's start
            if (room < 0 || any_row_outside(ip + first, n, room / D)) {
              for (int64_t i = first; i < first + n; ++i) {
                check_row(base + static_cast<int64_t>(ip[i]) * D, D, wn, i, ip[i]);
              }
            }
            const float* sw = iwp ? reinterpret_cast<const float*>(iwp) + first : nullptr;
            const int64_t n_ahead = offs[std::min(k1, (t + 1) * B)] - first;
            pool(reinterpret_cast<float*>(o),
                 Rows{reinterpret_cast<const float*>(wp) + base, ip + first, D}, sw,
                 n, n_ahead, D);
          } else {
            for (int64_t i = offs[k]; i < offs[k + 1]; ++i) {
              const int64_t start = w_off[t] + static_cast<int64_t>(ip[i]) * D;
              check_row(start, D, wn, i, ip[i]);
              ahead.advance(i);
              axpy<acc, scalar_t>(o, wp + start, iwp ? iwp[i] : acc(1), D);
            }
          }
          const int64_t L = offs[k + 1] - offs[k];
          if (pooling_mode == kPoolMean && L > 0) {
            const acc inv = acc(1) / static_cast<acc>(L);
            for (int64_t d = 0; d < D; ++d) o[d] *= inv;
          }
        }
      });
    });
  });
  const auto dt = out_dtype(w, output_dtype);
  return dt == acc_t ? out : out.to(dt);
}

// dst[0, bytes) = src[0, bytes) for one looked-up row, inlined with full-register copies on the
// vector path isa() allows (the tail by memcpy): a sequence lookup copies rows of 1 KiB (D=256
// fp32), where a memcpy call per row with its size dispatch cost ~3% of the quick-shape nobag
// forward (1.035-1.04x fbgemm's time with it, 2-core Intel Xeon, benchmarks/ops.py).
__attribute__((target("avx512f"))) inline void copy_row_avx512(char* d, const char* s,
                                                               int64_t bytes) {
  int64_t b = 0;
  for (; b + 64 <= bytes; b += 64) _mm512_storeu_si512(d + b, _mm512_loadu_si512(s + b));
  if (b < bytes) std::memcpy(d + b, s + b, bytes - b);
}

__attribute__((target("avx2"))) inline void copy_row_avx2(char* d, const char* s, int64_t bytes) {
  int64_t b = 0;
  for (; b + 32 <= bytes; b += 32) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + b),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + b)));
  }
  if (b < bytes) std::memcpy(d + b, s + b, bytes - b);
}

inline void copy_row(void* d, const void* s, int64_t bytes, Isa path) {
  switch (path) {
    case Isa::kAvx512: copy_row_avx512(static_cast<char*>(d), static_cast<const char*>(s), bytes); return;
    case Isa::kAvx2: copy_row_avx2(static_cast<char*>(d), static_cast<const char*>(s), bytes); return;
    default: std::memcpy(d, s, bytes);
  }
}

at::Tensor nobag(const at::Tensor& weights_in, const at::Tensor& weights_offsets, int64_t D,
                 const at::Tensor& indices_in, const at::Tensor& offsets_in, int64_t output_dtype) {
  auto w = weights_in.contiguous();
  auto indices = indices_in.contiguous();
  const auto w_off = i64(weights_offsets);
  const auto offs = i64(offsets_in);
  const int64_t T = static_cast<int64_t>(w_off.size());
  TORCH_CHECK_VALUE(T > 0, "weights_offsets: need at least one feature");
  const int64_t B = (static_cast<int64_t>(offs.size()) - 1) / T;
  const int64_t N = indices.numel();
  const auto dt = out_dtype(w, output_dtype);
  auto out = empty_output({N, D}, w.options().dtype(dt));
  check_offsets(offs, T * B, N);
  const int64_t end = T * B > 0 ? offs[T * B] : 0;
  const int64_t wn = w.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, w.scalar_type(), "tbe_nobag", [&] {
    using w_t = scalar_t;
    const w_t* wp = w.data_ptr<w_t>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "tbe_nobag_out", [&] {
      using out_t = scalar_t;
      out_t* op = out.data_ptr<out_t>();
      AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "tbe_nobag_idx", [&] {
        const index_t* ip = indices.data_ptr<index_t>();
        // rows of indices in no bag are zero
        for (int64_t i = std::max<int64_t>(end, 0); i < N; ++i) std::fill(op + i * D, op + (i + 1) * D, out_t(0));
        for (int64_t i = 0; i < std::min(offs[0], N); ++i) std::fill(op + i * D, op + (i + 1) * D, out_t(0));
        const Isa path = isa();
        const bool in_llc = fits_llc(wn * static_cast<int64_t>(sizeof(w_t)), kWeightsLlcShare);
        parallel_over(T * B, (end - offs[0]) * D, [&](int64_t k0, int64_t k1) {
          RowPrefetcher<w_t, index_t> ahead{offs, w_off, nullptr, D, B, offs[k1], wn, wp, ip, k0};
          if (in_llc) ahead.max_dim = kLlcPrefixBytes / static_cast<int64_t>(sizeof(w_t));
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t t = k / B;
            for (int64_t i = offs[k]; i < offs[k + 1]; ++i) {
              const int64_t start = w_off[t] + static_cast<int64_t>(ip[i]) * D;
              check_row(start, D, wn, i, ip[i]);
              ahead.advance(i);
              const auto* row = wp + start;
              out_t* o = op + i * D;
              if constexpr (std::is_same_v<out_t, w_t>) {
                copy_row(o, row, static_cast<int64_t>(sizeof(out_t)) * D, path);
              } else {
                for (int64_t d = 0; d < D; ++d) o[d] = static_cast<out_t>(row[d]);
              }
            }
          }
        });
      });
    });
  });
  return out;
}

// ------------------------------------------------------------------ backward: distinct rows

// A looked-up row at a position of `indices`; key: the row's flat start in the weights; bag: the
// bag t * B + b holding the position.  Carrying the bag in the hit keeps the per-hit work of the
// backward sequential: looking it up by position was a cache miss per hit (positions are in
// random order once sorted by row).
struct Hit {
  int64_t key;
  int32_t pos;
  int32_t bag;
};

// Stable LSD radix sort by key (0 <= key <= max_key, the low `zero_bits` bits of every key 0):
// positions stay ascending within a row, so a row's gradient is summed in index order
// (deterministic, like the reference's index_add).  The always-zero low bits (a row's flat start
// is a multiple of every table's offset and dim: 8 bits at D=256) are skipped, and the rest is
// split into passes of at most 11 bits: 50k-row tables at D=256 (keys < 2^26) take two passes of
// 9 bits, whose 512 write streams stay in the caches (two of 13 bits scattered into 8192).
void radix_sort(std::vector<Hit>& a, int64_t max_key, int zero_bits) {
  const int64_t top = max_key >> zero_bits;
  int bits = 0;
  while (bits < 63 && (top >> bits) > 0) ++bits;
  if (bits == 0 || a.size() < 2) return;
  const int passes = (bits + 10) / 11;
  const int digit = (bits + passes - 1) / passes;
  const int64_t mask = (int64_t(1) << digit) - 1;
  std::vector<Hit> tmp(a.size());
  std::vector<int64_t> count(mask + 2);
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = zero_bits + pass * digit;
    std::fill(count.begin(), count.end(), 0);
    for (const auto& h : a) ++count[((h.key >> shift) & mask) + 1];
    for (int64_t b = 0; b <= mask; ++b) count[b + 1] += count[b];
    for (const auto& h : a) tmp[count[(h.key >> shift) & mask]++] = h;
    a.swap(tmp);
  }
}

// The number of low bits that are 0 in every row start w_off[t] + idx * dims[t].
int zero_low_bits(const std::vector<int64_t>& w_off, const std::vector<int64_t>& dims) {
  int z = 62;
  for (size_t t = 0; t < w_off.size(); ++t) {
    if (w_off[t] != 0) z = std::min(z, __builtin_ctzll(static_cast<uint64_t>(w_off[t])));
    if (dims[t] != 0) z = std::min(z, __builtin_ctzll(static_cast<uint64_t>(dims[t])));
  }
  return z;
}

// The host-side shape of a lookup: T features x B bags, feature t's dim and output column.
struct Lookup {
  int64_t T = 0, B = 0, N = 0, max_D = 0, pooling_mode = 0;
  bool nobag = false;
  std::vector<int64_t> w_off, dims, d_begin, offs;
};

// Pooled when D_offsets is defined, else sequence with dim D for every feature.
Lookup describe(const at::Tensor& weights_offsets, const at::Tensor& D_offsets, int64_t D,
                const at::Tensor& offsets, int64_t N, int64_t pooling_mode) {
  Lookup L;
  L.w_off = i64(weights_offsets);
  L.T = static_cast<int64_t>(L.w_off.size());
  TORCH_CHECK_VALUE(L.T > 0, "weights_offsets: need at least one feature");
  L.offs = i64(offsets);
  TORCH_CHECK_VALUE(!L.offs.empty() && (L.offs.size() - 1) % L.T == 0,
                    "offsets: must have T * B + 1 entries");
  L.B = (static_cast<int64_t>(L.offs.size()) - 1) / L.T;
  TORCH_CHECK_VALUE(L.T * L.B < (int64_t(1) << 31), "offsets: more than 2^31 bags");
  L.N = N;
  L.nobag = !D_offsets.defined();
  L.pooling_mode = L.nobag ? kPoolNone : pooling_mode;
  if (L.nobag) {
    L.dims.assign(L.T, D);
    L.d_begin.assign(L.T, 0);
  } else {
    const auto d_off = i64(D_offsets);
    TORCH_CHECK_VALUE(static_cast<int64_t>(d_off.size()) == L.T + 1,
                      "D_offsets: needs len(weights_offsets) + 1 entries");
    for (int64_t t = 0; t < L.T; ++t) {
      L.dims.push_back(d_off[t + 1] - d_off[t]);
      L.d_begin.push_back(d_off[t]);
    }
  }
  L.max_D = *std::max_element(L.dims.begin(), L.dims.end());
  check_offsets(L.offs, L.T * L.B, N);
  return L;
}

// The distinct rows a lookup touched: row u is hits[seg[u] .. seg[u + 1]), sorted by key.
struct Rows {
  std::vector<Hit> hits;
  std::vector<int64_t> seg;
};

template <typename index_t>
Rows group_rows(const Lookup& L, const index_t* ip, int64_t weights_numel) {
  Rows r;
  const int64_t TB = L.T * L.B;
  const int64_t n = TB > 0 ? L.offs[TB] - L.offs[0] : 0;
  // positions and bags are stored in 32 bits (as fbgemm's CPU backward stores them)
  TORCH_CHECK_VALUE(L.N < (int64_t(1) << 31), "indices: the backward takes at most 2^31 - 1 "
                    "indices, got ", L.N);
  r.hits.resize(n);
  Hit* hp = r.hits.data();
  for (int64_t k = 0; k < TB; ++k) {
    const int64_t t = k / L.B, D = L.dims[t], base = L.w_off[t];
    for (int64_t p = L.offs[k]; p < L.offs[k + 1]; ++p) {
      const int64_t start = base + static_cast<int64_t>(ip[p]) * D;
      check_row(start, D, weights_numel, p, ip[p]);
      *hp++ = {start, static_cast<int32_t>(p), static_cast<int32_t>(k)};
    }
  }
  radix_sort(r.hits, weights_numel, zero_low_bits(L.w_off, L.dims));
  r.seg.reserve(n + 1);
  for (int64_t j = 0; j < n; ++j) {
    if (j == 0 || r.hits[j].key != r.hits[j - 1].key) r.seg.push_back(j);
  }
  r.seg.push_back(n);
  return r;
}

// Distinct rows whose weights / states are prefetched ahead: into L2 kRowsFar rows on, into L1
// kRowsAhead rows on (the two stages of the forward's Source::kMemory; with the L1 stage alone,
// 4 rows on, the RowWiseAdagrad backward took 1.17x fbgemm's time on an AVX-512 AMD EPYC).
constexpr int64_t kRowsAhead = 4, kRowsFar = 16;

// fused(start, t, idx, D, srcs, facs, n, n_ahead) of a for_each_row caller that has no fused
// fp32 kernel: declines every row.
struct NoFused {
  bool operator()(int64_t, int64_t, int64_t, int64_t, const float* const*, const float*, int64_t,
                  int64_t) const {
    return false;
  }
};

// For every distinct row, on one thread each: g[0, D) = sum over the row's hits of the output
// gradient's slice times the index's factor (per-index weight, then / L under MEAN), then
// update(start, t, idx, D, g) with t a feature owning the row and idx its local row id;
// ahead(start, t, idx, D, far) is called for the rows kRowsFar (far) and kRowsAhead further on
// (to prefetch what update will touch there).  On the fp32 AVX2 / AVX-512 path a row is first
// offered to fused(start, t, idx, D, srcs, facs, n, n_ahead): the row's n gradient slices (and
// factors, or nullptr when all are 1; n_ahead slices readable from srcs) for a kernel that sums
// and updates in one go; it returns false to leave the row to the sum + update above.
template <typename acc, typename Update, typename Ahead, typename Fused = NoFused>
void for_each_row(const Lookup& L, const Rows& r, const acc* grad, int64_t stride, const acc* iw,
                  Update&& update, Ahead&& ahead, Fused&& fused = Fused()) {
  const int64_t U = static_cast<int64_t>(r.seg.size()) - 1;
  const int64_t TB = L.T * L.B;
  const bool mean = L.pooling_mode == kPoolMean;
  // per bag: where its slice of the output gradient starts (pooled) and its length (MEAN)
  std::vector<int64_t> goff(L.nobag ? 0 : TB);
  std::vector<acc> blen(mean ? TB : 0);
  for (int64_t k = 0; k < static_cast<int64_t>(goff.size()); ++k) {
    goff[k] = (k % L.B) * stride + L.d_begin[k / L.B];
  }
  for (int64_t k = 0; k < static_cast<int64_t>(blen.size()); ++k) {
    blen[k] = static_cast<acc>(L.offs[k + 1] - L.offs[k]);
  }
  const Hit* hits = r.hits.data();
  const int64_t* seg = r.seg.data();
  // the feature owning a row, and the row's id inside its table (from the key: no index read)
  auto owner = [&](const Hit& h, int64_t* t, int64_t* idx) {
    *t = h.bag / L.B;
    *idx = (h.key - L.w_off[*t]) / L.dims[*t];
  };
  const int64_t work = static_cast<int64_t>(r.hits.size()) * L.max_D * 3;
  // the output gradient's slice and factor of hit j
  auto src_of = [&](const Hit& h) {
    return L.nobag ? grad + static_cast<int64_t>(h.pos) * stride : grad + goff[h.bag];
  };
  auto factor_of = [&](const Hit& h) {
    acc s = iw ? iw[h.pos] : acc(1);
    if (mean) s = s / blen[h.bag];
    return s;
  };
  constexpr bool kF32 = std::is_same_v<acc, float>;
  parallel_over(U, work, [&](int64_t u0, int64_t u1) {
    std::vector<acc> g(L.max_D);
    // fp32 on AVX2 / AVX-512: the chunk's gradient slices and factors first, then each row's sum
    // by the forward's blocked pooling kernels (which prefetch the slices of the hits ahead,
    // across rows); reused buffers: no page faults per call
    thread_local std::vector<const float*> srcs;
    thread_local std::vector<float> facs;
    const bool blocked = kF32 && have_avx2();
    const bool scaled = iw != nullptr || mean;
    const int64_t j0 = seg[u0], nj = seg[u1] - seg[u0];
    if (blocked) {
      srcs.resize(nj);
      if (scaled) facs.resize(nj);
      for (int64_t j = 0; j < nj; ++j) {
        srcs[j] = reinterpret_cast<const float*>(src_of(hits[j0 + j]));
        if (scaled) facs[j] = static_cast<float>(factor_of(hits[j0 + j]));
      }
    }
    for (int64_t u = u0; u < u1; ++u) {
      for (const int64_t far : {kRowsFar, kRowsAhead}) {
        if (u + far < u1) {
          const Hit& h = hits[seg[u + far]];
          int64_t t, idx;
          owner(h, &t, &idx);
          ahead(h.key, t, idx, L.dims[t], far == kRowsFar);
        }
      }
      int64_t t0, idx0;
      owner(hits[seg[u]], &t0, &idx0);
      const int64_t D = L.dims[t0];
      if (blocked) {
        const int64_t first = seg[u] - j0, n = seg[u + 1] - seg[u];
        const float* sf = scaled ? facs.data() + first : nullptr;
        if (fused(hits[seg[u]].key, t0, idx0, D, srcs.data() + first, sf, n, nj - first)) continue;
        float* gf = reinterpret_cast<float*>(g.data());
        pool_f32<Source::kCache>(gf, srcs.data() + first, sf, n, nj - first, D);
      } else {
        std::fill(g.begin(), g.begin() + D, acc(0));
        for (int64_t j = seg[u]; j < seg[u + 1]; ++j) {
          axpy<acc, acc>(g.data(), src_of(hits[j]), factor_of(hits[j]), D);
        }
      }
      update(hits[seg[u]].key, t0, idx0, D, g.data());
    }
  });
}

// One fp32 RowWiseAdagrad row update with AVX-512, for D a multiple of 16 up to 256 and no L2
// term in the gradient (weight_decay_mode != 1) nor max_norm: the row's gradient is summed from
// its n hits' slices (times facs[i], or 1 when facs is nullptr) in up to sixteen zmm registers,
// as pool_f32_avx512 does; then m += mean(g^2), and w = (1 - decay) * w - lr / (sqrt(m) + eps) * g
// (decay = lr * weight_decay for the decoupled modes, else 0), with g never leaving the registers
// (the general path stores it, reads it back for the square sum and again for the update).
// The weights row was prefetched by for_each_row's ahead().
// a[0, nv) = sum over i < n of facs[i] * srcs[i][0, 16 nv) (facs == nullptr: all 1), in zmm
// registers once inlined; the slices kCacheAhead on are prefetched into L1 (n_ahead readable).
__attribute__((target("avx512f"), always_inline)) inline void sum_slices_avx512(
    __m512* a, const float* const* srcs, const float* facs, int64_t n, int64_t n_ahead, int nv) {
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const char* p = row_ahead(srcs, i, kCacheAhead, n_ahead, 0);
    const float* r = opaque(srcs[i]);
    const __m512 sv = _mm512_set1_ps(facs ? facs[i] : 1.0f);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      if (j < nv) {
        _mm_prefetch(p + 64 * j, _MM_HINT_T0);
        a[j] = _mm512_fmadd_ps(sv, _mm512_loadu_ps(r + 16 * j), a[j]);
      }
    }
  }
}

// One fp32 SGD row update with AVX-512, D a multiple of 16 up to 256: w -= lr * g with the row's
// gradient g summed from its n hits' slices in registers (sum_slices_avx512), never stored: the
// general path writes g to a buffer and reads it back for the update (quick-shape SGD backward,
// 2-core Intel Xeon: 1.14-1.20x fbgemm's time with it).  The weights row was prefetched by
// for_each_row's ahead().
__attribute__((target("avx512f"))) void sgd_row_avx512(float* w, const float* const* srcs,
                                                       const float* facs, int64_t n,
                                                       int64_t n_ahead, int64_t D, float lr) {
  const int nv = static_cast<int>(D / 16);
  __m512 a[16];
  sum_slices_avx512(a, srcs, facs, n, n_ahead, nv);
  const __m512 step = _mm512_set1_ps(lr);
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    if (j < nv) {
      _mm512_storeu_ps(w + 16 * j, _mm512_fnmadd_ps(step, a[j], _mm512_loadu_ps(w + 16 * j)));
    }
  }
}

__attribute__((target("avx512f"))) void rowwise_adagrad_row_avx512(
    float* w, float* m, const float* const* srcs, const float* facs, int64_t n, int64_t n_ahead,
    int64_t D, float lr, float eps, float decay) {
  const int nv = static_cast<int>(D / 16);
  __m512 a[16];
  sum_slices_avx512(a, srcs, facs, n, n_ahead, nv);
  __m512 sq = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    if (j < nv) sq = _mm512_fmadd_ps(a[j], a[j], sq);
  }
  const float m_new = *m + _mm512_reduce_add_ps(sq) / static_cast<float>(D);
  *m = m_new;
  const __m512 mult = _mm512_set1_ps(lr / (std::sqrt(m_new) + eps));
  const __m512 keep = _mm512_set1_ps(1.0f - decay);
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    if (j < nv) {
      const __m512 wv = _mm512_loadu_ps(w + 16 * j);
      _mm512_storeu_ps(w + 16 * j, _mm512_fnmadd_ps(mult, a[j], _mm512_mul_ps(keep, wv)));
    }
  }
}

enum class Opt { kSgd, kAdagrad, kRowwiseAdagrad, kAdam };

struct Hyper {
  double lr = 0, eps = 0, beta1 = 0, beta2 = 0, weight_decay = 0, max_norm = 0;
  int64_t weight_decay_mode = 0, iter = 1;
};

// An optimizer state (host or dev tensor) and where each feature's slice starts; `work` is the
// state in the accumulation dtype (a copy, written back by finish(), when stored in another).
struct State {
  at::Tensor orig, work;
  std::vector<int64_t> off;
};

State state_of(const at::Tensor& host, const at::Tensor& dev, const at::Tensor& offsets,
               at::ScalarType acc_t, int64_t k) {
  State s;
  s.orig = pick(host, dev);
  TORCH_CHECK_VALUE(s.orig.defined(), "momentum", k, "_host / momentum", k, "_dev: neither holds the state");
  TORCH_CHECK_VALUE(s.orig.is_contiguous(), "momentum", k, ": must be contiguous (updated in place)");
  s.work = s.orig.scalar_type() == acc_t ? s.orig : s.orig.to(acc_t);
  s.off = i64(offsets);
  return s;
}

void finish(State& s) {
  if (!s.work.is_same(s.orig)) s.orig.copy_(s.work);
}

// Prefetches the state row that state_row() will return (nothing when it would be out of range).
template <typename acc>
void prefetch_state(const State& s, const acc* base, int64_t t, int64_t first, int64_t n, bool far) {
  if (t >= static_cast<int64_t>(s.off.size())) return;
  const int64_t start = s.off[t] + first;
  if (start >= 0 && start + n <= s.work.numel()) prefetch_row(base + start, n, far);
}

// The state row [start, start + n) of feature t's slice: checked against the state's size.
template <typename acc>
acc* state_row(State& s, acc* base, int64_t t, int64_t first, int64_t n, int64_t k) {
  TORCH_CHECK_VALUE(t < static_cast<int64_t>(s.off.size()), "momentum", k,
                    "_offsets: needs one entry per feature");
  const int64_t start = s.off[t] + first;
  TORCH_CHECK_VALUE(start >= 0 && start + n <= s.work.numel(), "momentum", k, ": feature ", t,
                    "'s row [", start, ", ", start + n, ") is outside the state of ",
                    s.work.numel(), " elements");
  return base + start;
}

at::Tensor grad_of(const at::Tensor& grad_in, const Lookup& L, at::ScalarType acc_t, int64_t* stride) {
  const int64_t rows = L.nobag ? L.N : L.B;
  const int64_t cols = L.nobag ? L.max_D : L.d_begin.back() + L.dims.back();
  TORCH_CHECK_VALUE(grad_in.dim() == 2 && grad_in.size(0) == rows && grad_in.size(1) >= cols,
                    "grad_output: expected [", rows, ", >= ", cols, "], got ", grad_in.sizes());
  *stride = grad_in.size(1);
  return grad_in.to(acc_t).contiguous();
}

// The fused backward: per-row gradient, then `opt` on the weights and states, in place.
void fused_backward(Opt opt, const at::Tensor& grad_in, const at::Tensor& weights, const Lookup& L,
                    const at::Tensor& indices_in, const at::Tensor& iw_in, std::vector<State>& states,
                    const Hyper& h) {
  TORCH_CHECK_VALUE(weights.is_contiguous(), "weights: must be contiguous (updated in place)");
  const at::ScalarType acc_t = weights.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  int64_t stride = 0;
  const auto grad = grad_of(grad_in, L, acc_t, &stride);
  const auto indices = indices_in.contiguous();
  const auto iw = iw_in.defined() && iw_in.numel() > 0 ? iw_in.to(acc_t).contiguous() : at::Tensor();
  TORCH_CHECK_VALUE(!iw.defined() || iw.numel() == L.N, "indice_weights: needs one weight per index");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, weights.scalar_type(), "tbe_backward", [&] {
    using acc = at::opmath_type<scalar_t>;
    scalar_t* wp = weights.data_ptr<scalar_t>();
    const acc* gp = grad.data_ptr<acc>();
    const acc* iwp = iw.defined() ? iw.data_ptr<acc>() : nullptr;
    const acc lr = static_cast<acc>(h.lr), eps = static_cast<acc>(h.eps);
    const acc wd = static_cast<acc>(h.weight_decay);
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "tbe_backward_idx", [&] {
      const index_t* ip = indices.data_ptr<index_t>();
      const Rows rows = group_rows(L, ip, weights.numel());
      const int64_t wn = weights.numel();
      switch (opt) {
        case Opt::kSgd:
          for_each_row(L, rows, gp, stride, iwp, [&](int64_t start, int64_t, int64_t, int64_t D, const acc* g) {
            scalar_t* w = wp + start;
            if constexpr (std::is_same_v<scalar_t, float>) {
              scale_sub_f32(reinterpret_cast<float*>(w), reinterpret_cast<const float*>(g), 1.0f, static_cast<float>(lr), D);
            } else {
              for (int64_t d = 0; d < D; ++d) w[d] = static_cast<scalar_t>(static_cast<acc>(w[d]) - lr * g[d]);
            }
          }, [&](int64_t start, int64_t, int64_t, int64_t D, bool far) {
            if (start + D <= wn) prefetch_row(wp + start, D, far);
          }, [&](int64_t start, int64_t, int64_t, int64_t D, const float* const* srcs,
                 const float* facs, int64_t n, int64_t n_ahead) {
            // fp32 weights: the fused AVX-512 row kernel (the cast is a no-op there; the lambda
            // is not a template, so the other dtypes compile this branch too)
            if constexpr (std::is_same_v<scalar_t, float>) {
              if (have_avx512() && D % 16 == 0 && D <= 256) {
                sgd_row_avx512(reinterpret_cast<float*>(wp + start), srcs, facs, n, n_ahead, D,
                               static_cast<float>(lr));
                return true;
              }
            }
            return false;
          });
          break;
        case Opt::kAdagrad: {
          acc* mp = states[0].work.data_ptr<acc>();
          for_each_row(L, rows, gp, stride, iwp, [&](int64_t start, int64_t t, int64_t idx, int64_t D, const acc* g) {
            scalar_t* w = wp + start;
            acc* m = state_row(states[0], mp, t, idx * D, D, 1);
            for (int64_t d = 0; d < D; ++d) {
              m[d] += g[d] * g[d];
              w[d] = static_cast<scalar_t>(static_cast<acc>(w[d]) - lr * g[d] / (std::sqrt(m[d]) + eps));
            }
          }, [&](int64_t start, int64_t t, int64_t idx, int64_t D, bool far) {
            if (start + D <= wn) prefetch_row(wp + start, D, far);
            prefetch_state(states[0], mp, t, idx * D, D, far);
          });
          break;
        }
        case Opt::kRowwiseAdagrad: {
          acc* mp = states[0].work.data_ptr<acc>();
          const int64_t mode = h.weight_decay_mode;
          const acc max_norm = static_cast<acc>(h.max_norm);
          for_each_row(L, rows, gp, stride, iwp, [&](int64_t start, int64_t t, int64_t idx, int64_t D, const acc* g) {
            scalar_t* w = wp + start;
            acc* m = state_row(states[0], mp, t, idx, 1, 1);
            acc sq = 0;
            if (mode == 1) {  // L2: the decay term is part of the gradient
              for (int64_t d = 0; d < D; ++d) {
                const acc ge = g[d] + wd * static_cast<acc>(w[d]);
                sq += ge * ge;
              }
            } else {
              sq = sum_sq(g, D);
            }
            const acc m_new = *m + sq / static_cast<acc>(D);
            *m = m_new;
            const acc mult = lr / (std::sqrt(m_new) + eps);
            const acc corr = mode == 1 ? acc(1) - mult * wd : (mode == 2 || mode == 5) ? acc(1) - lr * wd : acc(1);
            acc scale = 1;
            if (max_norm > 0) {
              acc norm = 0;
              for (int64_t d = 0; d < D; ++d) {
                const acc v = corr * static_cast<acc>(w[d]) - mult * g[d];
                norm += v * v;
              }
              norm = std::sqrt(norm);
              if (norm > max_norm) scale = max_norm / norm;
            }
            if constexpr (std::is_same_v<scalar_t, float>) {
              if (max_norm <= 0) {  // scale == 1
                scale_sub_f32(reinterpret_cast<float*>(w), reinterpret_cast<const float*>(g), static_cast<float>(corr), static_cast<float>(mult), D);
                return;
              }
            }
            for (int64_t d = 0; d < D; ++d) {
              w[d] = static_cast<scalar_t>((corr * static_cast<acc>(w[d]) - mult * g[d]) * scale);
            }
          }, [&](int64_t start, int64_t t, int64_t idx, int64_t D, bool far) {
            if (start + D <= wn) prefetch_row(wp + start, D, far);
            prefetch_state(states[0], mp, t, idx, 1, far);
          }, [&](int64_t start, int64_t t, int64_t idx, int64_t D, const float* const* srcs,
                 const float* facs, int64_t n, int64_t n_ahead) {
            // fp32 weights, no L2 term in the gradient, no max_norm: the fused AVX-512 row kernel
            if constexpr (std::is_same_v<scalar_t, float>) {
              if (have_avx512() && mode != 1 && max_norm <= 0 && D % 16 == 0 && D <= 256) {
                acc* m = state_row(states[0], mp, t, idx, 1, 1);
                const acc decay = (mode == 2 || mode == 5) ? lr * wd : acc(0);
                // (the casts are no-ops: scalar_t and acc are float here; the lambda is not a
                // template, so the other dtypes compile this branch too)
                rowwise_adagrad_row_avx512(reinterpret_cast<float*>(wp + start),
                                           reinterpret_cast<float*>(m), srcs, facs, n, n_ahead, D,
                                           static_cast<float>(lr), static_cast<float>(eps),
                                           static_cast<float>(decay));
                return true;
              }
            }
            return false;
          });
          break;
        }
        case Opt::kAdam: {
          acc* m1p = states[0].work.data_ptr<acc>();
          acc* m2p = states[1].work.data_ptr<acc>();
          const acc b1 = static_cast<acc>(h.beta1), b2 = static_cast<acc>(h.beta2);
          const acc c1 = static_cast<acc>(1.0 - std::pow(h.beta1, static_cast<double>(h.iter)));
          const acc c2 = static_cast<acc>(1.0 - std::pow(h.beta2, static_cast<double>(h.iter)));
          for_each_row(L, rows, gp, stride, iwp, [&](int64_t start, int64_t t, int64_t idx, int64_t D, const acc* g) {
            scalar_t* w = wp + start;
            acc* m1 = state_row(states[0], m1p, t, idx * D, D, 1);
            acc* m2 = state_row(states[1], m2p, t, idx * D, D, 2);
            for (int64_t d = 0; d < D; ++d) {
              m1[d] = b1 * m1[d] + (acc(1) - b1) * g[d];
              m2[d] = b2 * m2[d] + (acc(1) - b2) * g[d] * g[d];
              const acc wv = static_cast<acc>(w[d]);
              const acc upd = (m1[d] / c1) / (std::sqrt(m2[d] / c2) + eps) + wd * wv;
              w[d] = static_cast<scalar_t>(wv - lr * upd);
            }
          }, [&](int64_t start, int64_t t, int64_t idx, int64_t D, bool far) {
            if (start + D <= wn) prefetch_row(wp + start, D, far);
            prefetch_state(states[0], m1p, t, idx * D, D, far);
            prefetch_state(states[1], m2p, t, idx * D, D, far);
          });
          break;
        }
      }
    });
  });
  for (auto& s : states) finish(s);
}

// Gradient of the per-index weights: <output gradient slice, row> per index (times 1/L under
// MEAN), zero for features with feature_requires_grad[t] == 0.  [N], accumulation dtype.
at::Tensor grad_indice_weights(const at::Tensor& grad_in, const at::Tensor& weights_in, const Lookup& L,
                               const at::Tensor& indices_in, const at::Tensor& feature_requires_grad) {
  const auto w = weights_in.contiguous();
  const auto indices = indices_in.contiguous();
  const at::ScalarType acc_t = grad_in.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  int64_t stride = 0;
  const auto grad = grad_of(grad_in, L, acc_t, &stride);
  auto out = at::zeros({L.N}, grad.options());
  std::vector<int64_t> frg;
  if (feature_requires_grad.defined() && feature_requires_grad.numel() > 0) {
    frg = i64(feature_requires_grad);
    TORCH_CHECK_VALUE(static_cast<int64_t>(frg.size()) == L.T,
                      "feature_requires_grad: needs one entry per feature");
  }
  const int64_t TB = L.T * L.B;
  if (TB == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, w.scalar_type(), "tbe_grad_iw", [&] {
    using w_t = scalar_t;
    const w_t* wp = w.data_ptr<w_t>();
    AT_DISPATCH_FLOATING_TYPES(acc_t, "tbe_grad_iw_acc", [&] {
      using acc = scalar_t;
      const acc* gp = grad.data_ptr<acc>();
      acc* op = out.data_ptr<acc>();
      AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "tbe_grad_iw_idx", [&] {
        const index_t* ip = indices.data_ptr<index_t>();
        const int64_t wn = w.numel();
        parallel_over(TB, (L.offs[TB] - L.offs[0]) * L.max_D, [&](int64_t k0, int64_t k1) {
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t t = k / L.B, b = k % L.B, D = L.dims[t];
            if (!frg.empty() && frg[t] == 0) continue;
            const int64_t len = L.offs[k + 1] - L.offs[k];
            const acc f = L.pooling_mode == kPoolMean && len > 0 ? acc(1) / static_cast<acc>(len) : acc(1);
            const acc* src = gp + b * stride + L.d_begin[t];
            for (int64_t p = L.offs[k]; p < L.offs[k + 1]; ++p) {
              const int64_t start = L.w_off[t] + static_cast<int64_t>(ip[p]) * D;
              check_row(start, D, wn, p, ip[p]);
              acc dot = 0;
              for (int64_t d = 0; d < D; ++d) dot += src[d] * static_cast<acc>(wp[start + d]);
              op[p] = dot * f;
            }
          }
        });
      });
    });
  });
  return out;
}

// ------------------------------------------------------------------ dense (data-parallel) lookup

at::Tensor dense_forward(const at::Tensor& w, const at::Tensor& w_off, const at::Tensor& D_offsets,
                         int64_t total_D, int64_t max_D, const at::Tensor& indices, const at::Tensor& offsets,
                         int64_t pooling_mode, const at::Tensor& iw, int64_t output_dtype) {
  if (pooling_mode == kPoolNone) return nobag(w, w_off, max_D, indices, offsets, output_dtype);
  return pooled(w, w_off, D_offsets, total_D, indices, offsets, pooling_mode,
                iw.defined() ? c10::optional<at::Tensor>(iw) : c10::nullopt, output_dtype);
}

// (gradient of the weights, like them; gradient of the per-index weights, or an empty tensor
// when there are none, the lookup is a sequence one, or !want_giw).  The weights' values are
// read only for the per-index weights' gradient (w may be a zero-strided stand-in otherwise).
std::tuple<at::Tensor, at::Tensor> dense_backward(const at::Tensor& grad_in, const at::Tensor& w,
                                                  const at::Tensor& w_off, const at::Tensor& D_offsets,
                                                  int64_t max_D, const at::Tensor& indices_in,
                                                  const at::Tensor& offsets, int64_t pooling_mode,
                                                  const at::Tensor& iw_in, const at::Tensor& frg,
                                                  bool want_giw = true) {
  const bool nobag = pooling_mode == kPoolNone;
  const auto L = describe(w_off, nobag ? at::Tensor() : D_offsets, max_D, offsets, indices_in.numel(),
                          pooling_mode);
  const bool weighted = iw_in.defined() && iw_in.numel() > 0;
  const at::ScalarType acc_t = w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  int64_t stride = 0;
  const auto grad = grad_of(grad_in, L, acc_t, &stride);
  const auto indices = indices_in.contiguous();
  const auto iw = weighted && !nobag ? iw_in.to(acc_t).contiguous() : at::Tensor();
  TORCH_CHECK_VALUE(!iw.defined() || iw.numel() == L.N, "indice_weights: needs one weight per index");
  auto gw = at::zeros_like(w, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, w.scalar_type(), "dense_backward", [&] {
    using acc = at::opmath_type<scalar_t>;
    scalar_t* gwp = gw.data_ptr<scalar_t>();
    const acc* iwp = iw.defined() ? iw.data_ptr<acc>() : nullptr;
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "dense_backward_idx", [&] {
      const index_t* ip = indices.data_ptr<index_t>();
      const Rows rows = group_rows(L, ip, w.numel());
      for_each_row(L, rows, grad.data_ptr<acc>(), stride, iwp,
                   [&](int64_t start, int64_t, int64_t, int64_t D, const acc* g) {
                     for (int64_t d = 0; d < D; ++d) gwp[start + d] = static_cast<scalar_t>(g[d]);
                   },
                   [](int64_t, int64_t, int64_t, int64_t, bool) {});
    });
  });
  at::Tensor giw = at::empty({0}, iw_in.defined() ? iw_in.options() : grad_in.options());
  if (weighted && !nobag && want_giw) {
    giw = grad_indice_weights(grad_in, w, L, indices, frg).to(iw_in.scalar_type());
  }
  return {gw, giw};
}

// The dense lookup's own autograd node (fbgemm's CPU kernel records one too, so the op is
// differentiable when it stands in for fbgemm's kernel below the autograd key).
struct DenseLookupFn : public torch::autograd::Function<DenseLookupFn> {
  // iw, frg: optional (an undefined Tensor argument would be taken for a variable)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& w,
                            const c10::optional<at::Tensor>& iw_opt, const at::Tensor& w_off,
                            const at::Tensor& D_offsets, int64_t total_D, int64_t max_D, const at::Tensor& indices,
                            const at::Tensor& offsets, int64_t pooling_mode,
                            const c10::optional<at::Tensor>& frg_opt, int64_t output_dtype) {
    const at::Tensor iw = iw_opt.value_or(at::Tensor());
    // the weights are read only for the per-index weights' gradient: saved only then, so an
    // optimizer step between forward and backward (TorchRec's semi-sync pipeline on
    // data-parallel tables) leaves the graph valid
    const bool need_w = iw.defined() && iw.requires_grad();
    ctx->save_for_backward({need_w ? w : at::zeros({}, w.options()), w_off, D_offsets, indices, offsets});
    ctx->saved_data["need_w"] = need_w;
    ctx->saved_data["w_sizes"] = w.sizes().vec();
    ctx->saved_data["iw"] = iw_opt;  // (save_for_backward refuses undefined tensors here)
    ctx->saved_data["frg"] = frg_opt;
    ctx->saved_data["max_D"] = max_D;
    ctx->saved_data["pooling_mode"] = pooling_mode;
    return dense_forward(w, w_off, D_offsets, total_D, max_D, indices, offsets, pooling_mode, iw, output_dtype);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto iw = ctx->saved_data["iw"].toOptional<at::Tensor>().value_or(at::Tensor());
    const auto frg = ctx->saved_data["frg"].toOptional<at::Tensor>().value_or(at::Tensor());
    const bool need_w = ctx->saved_data["need_w"].toBool();
    const auto w = need_w ? s[0] : s[0].expand(ctx->saved_data["w_sizes"].toIntVector());
    auto [gw, giw] = dense_backward(grads[0], w, s[1], s[2], ctx->saved_data["max_D"].toInt(), s[3], s[4],
                                    ctx->saved_data["pooling_mode"].toInt(), iw, frg, need_w);
    torch::autograd::variable_list out(11);
    out[0] = gw;
    if (need_w && giw.numel() > 0) out[1] = giw;
    return out;
  }
};

}  // namespace

// ------------------------------------------------------------------ argument unpacking

namespace {

namespace py = pybind11;

at::Tensor tensor_at(const py::args& a, size_t i) { return a[i].cast<at::Tensor>(); }

at::Tensor optional_at(const py::args& a, size_t i) {
  return i < a.size() && !a[i].is_none() ? a[i].cast<at::Tensor>() : at::Tensor();
}

constexpr int64_t kStates[] = {0, 1, 1, 2};  // per Opt
constexpr int64_t kHypers[] = {0, 1, 4, 5};  // after learning_rate_tensor, per Opt

// split_embedding{,_nobag}_backward_codegen_<opt>_{unweighted,weighted}_pt2_wrapper, arguments in
// schema order (ops/embedding.py builds the schemas): the head (grad, weights, layout, indices,
// 8 unused cache/launch arguments), 5 per state (host, dev, uvm, placements, offsets), the
// learning-rate tensor, the optimizer's hyper-parameters.
at::Tensor backward_from_args(Opt opt, bool weighted, bool nobag, const py::args& a) {
  const auto o = static_cast<size_t>(opt);
  const size_t first_state = nobag ? 20 : 24;
  const size_t lr_at = first_state + 5 * kStates[o];
  TORCH_CHECK_VALUE(a.size() >= lr_at + 1 + kHypers[o], "expected at least ", lr_at + 1 + kHypers[o],
                    " arguments, got ", a.size());
  const auto grad = tensor_at(a, 0);
  const auto w = pick(optional_at(a, 1), optional_at(a, 2));
  TORCH_CHECK_VALUE(w.defined(), "host_weights / dev_weights: neither holds the weights");
  const auto w_off = tensor_at(a, 6);
  at::Tensor indices, iw;
  Lookup L;
  if (nobag) {
    indices = tensor_at(a, 10);
    L = describe(w_off, at::Tensor(), a[7].cast<int64_t>(), tensor_at(a, 11), indices.numel(), kPoolNone);
  } else {
    indices = tensor_at(a, 12);
    L = describe(w_off, tensor_at(a, 7), 0, tensor_at(a, 13), indices.numel(), a[14].cast<int64_t>());
    if (weighted) iw = optional_at(a, 15);
  }
  const at::ScalarType acc_t = w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  std::vector<State> states;
  for (int64_t k = 0; k < kStates[o]; ++k) {
    const size_t i = first_state + 5 * k;
    states.push_back(state_of(optional_at(a, i), optional_at(a, i + 1), tensor_at(a, i + 4), acc_t, k + 1));
  }
  Hyper h;
  h.lr = tensor_at(a, lr_at).item<double>();
  const auto hyper = [&](size_t k) { return a[lr_at + 1 + k]; };
  switch (opt) {
    case Opt::kSgd:
      break;
    case Opt::kAdagrad:
      h.eps = hyper(0).cast<double>();
      break;
    case Opt::kRowwiseAdagrad:
      h.eps = hyper(0).cast<double>();
      h.weight_decay = hyper(1).cast<double>();
      h.weight_decay_mode = hyper(2).cast<int64_t>();
      h.max_norm = hyper(3).cast<double>();
      break;
    case Opt::kAdam:
      h.eps = hyper(0).cast<double>();
      h.beta1 = hyper(1).cast<double>();
      h.beta2 = hyper(2).cast<double>();
      h.weight_decay = hyper(3).cast<double>();
      h.iter = hyper(4).cast<int64_t>();
      break;
  }
  fused_backward(opt, grad, w, L, indices, iw, states, h);
  return at::empty({0}, w.options());
}

// split_embedding_codegen_grad_indice_weights_pt2_wrapper (SUM semantics, as fbgemm's): grad,
// 4 weights placements, placements, weights_offsets, D_offsets, max_D, indices, offsets,
// lxu_cache_locations, feature_requires_grad.
at::Tensor grad_iw_from_args(const py::args& a) {
  TORCH_CHECK_VALUE(a.size() >= 13, "expected 13 arguments, got ", a.size());
  const auto w = pick(optional_at(a, 1), optional_at(a, 2));
  TORCH_CHECK_VALUE(w.defined(), "host_weights / dev_weights: neither holds the weights");
  const auto indices = tensor_at(a, 9);
  const auto L = describe(tensor_at(a, 6), tensor_at(a, 7), 0, tensor_at(a, 10), indices.numel(), 0);
  return grad_indice_weights(tensor_at(a, 0), w, L, indices, optional_at(a, 12));
}

// dense_embedding_codegen_lookup_function, arguments in schema order.
at::Tensor dense_from_args(const py::args& a) {
  TORCH_CHECK_VALUE(a.size() >= 12, "expected at least 12 arguments, got ", a.size());
  TORCH_CHECK_VALUE(optional_at(a, 13).defined() == false,
                    "B_offsets: variable batch size per feature (VBE) is not supported");
  const auto w = tensor_at(a, 0);
  const auto iw = optional_at(a, 10);
  const int64_t output_dtype = a.size() > 12 ? a[12].cast<int64_t>() : 0;
  const int64_t total_D = a[3].cast<int64_t>(), max_D = a[4].cast<int64_t>(), pm = a[9].cast<int64_t>();
  const auto w_off = tensor_at(a, 1), D_offsets = tensor_at(a, 2), indices = tensor_at(a, 7);
  const auto offsets = tensor_at(a, 8), frg = optional_at(a, 11);
  if (at::GradMode::is_enabled() && (w.requires_grad() || (iw.defined() && iw.requires_grad()))) {
    const auto opt = [](const at::Tensor& t) { return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt; };
    return DenseLookupFn::apply(w, opt(iw), w_off, D_offsets, total_D, max_D, indices, offsets, pm, opt(frg),
                                output_dtype);
  }
  return dense_forward(w, w_off, D_offsets, total_D, max_D, indices, offsets, pm, iw, output_dtype);
}

}  // namespace

// The weights a forward reads: host_weights (a[0]) when non-empty, else dev_weights (a[1]);
// either may be None (fbgemm's autograd passes None for placements a table does not use).
at::Tensor forward_weights(const py::args& a) {
  const auto w = pick(optional_at(a, 0), optional_at(a, 1));
  TORCH_CHECK_VALUE(w.defined(), "host_weights / dev_weights: neither holds the weights");
  return w;
}

// split_embedding_codegen_forward_{unweighted,weighted}_pt2_wrapper, fbgemm's argument order:
// host/dev/uvm/lxu_cache weights, weights_placements, weights_offsets(5), D_offsets(6),
// total_D(7), max_D, hash_size_cumsum, indices(10), offsets(11), pooling_mode(12),
// indice_weights(13), lxu_cache_locations, uvm_cache_stats, is_experimental, output_dtype(17).
at::Tensor tbe_forward(bool weighted, const py::args& a) {
  TORCH_CHECK_VALUE(a.size() == 18, "split_embedding_codegen_forward: expected 18 arguments, got ",
                    a.size());
  const auto iw = weighted ? optional_at(a, 13) : at::Tensor();
  return pooled(forward_weights(a), tensor_at(a, 5), tensor_at(a, 6), a[7].cast<int64_t>(),
                tensor_at(a, 10), tensor_at(a, 11), a[12].cast<int64_t>(),
                iw.defined() ? c10::optional<at::Tensor>(iw) : c10::nullopt, a[17].cast<int64_t>());
}

// split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper: host/dev/uvm/lxu_cache weights,
// weights_placements, weights_offsets(5), D(6), hash_size_cumsum, indices(8), offsets(9),
// lxu_cache_locations, uvm_cache_stats, is_experimental, output_dtype(13).
at::Tensor tbe_nobag_forward(const py::args& a) {
  TORCH_CHECK_VALUE(a.size() == 14,
                    "split_embedding_nobag_codegen_forward: expected 14 arguments, got ", a.size());
  return nobag(forward_weights(a), tensor_at(a, 5), a[6].cast<int64_t>(), tensor_at(a, 8),
               tensor_at(a, 9), a[13].cast<int64_t>());
}

// The two pooled forwards and the sequence forward with fbgemm's schemas as C++ signatures: the
// dispatcher's direct CPU kernels of the *_pt2_wrapper forward ops (csrc/direct.h; no Python on
// the way, as fbgemm's own kernels).  Undefined (None) tensors are the unused arguments.
template <bool Weighted>
at::Tensor tbe_forward_op(const at::Tensor& host_weights, const at::Tensor& dev_weights,
                          const at::Tensor& /*uvm_weights*/, const at::Tensor& /*lxu_cache_weights*/,
                          const at::Tensor& /*weights_placements*/,
                          const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
                          int64_t total_D, int64_t /*max_D*/,
                          const at::Tensor& /*hash_size_cumsum*/, const at::Tensor& indices,
                          const at::Tensor& offsets, int64_t pooling_mode,
                          const at::Tensor& indice_weights,
                          const at::Tensor& /*lxu_cache_locations*/,
                          at::Tensor& /*uvm_cache_stats*/, bool /*is_experimental*/,
                          int64_t output_dtype) {
  const auto& w = pick(host_weights, dev_weights);
  TORCH_CHECK_VALUE(w.defined(), "host_weights / dev_weights: neither holds the weights");
  const bool iw = Weighted && indice_weights.defined() && indice_weights.numel() > 0;
  return pooled(w, weights_offsets, D_offsets, total_D, indices, offsets, pooling_mode,
                iw ? c10::optional<at::Tensor>(indice_weights) : c10::nullopt, output_dtype);
}

at::Tensor tbe_nobag_forward_op(const at::Tensor& host_weights, const at::Tensor& dev_weights,
                                const at::Tensor& /*uvm_weights*/,
                                const at::Tensor& /*lxu_cache_weights*/,
                                const at::Tensor& /*weights_placements*/,
                                const at::Tensor& weights_offsets, int64_t D,
                                const at::Tensor& /*hash_size_cumsum*/, const at::Tensor& indices,
                                const at::Tensor& offsets,
                                const at::Tensor& /*lxu_cache_locations*/,
                                at::Tensor& /*uvm_cache_stats*/, bool /*is_experimental*/,
                                int64_t output_dtype) {
  const auto& w = pick(host_weights, dev_weights);
  TORCH_CHECK_VALUE(w.defined(), "host_weights / dev_weights: neither holds the weights");
  return nobag(w, weights_offsets, D, indices, offsets, output_dtype);
}

// dense_embedding_codegen_lookup_function with its schema as the C++ signature: the direct CPU
// kernel (and, through csrc/direct.h, the AutogradCPU one: without a gradient to record it
// redispatches here; with one it takes the Python autograd function built from the op's spec).
// SymInt arguments as in the schema (a symbolic size may reach the AutogradCPU kernel while
// tracing); the kernel runs on concrete ints.
at::Tensor dense_lookup_op(const at::Tensor& dev_weights, const at::Tensor& weights_offsets,
                           const at::Tensor& D_offsets, c10::SymInt total_D, c10::SymInt max_D,
                           const at::Tensor& /*hash_size_cumsum*/, int64_t /*total_hash_size_bits*/,
                           const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
                           const c10::optional<at::Tensor>& indice_weights,
                           const c10::optional<at::Tensor>& /*feature_requires_grad*/,
                           int64_t output_dtype, const c10::optional<at::Tensor>& B_offsets,
                           const c10::optional<at::Tensor>& /*vbe_output_offsets_feature_rank*/,
                           const c10::optional<at::Tensor>& /*vbe_B_offsets_rank_per_feature*/,
                           c10::SymInt /*max_B*/, c10::SymInt /*max_B_feature_rank*/,
                           c10::SymInt /*vbe_output_size*/, bool /*mixed_D*/) {
  TORCH_CHECK_VALUE(!(B_offsets.has_value() && B_offsets->defined()),
                    "B_offsets: variable batch size per feature (VBE) is not supported");
  return dense_forward(dev_weights, weights_offsets, D_offsets, total_D.guard_int(__FILE__, __LINE__),
                       max_D.guard_int(__FILE__, __LINE__), indices, offsets, pooling_mode,
                       indice_weights.has_value() ? *indice_weights : at::Tensor(), output_dtype);
}

void bind_embedding(pybind11::module& m) {
  // tests: the pooled forward's two-stage prefetch for weights past the LLC (-1: measured, 0 / 1:
  // forced off / on); returns the old setting
  m.def("_set_far_prefetch", &set_far_prefetch);
  // ops.describe(): whether the forward uses it (the _set_far_prefetch override, else the
  // measured choice: measured now if no forward has yet)
  m.def("_far_prefetch_used", &use_far_prefetch);
  m.def("tbe_forward_unweighted", [](py::args a) { return tbe_forward(false, a); });
  m.def("tbe_forward_weighted", [](py::args a) { return tbe_forward(true, a); });
  m.def("tbe_nobag_forward", [](py::args a) { return tbe_nobag_forward(a); });
  auto& t = direct::table();
  t.push_back(direct::entry<&tbe_forward_op<false>>(
      "split_embedding_codegen_forward_unweighted_pt2_wrapper"));
  t.push_back(direct::entry<&tbe_forward_op<true>>(
      "split_embedding_codegen_forward_weighted_pt2_wrapper"));
  t.push_back(direct::entry<&tbe_nobag_forward_op>(
      "split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper"));
  t.push_back(direct::entry<&dense_lookup_op>("dense_embedding_codegen_lookup_function"));
  // fused backwards: tbe_backward_<optimizer>_{unweighted,weighted,nobag}
  const std::pair<const char*, Opt> opts[] = {{"sgd", Opt::kSgd}, {"adagrad", Opt::kAdagrad},
                                              {"rowwise_adagrad", Opt::kRowwiseAdagrad}, {"adam", Opt::kAdam}};
  const std::tuple<const char*, bool, bool> variants[] = {
      {"unweighted", false, false}, {"weighted", true, false}, {"nobag", false, true}};
  for (const auto& [opt_name, opt] : opts) {
    for (const auto& [variant, weighted, nobag] : variants) {
      const std::string name = std::string("tbe_backward_") + opt_name + "_" + variant;
      const Opt o = opt;
      const bool w = weighted, nb = nobag;
      m.def(name.c_str(), [o, w, nb](py::args a) { return backward_from_args(o, w, nb, a); });
    }
  }
  // split_embedding_codegen_grad_indice_weights_pt2_wrapper (SUM semantics, as fbgemm's)
  m.def("tbe_grad_indice_weights", [](py::args a) { return grad_iw_from_args(a); });
  // dense_embedding_codegen_lookup_function (records its autograd node when grad is needed)
  m.def("dense_lookup", [](py::args a) { return dense_from_args(a); });
  // dense_embedding_codegen_lookup_backward -> (grad of dev_weights, grad of indice_weights or [0])
  m.def("dense_lookup_backward",
        [](const at::Tensor& grad, const at::Tensor& w, const at::Tensor& wo, const at::Tensor& Do, int64_t max_D,
           const at::Tensor& idx, const at::Tensor& off, int64_t pm, const c10::optional<at::Tensor>& iw,
           const c10::optional<at::Tensor>& frg, bool want_giw) {
          return dense_backward(grad, w, wo, Do, max_D, idx, off, pm, iw.has_value() ? *iw : at::Tensor(),
                                frg.has_value() ? *frg : at::Tensor(), want_giw);
        });
}

}  // namespace torchrec_ascend
