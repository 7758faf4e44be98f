// The fused jagged HSTU attention kernels' core: the problem as raw pointers, the micro-kernels
// ("engines") that run it, and their entry points.  No torch types: csrc/hstu.cpp converts
// tensors into a Problem, picks the engine (measured once per CPU) and calls the entry points.
//
// Engines (one driver, csrc/hstu_driver.h, runs them all):
//   kBlas        fp32 / fp64 through the BLAS libtorch exports (sgemm_ / dgemm_); any CPU
//   kAvx512F32   fp32, register-tiled AVX-512 FMA micro-kernels of our own
//   kAvx2F32     fp32, register-tiled AVX2 FMA micro-kernels of our own (x86 CPUs with AVX2 + FMA)
//   kAvx512Bf16  bf16 operands, fp32 accumulation, AVX512-BF16 (VDPBF16PS) register tiles
//   kAmxBf16     bf16 operands, fp32 accumulation, AMX-BF16 tiles (TDPBF16PS)
#pragma once

#include <cstdint>
#include <vector>

// The x86 engines (csrc/hstu_x86.cpp) need GCC >= 11 (AMX and AVX512-BF16 intrinsics under
// #pragma GCC target); elsewhere (other architectures, other compilers) only the BLAS engine is
// built (also with -DTRASC_HSTU_NO_X86).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && !defined(TRASC_HSTU_NO_X86)
#define TRASC_HSTU_X86_ENGINES 1
#endif

namespace torchrec_ascend {
namespace hstu {

using bf16_t = uint16_t;  // bfloat16 bits (c10::BFloat16's layout)

enum class Engine : int { kBlas = 0, kAvx512F32 = 1, kAvx512Bf16 = 2, kAmxBf16 = 3, kAvx2F32 = 4 };

const char* engine_name(Engine e);

// Exact time bucketing without a log per pair: thresholds th[k] = smallest x >= 1 with
// floor(ln(x) / 0.301) >= k, computed with the float64 formula itself (ln of the value converted
// to double, as the reference does), so bucket(x) = #{k in 1..nb : x >= th[k]}.
struct Bucketer {
  static constexpr double kLogBase = 0.301;
  int64_t nb = 0;             // the last bucket (len(ts_w) - 1): buckets clamp to [0, nb]
  std::vector<int64_t> th;    // [nb + 2]; th[k] = INT64_MAX where unreachable
  int64_t lo[64];             // bucket(2^e)

  explicit Bucketer(int64_t last_bucket);
  static int64_t formula(int64_t x);
  int64_t operator()(int64_t dt) const {
    uint64_t x = dt < 0 ? uint64_t(0) - static_cast<uint64_t>(dt) : static_cast<uint64_t>(dt);
    if (x < 1) x = 1;
    int64_t b = lo[63 - __builtin_clzll(x)];
    while (b < nb && x >= static_cast<uint64_t>(th[b + 1])) ++b;
    return b;
  }
};

// One call's problem, raw pointers only.  acc_t: the type of the bias tables and of every sum
// (float for the fp32 and bf16 engines, double for fp64).
template <typename acc_t>
struct Problem {
  int64_t B = 0, H = 0, dqk = 0, dv = 0, max_seq_len = 1, ctx = 0;
  double alpha = 1.0;
  bool by_len = false;          // N = sequence length (else max_seq_len)
  const int64_t* off = nullptr; // [B + 1]
  const int64_t* nt = nullptr;  // [B] number of targets, or null
  const int64_t* ts = nullptr;  // [T] timestamps (with ts_w)
  const acc_t* pos_w = nullptr; // [2 max_seq_len - 1] or null
  const acc_t* ts_w = nullptr;  // [nts] or null
  int64_t nts = 0;
  const Bucketer* bucketer = nullptr;

  int64_t len(int64_t b) const { return off[b + 1] - off[b]; }
  bool has_bias() const { return pos_w != nullptr || ts_w != nullptr; }
};

// Whether an engine runs on this CPU (flags, the OS's AMX permission, the isa.h cap).
bool engine_usable(Engine e);

// Forward: out [T, H, dv] rows of the sequences (rows outside every sequence are not touched).
// q, k [T, H, dqk], v [T, H, dv] contiguous, of the engine's operand type.
void forward(Engine e, const Problem<float>& P, const void* q, const void* k, const void* v, void* out);
void forward(Engine e, const Problem<double>& P, const double* q, const double* k, const double* v,
             double* out);

// Backward: dq, dk, dv (rows of the sequences), the bias tables' gradients summed in float64
// into dpos [2 max_seq_len - 1] / dts [nts] (zeroed by the caller).
void backward(Engine e, const Problem<float>& P, const void* go, const void* q, const void* k,
              const void* v, void* dq, void* dk, void* dv, double* dpos, double* dts);
void backward(Engine e, const Problem<double>& P, const double* go, const double* q, const double* k,
              const double* v, double* dq, double* dk, double* dv, double* dpos, double* dts);

// ---- per-engine entry points (defined in hstu_generic.cpp: blas, avx2_fp32; hstu_x86.cpp: the rest)
namespace detail {
void forward_blas(const Problem<float>& P, const float* q, const float* k, const float* v, float* out);
void forward_blas(const Problem<double>& P, const double* q, const double* k, const double* v, double* out);
void backward_blas(const Problem<float>& P, const float* go, const float* q, const float* k, const float* v,
                   float* dq, float* dk, float* dv, double* dpos, double* dts);
void backward_blas(const Problem<double>& P, const double* go, const double* q, const double* k,
                   const double* v, double* dq, double* dk, double* dv, double* dpos, double* dts);
#if defined(TRASC_HSTU_X86_ENGINES)
bool amx_permitted();  // asks the OS for the AMX tile state (once); true when granted
void forward_avx512_f32(const Problem<float>& P, const float* q, const float* k, const float* v, float* out);
void backward_avx512_f32(const Problem<float>& P, const float* go, const float* q, const float* k,
                         const float* v, float* dq, float* dk, float* dv, double* dpos, double* dts);
void forward_avx2_f32(const Problem<float>& P, const float* q, const float* k, const float* v, float* out);
void backward_avx2_f32(const Problem<float>& P, const float* go, const float* q, const float* k, const float* v,
                       float* dq, float* dk, float* dv, double* dpos, double* dts);
void forward_bf16(bool amx, const Problem<float>& P, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                  bf16_t* out);
void backward_bf16(bool amx, const Problem<float>& P, const bf16_t* go, const bf16_t* q, const bf16_t* k,
                   const bf16_t* v, bf16_t* dq, bf16_t* dk, bf16_t* dv, double* dpos, double* dts);
#endif
}  // namespace detail

}  // namespace hstu
}  // namespace torchrec_ascend
