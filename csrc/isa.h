// The x86 vector ISA the kernels use, and the streaming (non-temporal) copy / zero fill of large
// outputs.
//
// The extension is built for the baseline x86-64 ISA; kernels with AVX2 or AVX-512 bodies
// (target attributes) pick one at run time by isa(): what the CPU has, capped by set_isa_cap()
// (torchrec_ascend._C._set_isa_cap), so the tests run the AVX2 and scalar paths on an AVX-512
// machine too.  Elsewhere (non-x86 builds) everything is the scalar path.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TRASC_X86 1
#endif

// Lets a function's __builtin_prefetch(p, 1, ...) be a PREFETCHW (prefetch for writing; every
// x86-64 CPU since Broadwell / K8 has it, older ones execute it as a NOP).
#if defined(TRASC_X86)
#define TRASC_TARGET_PRFCHW __attribute__((target("prfchw")))
#else
#define TRASC_TARGET_PRFCHW
#endif

// A function GCC compiles three times (AVX-512, AVX2, the baseline) and picks at load time by the
// CPU (not by isa()'s cap): loops written plainly, vectorised by the compiler; the extension
// itself is built for the baseline ISA.  no-trapping-math lets GCC if-convert data branches.
#if defined(TRASC_X86)
#define TRASC_VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("no-trapping-math")))
#else
#define TRASC_VECTOR_CLONES
#endif

namespace torchrec_ascend {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

inline Isa detected_isa() {
#if defined(TRASC_X86)
  static const Isa cpu = __builtin_cpu_supports("avx512f") ? Isa::kAvx512
                         : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
                             ? Isa::kAvx2
                             : Isa::kScalar;
  return cpu;
#else
  return Isa::kScalar;
#endif
}

inline std::atomic<int> isa_cap{static_cast<int>(Isa::kAvx512)};

// The widest ISA a kernel may use now.
inline Isa isa() {
  const int cap = isa_cap.load(std::memory_order_relaxed);
  const int cpu = static_cast<int>(detected_isa());
  return static_cast<Isa>(cap < cpu ? cap : cpu);
}

// Caps isa() at `cap` (tests only); returns the previous cap.
inline int set_isa_cap(int cap) { return isa_cap.exchange(cap); }

// The last-level cache the OS reports, in bytes (0 when it reports none).
inline int64_t reported_llc_bytes() {
  static const int64_t llc = [] {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return static_cast<int64_t>(l3 > 0 ? l3 : 0);
  }();
  return llc;
}

// The LLC size the kernels plan for: the reported one, unless set_llc_bytes() overrides it.
inline std::atomic<int64_t> llc_override{-1};
inline int64_t llc_bytes() {
  const int64_t o = llc_override.load(std::memory_order_relaxed);
  return o >= 0 ? o : reported_llc_bytes();
}

// Plans for an LLC of `bytes` (tests only: both sides of every fits_llc choice run on one
// machine; -1: the reported size again); returns the previous override.
inline int64_t set_llc_bytes(int64_t bytes) { return llc_override.exchange(bytes); }

// Data of `bytes` counts as LLC-resident when it takes at most 1/share of the last-level cache
// (other data and other tenants share it); no report: never.  Outputs, written once, use a
// quarter (stream_output); TBE weights, read again by every lookup, half.
inline bool fits_llc(int64_t bytes, int64_t share = 4) { return bytes <= llc_bytes() / share; }

// An output of `bytes` is written with non-temporal stores (stream_copy / stream_zero) when it is
// at least 8 MiB and does not fit the LLC (fits_llc): then a regular store first reads the line it
// writes (a 16.8 MB padded output moved twice its size through memory on an AMD EPYC), while an
// output the LLC holds is written faster through it: on a 2-core Intel Xeon reporting 480 MB of
// L3, jagged_to_padded_dense with regular stores took 0.37x fbgemm's time at 33.5 MB (0.55x
// streamed) and 0.97x at 16.8 MB (1.11x streamed), while at 134 MB streaming stayed ahead (0.50x
// against 0.62x); benchmarks/ops.py.
constexpr int64_t kStreamOutputBytes = int64_t{8} << 20;
inline bool stream_output(int64_t bytes) { return bytes >= kStreamOutputBytes && !fits_llc(bytes); }

namespace detail {

#if defined(TRASC_X86)
// dst[0, n) = src[0, n) (src == nullptr: zeros), full W-byte aligned blocks of dst by
// non-temporal stores, the unaligned head and the tail by memcpy / memset.
__attribute__((target("avx512f"))) inline void stream_avx512(char* d, const char* s, size_t n) {
  size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (head > n) head = n;
  if (s) std::memcpy(d, s, head); else std::memset(d, 0, head);
  d += head; n -= head;
  if (s) s += head;
  const __m512i z = _mm512_setzero_si512();
  for (; n >= 64; n -= 64, d += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), s ? _mm512_loadu_si512(s) : z);
    if (s) s += 64;
  }
  if (s) std::memcpy(d, s, n); else std::memset(d, 0, n);
}

__attribute__((target("avx2"))) inline void stream_avx2(char* d, const char* s, size_t n) {
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > n) head = n;
  if (s) std::memcpy(d, s, head); else std::memset(d, 0, head);
  d += head; n -= head;
  if (s) s += head;
  const __m256i z = _mm256_setzero_si256();
  for (; n >= 32; n -= 32, d += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                        s ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)) : z);
    if (s) s += 32;
  }
  if (s) std::memcpy(d, s, n); else std::memset(d, 0, n);
}
#endif

inline void stream(char* d, const char* s, size_t n) {
#if defined(TRASC_X86)
  switch (isa()) {
    case Isa::kAvx512: stream_avx512(d, s, n); return;
    case Isa::kAvx2: stream_avx2(d, s, n); return;
    default: break;
  }
#endif
  if (s) std::memcpy(d, s, n); else std::memset(d, 0, n);
}

}  // namespace detail

// dst[0, bytes) = src[0, bytes) by non-temporal stores where the ISA has them (the scalar path:
// memcpy); call stream_fence() before another thread or the caller reads dst.
inline void stream_copy(void* dst, const void* src, size_t bytes) {
  detail::stream(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
}

// dst[0, bytes) = 0, as stream_copy.
inline void stream_zero(void* dst, size_t bytes) {
  detail::stream(static_cast<char*>(dst), nullptr, bytes);
}

// Orders the non-temporal stores before what follows (they are weakly ordered).
inline void stream_fence() {
#if defined(TRASC_X86)
  _mm_sfence();
#endif
}

}  // namespace torchrec_ascend
