// The fused jagged HSTU attention's one driver, forward and backward, over a micro-kernel policy
// ("engine") E.  Included by the translation units that define engines (hstu_generic.cpp: BLAS;
// hstu_x86.cpp: AVX-512 / AVX512-BF16 / AMX, compiled for those ISAs): everything here has
// internal linkage, so each unit gets its own copy compiled for its own ISA.
//
// No padded tensor: every sequence is read in place from the jagged [T, H, d] inputs; work and
// memory follow sum_b n_b^2 (plus tile padding), never B * N_max^2.  Row i of a sequence sees keys
// [0, e_i) and itself (the mask is a prefix plus the diagonal: causal, targets and the contextual
// prefix all have that shape), so full tiles need no mask and empty tiles are skipped.
//
// Forward: tasks (sequence, range of query rows); a task packs K^T and V of the keys its rows see,
// every head, into the engine's B layout (per-thread buffers), then per block of kFwdBlock rows
// computes the block's bias once for all heads, and per head and kFwdRows rows, per key segment
// of kFwdKeys: S = Q K^T, P = silu(alpha S + bias) masked, O += P V; O / N written once.  The
// segments are software-pipelined: segment s's SiLU rows are interleaved with the GEMM pieces
// of S for segment s + 1 and of O += P V for segment s - 1 (the matrix unit and the vector
// units work at once; the sums are the same, in the same order).
// Backward: tasks (sequence, its heads (engines without kGroupHeads: one head), range of key
// blocks: a long sequence is cut where the work's equal-cost parts meet, row_tasks); key blocks of
// kBwdKeys outside, the heads, then query blocks of kBwdRows inside, in the key orientation:
// S^T = K Q^T, dP^T = V dO^T, then P^T, dS^T; dV += P^T dO and dK += dS^T Q stay in the block's
// accumulators, dQ^T += K^T dS^T accumulates over the key blocks (a cut sequence's tasks each into
// a partial, added up at the end).  A key block's bias strip is computed once for the task's heads,
// and their dS summed into one strip whose tables' gradients go (one pass) to per-thread float64
// accumulators, reduced at the end.
//
// An engine E provides:
//   in_t, acc_t                     GEMM operand type, accumulation / elementwise type
//   kRowPad, kKPad, kNPad           padding of A / C rows, of the inner dimension, of B columns
//   b_ld(K, N), b_size(K, N)        the stride `ld` of a packed K x N B (what gemm takes) and
//                                   its size in elements
//   b_block(B, ld, k0, n0)          the packed B of rows k0.., columns n0..
//   pack_b(src, lds, K, Kp, N, dst, ld)   B(k, n) = src[k lds + n] (k < K < Kp), zero padded
//   pack_bt(src, lds, K, N, Np, dst, ld)  B(k, n) = src[n lds + k] (n < N < Np), zero padded
//   gemm(M, N, K, A, lda, B, ld, C, ldc, accumulate)   C (+)= A B, M N K padded
//   silu_fwd, silu_bwd             P = silu(alpha S + bias) masked; P, dS and dS's rows for the
//                                   tables' gradients (written, or added to them: g_add, set only
//                                   for engines with kGroupHeads)
//   bias_rows(m, w, lim, pos, p0, ts_w, bucketer, a, b, out, ld, ids)
//                                   out(r, c) = pos[p0 - r + c] + ts_w[bucket(a[r] - b[c])], c < lim[r]
//                                   (lim null: w); ids (optional) the buckets
//   table_grads(m, w, G, ld, dpos, p0, dts, bucketer, a, b, ids, scale)
//                                   dpos[p0 + r - c] += scale G(r, c), dts[bucket(a[r] - b[c])] += ...
//   store_rows, store_transposed, transpose_rows   accumulators out (scaled), operand copies
//   Thread                          RAII per-thread state (AMX: the tile configuration)
//   kGroupHeads                     backward tasks take all of a sequence's heads (sharing the
//                                   bias strips) or one head each
//   kPartsPerThread                 the backward's parts of equal work per thread (row_tasks):
//                                   more even the threads out finer, each may cost a cut sequence
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "hstu_kernel.h"


namespace torchrec_ascend {
namespace hstu {
namespace {

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The row stride of an fp32 B packed in whole 16-float blocks (the AVX-512 and AVX2 fp32 engines):
// a multiple of 64 bytes but not of 128, so consecutive k rows fall in different L1 sets.
inline int64_t padded_f32_b_ld(int64_t N) {
  const int64_t ld = round_up(N, 16);
  return ld % 32 == 0 ? ld + 16 : ld;
}

// B(k, n) = src[k lds + n] (k < K, n < N) into that layout, row stride ld: columns [N, ld) and
// rows [K, Kp) zero
inline void pack_f32_b_padded(const float* src, int64_t lds, int64_t K, int64_t Kp, int64_t N, float* dst,
                              int64_t ld) {
  for (int64_t x = 0; x < K; ++x) {
    std::memcpy(dst + x * ld, src + x * lds, N * sizeof(float));
    std::memset(dst + x * ld + N, 0, (ld - N) * sizeof(float));
  }
  if (Kp > K) std::memset(dst + K * ld, 0, (Kp - K) * ld * sizeof(float));
}

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// A 64-byte aligned scratch buffer that only grows (no std:: templates: this header is compiled
// for several ISAs).  The drivers' per-thread buffers are thread_local: kept between calls, they
// grow to the largest problem a thread has seen (freshly allocated per call, their pages faulted
// in again every time: ~2 ms of a 12 ms bf16 backward at max_len 1024).
template <typename T>
struct Scratch {
  T* p = nullptr;
  int64_t cap = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p); }
  T* get(int64_t n) {
    if (n > cap) {
      std::free(p);
      const size_t bytes = static_cast<size_t>(round_up(imax(n, 1) * static_cast<int64_t>(sizeof(T)), 64));
      p = static_cast<T*>(std::aligned_alloc(64, bytes));
      if (p == nullptr) throw std::bad_alloc();
      cap = n;
    }
    return p;
  }
  T* zeroed(int64_t n) {
    T* q = get(n);
    std::memset(q, 0, static_cast<size_t>(n) * sizeof(T));
    return q;
  }
};

// What a bias strip's time buckets were, kept for the tables' gradients (engines that classify
// groups of 16 rows x 16 columns: hstu_x86.cpp): per group its kind and bucket range, and one
// bucket per element where a group has no structure.
struct BucketRuns {
  int8_t* kind = nullptr;     // [row blocks x gld]
  int32_t* kmin = nullptr;    // [row blocks x gld]
  int32_t* kmax = nullptr;    // [row blocks x gld]
  int64_t gld = 0;            // groups per row block
  int32_t* ids = nullptr;     // [rows x ld]
  int64_t ld = 0;
};

// One sequence's mask: generative-recommenders' clamped ids (contextual prefix -> 0, every target
// -> one id); row i sees [0, prefix_end(i)) and itself.
struct SeqMask {
  int64_t n, c, cap;
  SeqMask(int64_t n_, int64_t ctx, int64_t nt) : n(n_), c(ctx), cap(n_ - ctx + 1 - nt) {}
  int64_t id(int64_t p) const { return imin(imax(p - c + 1, 0), cap); }
  bool in_prefix(int64_t i, int64_t j) const {
    const int64_t ri = id(i), rj = id(j);
    return rj < ri || (c > 0 && ri == 0 && rj < cap);
  }
  bool valid(int64_t i, int64_t j) const { return i == j || in_prefix(i, j); }
  // #{j in [0, n) : id(j) < X}: ids are non-decreasing, so those j are a prefix
  int64_t below(int64_t X) const { return X > cap ? n : (X <= 0 ? 0 : imin(imax(X + c - 1, 0), n)); }
  // the valid keys of row i other than i itself are the prefix [0, prefix_end(i)): a union of
  // prefixes (ids below id(i); with a contextual prefix, the row's ids below cap)
  int64_t prefix_end(int64_t i) const {
    const int64_t r = id(i);
    const int64_t e = below(r);
    return (c > 0 && r == 0) ? imax(e, below(cap)) : e;
  }
};

// Forward and backward blocking (rows / keys per block).  Multiples of 32 (the bf16 engines'
// inner-dimension step).
constexpr int64_t kFwdRows = 32, kFwdKeys = 128;
constexpr int64_t kFwdBlock = 128;  // forward rows sharing one bias (all heads)
constexpr int64_t kBwdRows = 64, kBwdKeys = 64;

inline double norm_of(int64_t n, int64_t max_seq_len, bool by_len) {
  return static_cast<double>(by_len ? imax(n, 1) : max_seq_len);
}

// ============================================================================ tasks

// Rows [r0, r1) of sequence b (h: the head, for tasks that have one): query rows in the forward,
// keys in the backward; cost: rows_cost of them.  split / part: a backward task of a sequence cut
// into several key ranges (the index of its dQ^T partial set and its part in it; -1: the task
// writes dQ itself).
struct RowTask {
  int64_t b, h, r0, r1;
  double cost;
  int64_t split = -1, part = 0;
};

// What a row costs: the keys a query row sees (i + 1), or the queries that see a key (n - j).
enum class RowCost { kQueries, kKeys };

// What a row costs besides its (query, key) pairs, in pairs: its operands' copies and its tiles'
// padding.  One thread, eight heads, d = 64, the AVX2 engine, AMD EPYC Zen 2, 4096 tokens in
// equal sequences of 32 .. 2048 tokens: forward time = 34 ns a pair + 1.8 us a row (53 pairs)
// within 2%; backward 93-95 ns a pair + 1.5-4.3 us a row (more in short sequences).
constexpr double kRowOverheadPairs = 48;

// The cost of rows [a, b) of a sequence of n: the sum of (i + 1), or of (n - j), over them, plus
// kRowOverheadPairs a row.
inline double rows_cost(int64_t n, int64_t a, int64_t b, RowCost kind) {
  const double A = static_cast<double>(a), Z = static_cast<double>(b);
  const double pairs = kind == RowCost::kQueries ? (Z * (Z + 1) - A * (A + 1)) / 2
                                                 : (Z - A) * static_cast<double>(n) - (Z * (Z - 1) - A * (A - 1)) / 2;
  return pairs + kRowOverheadPairs * (Z - A);
}

// Tasks over the rows of the sequences (with `per_head`, of each (sequence, head)), in order of
// sequence, head, rows.  The work is divided into parts_per_thread x threads parts of equal cost
// laid end to end, and a sequence is cut (at a multiple of `step` rows: a step goes to the part
// its middle falls in) only where a part boundary falls inside it: at most parts - 1 cuts, none
// on one thread.  The drivers run the tasks heaviest first (sort_by_cost_desc), one at a time, so
// the short ones even out the end.  Before the 13th session (2026-12-07) tasks were capped at
// 1 / (k x threads) of the work instead: more cuts (each packs its queries or keys again; a
// backward one also sums a dQ partial) and remainders (nine near-equal forward tasks over two
// threads ran five against four: eight heads, max_len 4096).
inline int64_t row_tasks(const int64_t* off, int64_t B, int64_t H, bool per_head, int64_t step, RowCost kind,
                         double parts_per_thread, int nthreads, Scratch<RowTask>& buf, RowTask*& out) {
  const int64_t hs = per_head ? H : 1;
  double total = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = off[b + 1] - off[b];
    total += rows_cost(n, 0, n, kind) * static_cast<double>(hs);
  }
  const int64_t parts = nthreads > 1 ? imax(1, static_cast<int64_t>(parts_per_thread * nthreads + 0.5)) : 1;
  const double per_part = total / static_cast<double>(parts);  // > 0 wherever a row is costed
  int64_t count = 0;
  for (int pass = 0; pass < 2; ++pass) {
    count = 0;
    double done = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = off[b + 1] - off[b];
      if (n == 0) continue;
      for (int64_t h = 0; h < hs; ++h) {
        int64_t r0 = 0, part = 0;
        double c = 0;
        for (int64_t r = 0; r < n; r += step) {
          const double add = rows_cost(n, r, imin(r + step, n), kind);
          const int64_t x = imin(parts - 1, static_cast<int64_t>((done + add / 2) / per_part));
          if (r > r0 && x != part) {
            if (pass == 1) out[count] = {b, h, r0, r, c};
            ++count;
            r0 = r;
            c = 0;
          }
          part = x;
          c += add;
          done += add;
        }
        if (pass == 1) out[count] = {b, h, r0, n, c};
        ++count;
      }
    }
    if (pass == 0) out = buf.get(count);
  }
  return count;
}

// most work first (heap sort, descending; no <algorithm>: see Scratch)
inline void sort_by_cost_desc(RowTask* t, int64_t n) {
  auto sift = [&](int64_t root, int64_t end) {
    while (true) {
      int64_t child = 2 * root + 1;
      if (child >= end) return;
      if (child + 1 < end && t[child + 1].cost < t[child].cost) ++child;  // min-heap -> descending
      if (t[child].cost < t[root].cost) {
        RowTask tmp = t[root]; t[root] = t[child]; t[child] = tmp;
        root = child;
      } else {
        return;
      }
    }
  };
  for (int64_t i = n / 2 - 1; i >= 0; --i) sift(i, n);
  for (int64_t e = n - 1; e > 0; --e) {
    RowTask tmp = t[0]; t[0] = t[e]; t[e] = tmp;
    sift(0, e);
  }
}

// ============================================================================ forward

// The forward's parts of equal work per thread (row_tasks), its tasks cut at multiples of
// kFwdRows rows.  Eight heads, two threads, alternating, AMD EPYC Zen 2: 1 / 2 / 4 parts gave
// 235.6 / 236.9 / 243.4 ms at max_len 4096 and 21.2 / 21.2 / 21.8 ms at 1024.
constexpr double kFwdPartsPerThread = 2.0;

template <class E>
void forward_driver(const Problem<typename E::acc_t>& P, const typename E::in_t* q,
                    const typename E::in_t* k, const typename E::in_t* v, typename E::in_t* out) {
  using in_t = typename E::in_t;
  using acc_t = typename E::acc_t;
  const int64_t H = P.H, dqk = P.dqk, dv = P.dv, ldq = H * dqk, ldv = H * dv;
  const int64_t dqkK = round_up(dqk, E::kKPad), dvN = round_up(dv, E::kNPad);
  const int64_t keyPad = imax(E::kKPad, E::kNPad);
  const int nthreads = max_threads();
  Scratch<RowTask> task_buf;
  RowTask* tasks = nullptr;
  const int64_t ntask =
      row_tasks(P.off, P.B, H, false, kFwdRows, RowCost::kQueries, kFwdPartsPerThread, nthreads, task_buf, tasks);
  sort_by_cost_desc(tasks, ntask);
  int64_t nmax = 0;
  for (int64_t b = 0; b < P.B; ++b) nmax = imax(nmax, P.len(b));
  const int64_t npmax = round_up(imax(nmax, 1), keyPad);
  const acc_t alpha = static_cast<acc_t>(P.alpha);
  const int64_t mP = round_up(kFwdRows, E::kRowPad);
  const int64_t ktsz = E::b_size(dqk, npmax), vsz = E::b_size(npmax, dv);

#pragma omp parallel num_threads(nthreads)
  {
    [[maybe_unused]] typename E::Thread scope;
    // per-thread buffers kept between calls (no page faults on every call)
    static thread_local Scratch<in_t> qbuf, pbuf, ktbuf, vbuf;
    static thread_local Scratch<acc_t> sbuf, obuf, biasbuf;
    static thread_local Scratch<int64_t> rowbuf;
    in_t* Qb = qbuf.get(mP * dqkK);
    in_t* Pbuf = pbuf.get(2 * mP * kFwdKeys);   // two P and two S blocks: the pipeline below
    acc_t* Sbuf = sbuf.get(2 * mP * kFwdKeys);
    acc_t* Ob = obuf.get(mP * dvN);
    in_t* KT = ktbuf.get(H * ktsz);
    in_t* VP = vbuf.get(H * vsz);
    const int64_t ldbmax = round_up(npmax, 16);
    acc_t* bias = P.has_bias() ? biasbuf.get(kFwdBlock * ldbmax) : nullptr;
    int64_t* rows = rowbuf.get(4 * kFwdBlock + 2 * kFwdRows);
    int64_t *fe = rows, *lim = rows + kFwdBlock, *tq = rows + 2 * kFwdBlock, *full = rows + 4 * kFwdBlock,
            *selfc = rows + 4 * kFwdBlock + kFwdRows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntask; ++t) {
      const int64_t b = tasks[t].b, r0 = tasks[t].r0, r1 = tasks[t].r1;
      const int64_t n = P.len(b), s0 = P.off[b];
      const SeqMask mask(n, P.ctx, P.nt ? P.nt[b] : 0);
      // keys any row of the task sees, packed for every head (K^T: dqk x keys, V: keys x dv)
      int64_t kend_task = r1;
      for (int64_t i = r0; i < r1; ++i) kend_task = imax(kend_task, mask.prefix_end(i));
      const int64_t np = round_up(kend_task, keyPad);
      const int64_t ldkt = E::b_ld(dqk, np), ldvp = E::b_ld(np, dv);
      for (int64_t h = 0; h < H; ++h) {
        E::pack_bt(k + s0 * ldq + h * dqk, ldq, dqk, kend_task, np, KT + h * ktsz, ldkt);
        E::pack_b(v + s0 * ldv + h * dv, ldv, kend_task, np, dv, VP + h * vsz, ldvp);
      }
      const acc_t inv = static_cast<acc_t>(1.0 / norm_of(n, P.max_seq_len, P.by_len));
      // blocks of kFwdBlock rows share one bias (all heads)
      for (int64_t B0 = r0; B0 < r1; B0 += kFwdBlock) {
        const int64_t mb = imin(kFwdBlock, r1 - B0);
        int64_t kendB = 0;
        for (int64_t r = 0; r < mb; ++r) {
          const int64_t i = B0 + r;
          fe[r] = mask.prefix_end(i);
          lim[r] = imax(fe[r], i + 1);
          kendB = imax(kendB, lim[r]);
          if (P.ts_w) tq[r] = P.ts[s0 + imin(i + 1, n - 1)];
        }
        // bias (r, c) = pos_w[msl - 1 + j - i] + ts_w[bucket(tq_i - ts_j)], i = B0 + r, j = c
        const int64_t ldbias = round_up(kendB, 16);
        if (bias) {
          E::bias_rows(mb, kendB, lim, P.pos_w, P.max_seq_len - 1 - B0, P.ts_w, P.bucketer, tq,
                       P.ts ? P.ts + s0 : nullptr, bias, ldbias, static_cast<BucketRuns*>(nullptr));
        }
        for (int64_t h = 0; h < H; ++h) {
          const in_t* KTh = KT + h * ktsz;
          const in_t* VPh = VP + h * vsz;
          for (int64_t i0 = B0; i0 < B0 + mb; i0 += kFwdRows) {
            const int64_t m = imin(kFwdRows, B0 + mb - i0), mp = round_up(m, E::kRowPad), rb = i0 - B0;
            int64_t kend = 0, full_all = n;
            for (int64_t r = 0; r < m; ++r) {
              kend = imax(kend, lim[rb + r]);
              full_all = imin(full_all, fe[rb + r]);
            }
            // the rows' Q, zero padded (rows to mp, columns to dqkK)
            for (int64_t r = 0; r < mp; ++r) {
              in_t* row = Qb + r * dqkK;
              if (r < m) {
                std::memcpy(row, q + (s0 + i0 + r) * ldq + h * dqk, dqk * sizeof(in_t));
                std::memset(row + dqk, 0, (dqkK - dqk) * sizeof(in_t));
              } else {
                std::memset(row, 0, dqkK * sizeof(in_t));
              }
            }
            if (mp > m)
              for (int u = 0; u < 2; ++u)
                std::memset(Pbuf + u * mP * kFwdKeys + m * kFwdKeys, 0, (mp - m) * kFwdKeys * sizeof(in_t));
            // Software pipeline over the key segments: while segment s's rows go through the
            // SiLU (vector units), the tile / FMA GEMMs of S for segment s + 1 and of O += P V for
            // segment s - 1 are issued between them, a 32-column piece at a time, so that the
            // out-of-order core runs both.  O accumulates the segments in order, as unpipelined.
            const int64_t nseg = (kend + kFwdKeys - 1) / kFwdKeys;
            auto seg_w = [&](int64_t sg) { return imin(kFwdKeys, kend - sg * kFwdKeys); };
            auto s_block = [&](int64_t sg) { return Sbuf + (sg & 1) * mP * kFwdKeys; };
            auto p_block = [&](int64_t sg) { return Pbuf + (sg & 1) * mP * kFwdKeys; };
            auto s_piece = [&](int64_t sg, int64_t c0) {  // S[:, c0:c0+32) of segment sg
              const int64_t wK = round_up(seg_w(sg), keyPad);
              if (c0 >= wK) return;
              E::gemm(mp, imin(32, wK - c0), dqkK, Qb, dqkK, E::b_block(KTh, ldkt, 0, sg * kFwdKeys + c0), ldkt,
                      s_block(sg) + c0, kFwdKeys, false);
            };
            auto pv_piece = [&](int64_t sg, int64_t c0) {  // O[:, c0:c0+32) += P V of segment sg
              if (c0 >= dvN) return;
              const int64_t wK = round_up(seg_w(sg), keyPad);
              E::gemm(mp, imin(32, dvN - c0), wK, p_block(sg), kFwdKeys, E::b_block(VPh, ldvp, sg * kFwdKeys, c0), ldvp,
                      Ob + c0, dvN, sg > 0);
            };
            const int64_t parts = imax(kFwdKeys, dvN) / 32, rows_per = (m + parts - 1) / parts;
            for (int64_t c0 = 0; c0 < kFwdKeys; c0 += 32) s_piece(0, c0);
            for (int64_t sg = 0; sg < nseg; ++sg) {
              const int64_t j0 = sg * kFwdKeys, w = seg_w(sg), wK = round_up(w, keyPad);
              const bool all_valid = j0 + w <= full_all;
              for (int64_t r = 0; r < m; ++r) {
                full[r] = imin(imax(fe[rb + r] - j0, 0), w);
                const int64_t sc = i0 + r - j0;
                selfc[r] = (sc >= 0 && sc < w) ? sc : -1;
              }
              const acc_t* Sc = s_block(sg);
              in_t* Pc = p_block(sg);
              for (int64_t part = 0; part < parts; ++part) {
                if (sg + 1 < nseg) s_piece(sg + 1, 32 * part);
                if (sg > 0) pv_piece(sg - 1, 32 * part);
                const int64_t r0 = imin(part * rows_per, m), r1 = imin(r0 + rows_per, m);
                if (r1 > r0)
                  E::silu_fwd(r1 - r0, w, wK, Sc + r0 * kFwdKeys, kFwdKeys,
                              bias ? bias + (rb + r0) * ldbias + j0 : nullptr, ldbias,
                              all_valid ? nullptr : full + r0, selfc + r0, alpha, Pc + r0 * kFwdKeys, kFwdKeys);
              }
            }
            for (int64_t c0 = 0; c0 < dvN; c0 += 32) pv_piece(nseg - 1, c0);
            E::store_rows(m, dv, Ob, dvN, inv, out + (s0 + i0) * ldv + h * dv, ldv);
          }
        }
      }
    }
  }
}

// ============================================================================ backward

// A (sequence, head group) whose keys were cut over several backward tasks: each task sums its
// key range's dQ^T into its own partial, added up once they are all done.  Part p ([dqkM x
// lddqt] per head) is at base + p x size (size: one part's elements, all the group's heads); its
// first query block at part_q0[first + p] (its columns are counted from there).
struct DqSplit {
  int64_t b, h0, parts, first, base, size;
};

template <class E>
void backward_driver(const Problem<typename E::acc_t>& P, const typename E::in_t* go,
                     const typename E::in_t* q, const typename E::in_t* k, const typename E::in_t* v,
                     typename E::in_t* dq, typename E::in_t* dk, typename E::in_t* dv, double* dpos,
                     double* dts) {
  using in_t = typename E::in_t;
  using acc_t = typename E::acc_t;
  const int64_t H = P.H, dqk = P.dqk, dvd = P.dv, ldq = H * dqk, ldv = H * dvd;
  const int64_t dqkK = round_up(dqk, E::kKPad), dvK = round_up(dvd, E::kKPad);
  const int64_t dqkN = round_up(dqk, E::kNPad), dvN = round_up(dvd, E::kNPad);
  const int64_t dqkM = round_up(dqk, E::kRowPad);
  const int64_t npos = P.pos_w ? 2 * P.max_seq_len - 1 : 0, nts = P.ts_w ? P.nts : 0;
  const int nthreads = max_threads();
  const int64_t kSeqPad = imax(imax(E::kRowPad, 16), imax(E::kKPad, E::kNPad));
  // keys / queries padded to the engine's granularity (a multiple of 16), not to whole blocks
  auto padded_len = [&](int64_t n) { return round_up(n, kSeqPad); };
  // dQ^T's stride (dqk x queries): not a multiple of 4 KiB (16 rows of a tile in one L1 set)
  auto dqt_ld = [&](int64_t np) { return np + 16; };

  // the position table reversed: the key-oriented tiles read pos_w[msl - 1 + j - i] along i
  Scratch<acc_t> pos_rev_buf;
  acc_t* pos_rev = nullptr;
  if (P.pos_w) {
    pos_rev = pos_rev_buf.get(npos);
    for (int64_t x = 0; x < npos; ++x) pos_rev[x] = P.pos_w[npos - 1 - x];
  }
  Scratch<double> grads_buf;
  double* grads = grads_buf.zeroed(nthreads * (npos + nts));

  // Tasks: a sequence's heads together (E::kGroupHeads: they share each key block's bias strip and
  // its tables' gradient pass, dS summed over the heads first), else one head each; a long one cut
  // into key ranges (whole key blocks) where a part boundary falls in it (row_tasks).
  Scratch<RowTask> task_buf;
  RowTask* tasks = nullptr;
  const bool per_head = !E::kGroupHeads;
  const int64_t hg = per_head ? 1 : H;
  const int64_t ntask = row_tasks(P.off, P.B, H, per_head, kBwdKeys, RowCost::kKeys, E::kPartsPerThread, nthreads,
                                  task_buf, tasks);
  // the cut (sequence, head group)s' dQ^T partials (tasks are in order of sequence, head, keys)
  Scratch<DqSplit> split_buf;
  DqSplit* splits = split_buf.get(ntask);
  int64_t nsplit = 0, nparts = 0, part_elems = 0;
  for (int64_t t0 = 0, t1; t0 < ntask; t0 = t1) {
    t1 = t0 + 1;
    while (t1 < ntask && tasks[t1].b == tasks[t0].b && tasks[t1].h == tasks[t0].h) ++t1;
    if (t1 - t0 == 1) continue;
    const int64_t size = hg * dqkM * dqt_ld(padded_len(P.len(tasks[t0].b)));
    splits[nsplit] = {tasks[t0].b, tasks[t0].h * hg, t1 - t0, nparts, part_elems, size};
    for (int64_t t = t0; t < t1; ++t) {
      tasks[t].split = nsplit;
      tasks[t].part = t - t0;
    }
    nparts += t1 - t0;
    part_elems += (t1 - t0) * size;
    ++nsplit;
  }
  static thread_local Scratch<acc_t> parts_buf;  // the calling thread's, kept between calls
  acc_t* parts = parts_buf.get(part_elems);
  Scratch<int64_t> part_q0_buf;
  int64_t* part_q0 = part_q0_buf.get(nparts);
  sort_by_cost_desc(tasks, ntask);
  const acc_t alpha = static_cast<acc_t>(P.alpha);
  const int64_t KBM = round_up(kBwdKeys, E::kRowPad), KBK = round_up(kBwdKeys, E::kKPad);

#pragma omp parallel num_threads(nthreads)
  {
    [[maybe_unused]] typename E::Thread scope;
    double* my_grads = grads + thread_id() * (npos + nts);
    // per-thread buffers kept between calls (no page faults on every call)
    static thread_local Scratch<in_t> ka_b, va_b, qtb_b, dotb_b, dob_b, qb_b, kta_b, pa_b, dsa_b, dsb_b;
    static thread_local Scratch<acc_t> st_b, dpt_b, bias_b, g_b, dqt_b, dk_b, dv_b;
    static thread_local Scratch<int64_t> cols_b, tq_b;
    static thread_local Scratch<int32_t> ids_b, kmin_b, kmax_b;
    static thread_local Scratch<int8_t> kind_b;
    in_t* PA = pa_b.get(KBM * kBwdRows);
    in_t* dSA = dsa_b.get(KBM * kBwdRows);
    const int64_t ldsb = E::kBSeparate ? E::b_ld(KBK, kBwdRows) : kBwdRows;
    in_t* dSB = E::kBSeparate ? dsb_b.get(E::b_size(KBK, kBwdRows)) : dSA;
    acc_t* ST = st_b.get(KBM * kBwdRows);
    acc_t* DPT = dpt_b.get(KBM * kBwdRows);
    acc_t* DK = dk_b.get(KBM * dqkN);
    acc_t* DV = dv_b.get(KBM * dvN);
    int64_t* tsk = tq_b.get(kBwdKeys);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntask; ++t) {
      const RowTask& task = tasks[t];
      const int64_t b = task.b, h0 = task.h * hg, n = P.len(b), s0 = P.off[b];
      const int64_t J0 = task.r0, J1 = task.r1;  // the task's keys (whole key blocks)
      // the last block is a partial one (a 20-token sequence packs and zeroes 32 rows, not 64)
      const int64_t np = padded_len(n), jend = J1 < n ? J1 : np;
      const SeqMask mask(n, P.ctx, P.nt ? P.nt[b] : 0);
      const acc_t inv = static_cast<acc_t>(1.0 / norm_of(n, P.max_seq_len, P.by_len));
      // per query: the end of its key prefix; per query block: the largest one
      const int64_t nqb = (np + kBwdRows - 1) / kBwdRows;
      int64_t* e = cols_b.get(2 * n + nqb + 16);
      int64_t* emax = e + n;
      int64_t* tqv = P.ts_w ? e + n + nqb : nullptr;
      for (int64_t i = 0; i < n; ++i) e[i] = mask.prefix_end(i);
      for (int64_t qb = 0; qb < nqb; ++qb) {
        int64_t mx = 0;
        for (int64_t i = qb * kBwdRows; i < imin(n, (qb + 1) * kBwdRows); ++i) mx = imax(mx, e[i]);
        emax[qb] = mx;
      }
      if (tqv) for (int64_t i = 0; i < n; ++i) tqv[i] = P.ts[s0 + imin(i + 1, n - 1)];
      // whether a query in the block at i0 sees a key of the block at j0; the first query block
      // that does (a later key block's never comes before it: the diagonal and prefixes move right)
      auto visible = [&](int64_t j0, int64_t i0) {
        const int64_t m = imin(kBwdKeys, n - j0), w = imin(kBwdRows, n - i0);
        return (i0 < j0 + m && j0 < i0 + w) || emax[i0 / kBwdRows] > j0;
      };
      auto first_visible = [&](int64_t j0) {
        int64_t cs = 0;
        while (cs < n && !visible(j0, cs)) cs += kBwdRows;
        return cs;
      };
      // operands of this sequence's heads h0 .. h0 + hg - 1, padded with zeros (head x at x * size):
      // keys [J0, jend) and queries [q0, np), indexed from there
      const int64_t q0 = first_visible(J0), nk = jend - J0, nq = np - q0;
      // strides of the dqk x keys arrays: not a multiple of 4 KiB (16 rows of a tile in one L1 set)
      const int64_t ldkta = nk + 64 / static_cast<int64_t>(sizeof(in_t)), lddqt = dqt_ld(np);
      const int64_t ldqt = E::b_ld(dqk, nq), lddot = E::b_ld(dvd, nq), lddo = E::b_ld(nq, dvd),
                    ldqb = E::b_ld(nq, dqk);
      const int64_t szka = nk * dqkK, szva = nk * dvK, szkta = dqkM * ldkta, szqtb = E::b_size(dqk, nq),
                    szdotb = E::b_size(dvd, nq), szdob = E::b_size(nq, dvd), szqb = E::b_size(nq, dqk),
                    szdqt = dqkM * lddqt;
      in_t* KA0 = ka_b.get(hg * szka);       // A: keys x dqk
      in_t* VA0 = va_b.get(hg * szva);       // A: keys x dv
      in_t* KTA0 = kta_b.get(hg * szkta);    // A: dqk x keys
      in_t* QTB0 = qtb_b.get(hg * szqtb);    // B: dqk x queries
      in_t* DOTB0 = dotb_b.get(hg * szdotb); // B: dv x queries
      in_t* DOB0 = dob_b.get(hg * szdob);    // B: queries x dv
      in_t* QB0 = qb_b.get(hg * szqb);       // B: queries x dqk
      // dQ^T (dqk x queries from q0): the task's own, or its part of a cut sequence's partials
      acc_t* DQT0 = task.split < 0 ? dqt_b.get(hg * szdqt)
                                   : parts + splits[task.split].base + task.part * splits[task.split].size;
      if (task.split >= 0) part_q0[splits[task.split].first + task.part] = q0;
      for (int64_t r = 0; r < hg * dqkM; ++r) std::memset(DQT0 + r * lddqt, 0, nq * sizeof(acc_t));
      for (int64_t x = 0; x < hg; ++x) {
        const int64_t h = h0 + x;
        in_t* KA = KA0 + x * szka;
        in_t* VA = VA0 + x * szva;
        in_t* KTA = KTA0 + x * szkta;
        for (int64_t j = J0; j < jend; ++j) {
          in_t* kr = KA + (j - J0) * dqkK;
          in_t* vr = VA + (j - J0) * dvK;
          if (j < n) {
            std::memcpy(kr, k + (s0 + j) * ldq + h * dqk, dqk * sizeof(in_t));
            std::memset(kr + dqk, 0, (dqkK - dqk) * sizeof(in_t));
            std::memcpy(vr, v + (s0 + j) * ldv + h * dvd, dvd * sizeof(in_t));
            std::memset(vr + dvd, 0, (dvK - dvd) * sizeof(in_t));
          } else {
            std::memset(kr, 0, dqkK * sizeof(in_t));
            std::memset(vr, 0, dvK * sizeof(in_t));
          }
        }
        E::transpose_rows(KA, dqkK, nk, dqk, KTA, ldkta);
        if (dqkM > dqk) std::memset(KTA + dqk * ldkta, 0, (dqkM - dqk) * ldkta * sizeof(in_t));
        const in_t* qh = q + (s0 + q0) * ldq + h * dqk;
        const in_t* goh = go + (s0 + q0) * ldv + h * dvd;
        E::pack_bt(qh, ldq, dqk, n - q0, nq, QTB0 + x * szqtb, ldqt);
        E::pack_bt(goh, ldv, dvd, n - q0, nq, DOTB0 + x * szdotb, lddot);
        E::pack_b(goh, ldv, n - q0, nq, dvd, DOB0 + x * szdob, lddo);
        E::pack_b(qh, ldq, n - q0, nq, dqk, QB0 + x * szqb, ldqb);
      }
      // a key block's bias and dS summed over the heads (for the tables' gradients) over all the
      // queries that see it: strips of kBwdKeys rows, one row per key
      const int64_t lds = round_up(np, 16) + 16;
      acc_t* bias = P.has_bias() ? bias_b.get(kBwdKeys * lds) : nullptr;
      acc_t* G = P.has_bias() ? g_b.get(kBwdKeys * lds) : nullptr;
      BucketRuns runs;
      if (P.ts_w) {
        runs.ld = lds;
        runs.ids = ids_b.get(kBwdKeys * lds);
        runs.gld = lds / 16 + 1;
        runs.kind = kind_b.get(kBwdKeys * runs.gld);
        runs.kmin = kmin_b.get(kBwdKeys * runs.gld);
        runs.kmax = kmax_b.get(kBwdKeys * runs.gld);
      }
      for (int64_t j0 = J0; j0 < J1; j0 += kBwdKeys) {
        const int64_t m = imin(kBwdKeys, n - j0), mM = round_up(m, E::kRowPad), mK = round_up(m, E::kKPad);
        if (P.ts_w) for (int64_t r = 0; r < m; ++r) tsk[r] = P.ts[s0 + j0 + r];
        const int64_t cs = first_visible(j0), ws = n - cs;  // the query blocks that see these keys
        if (bias) {
          // strip (r, c) = pos_w[msl - 1 + j - i] = pos_rev[msl - 1 + i - j] + ts_w[bucket(ts_j - tq_i)],
          // j = j0 + r, i = cs + c
          E::bias_rows(m, ws, nullptr, pos_rev, P.max_seq_len - 1 + cs - j0, P.ts_w, P.bucketer, tsk,
                       tqv ? tqv + cs : nullptr, bias, lds, P.ts_w ? &runs : nullptr);
        }
        for (int64_t x = 0; x < hg; ++x) {
          const int64_t h = h0 + x;
          const in_t* KA = KA0 + x * szka;
          const in_t* VA = VA0 + x * szva;
          const in_t* KTA = KTA0 + x * szkta;
          const in_t* QTB = QTB0 + x * szqtb;
          const in_t* DOTB = DOTB0 + x * szdotb;
          const in_t* DOB = DOB0 + x * szdob;
          const in_t* QB = QB0 + x * szqb;
          acc_t* DQT = DQT0 + x * szdqt;
          bool first = true;
          for (int64_t i0 = cs; i0 < n; i0 += kBwdRows) {
            const int64_t w = imin(kBwdRows, n - i0), wK = round_up(w, imax(E::kKPad, E::kNPad));
            if (!visible(j0, i0)) {  // no query here sees these keys
              if (G && x == 0) for (int64_t r = 0; r < m; ++r) std::memset(G + r * lds + (i0 - cs), 0, w * sizeof(acc_t));
              continue;
            }
            E::gemm(mM, wK, dqkK, KA + (j0 - J0) * dqkK, dqkK, E::b_block(QTB, ldqt, 0, i0 - q0), ldqt, ST, kBwdRows,
                    false);
            E::gemm(mM, wK, dvK, VA + (j0 - J0) * dvK, dvK, E::b_block(DOTB, lddot, 0, i0 - q0), lddot, DPT, kBwdRows,
                    false);
            E::silu_bwd(m, mK, w, wK, ST, DPT, kBwdRows, bias ? bias + (i0 - cs) : nullptr, lds, j0, i0, e + i0,
                        alpha, PA, dSA, kBwdRows, dSB, ldsb, G ? G + (i0 - cs) : nullptr, lds, x > 0);
            E::gemm(mM, dvN, wK, PA, kBwdRows, E::b_block(DOB, lddo, i0 - q0, 0), lddo, DV, dvN, !first);
            E::gemm(mM, dqkN, wK, dSA, kBwdRows, E::b_block(QB, ldqb, i0 - q0, 0), ldqb, DK, dqkN, !first);
            E::gemm(dqkM, wK, mK, KTA + (j0 - J0), ldkta, dSB, ldsb, DQT + (i0 - q0), lddqt, true);
            first = false;
          }
          if (first) {  // cannot happen (a key sees itself); keep the outputs defined anyway
            std::memset(DK, 0, mM * dqkN * sizeof(acc_t));
            std::memset(DV, 0, mM * dvN * sizeof(acc_t));
          }
          E::store_rows(m, dqk, DK, dqkN, alpha * inv, dk + (s0 + j0) * ldq + h * dqk, ldq);
          E::store_rows(m, dvd, DV, dvN, inv, dv + (s0 + j0) * ldv + h * dvd, ldv);
        }
        if (G) {
          // element (r, c): dpos[msl - 1 + j - i] with j = j0 + r, i = cs + c
          E::table_grads(m, ws, G, lds, P.pos_w ? my_grads : nullptr, P.max_seq_len - 1 + j0 - cs,
                         P.ts_w ? my_grads + npos : nullptr, P.bucketer, tsk, tqv ? tqv + cs : nullptr,
                         P.ts_w ? &runs : nullptr, static_cast<double>(inv));
        }
      }
      // a task with every key of its sequence starts at query 0 (the first key sees itself)
      if (task.split < 0)
        for (int64_t x = 0; x < hg; ++x)
          E::store_transposed(dqk, n, DQT0 + x * szdqt, lddqt, alpha * inv, dq + s0 * ldq + (h0 + x) * dqk, ldq);
    }
    // the cut sequences' dQ^T: the parts added into part 0 (which starts at query 0), per head
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < nsplit * hg; ++g) {
      const DqSplit& S = splits[g / hg];
      const int64_t x = g % hg, n = P.len(S.b), np = padded_len(n), lddqt = dqt_ld(np), head = x * dqkM * lddqt;
      acc_t* sum = parts + S.base + head;
      for (int64_t p = 1; p < S.parts; ++p) {
        const acc_t* add = parts + S.base + p * S.size + head;
        const int64_t c0 = part_q0[S.first + p];
        for (int64_t r = 0; r < dqk; ++r)
          for (int64_t c = 0; c < n - c0; ++c) sum[r * lddqt + c0 + c] += add[r * lddqt + c];
      }
      const acc_t inv = static_cast<acc_t>(1.0 / norm_of(n, P.max_seq_len, P.by_len));
      E::store_transposed(dqk, n, sum, lddqt, alpha * inv, dq + P.off[S.b] * ldq + (S.h0 + x) * dqk, ldq);
    }
  }
  for (int th = 0; th < nthreads; ++th) {
    const double* g = grads + th * (npos + nts);
    for (int64_t x = 0; x < npos; ++x) dpos[x] += g[x];
    for (int64_t x = 0; x < nts; ++x) dts[x] += g[npos + x];
  }
}

}  // namespace
}  // namespace hstu
}  // namespace torchrec_ascend
