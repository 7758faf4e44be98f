// The AMX-BF16 unit's own rate on one core, beside which the benchmarks' "large-GEMM peak"
// (torch.mm of 2048^3 bf16, benchmarks/common.py) can be read.
//
//   g++ -O2 -mamx-tile -mamx-bf16 benchmarks/probes/amx_tile_rate.cpp -o /tmp/amx_tile_rate
//   /tmp/amx_tile_rate            # one JSON line; needs a CPU with AMX-BF16 (Linux >= 5.16)
//
// Two loops of TDPBF16PS (16 x 16 fp32 += 16 x 32 bf16 . 32 x 16 bf16: 16,384 FLOP each) on a
// 2 x 2 block of accumulator tiles, the layout a GEMM micro-kernel uses: "tdp" with its operand
// tiles loaded once (the unit's issue rate), "tdp_l1_loads" with two A and two B tiles loaded
// from L1 before each four products (what a micro-kernel with L1-resident operands can reach).
// Best of 5 runs of 10^6 iterations (~20-30 ms each).
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "../../csrc/amx_tiles.h"  // the tile state and configuration the kernels use

namespace {

alignas(64) uint16_t operands[4][16 * 32];  // four 16 x 64-byte tiles of bf16 ones
alignas(64) float out[16 * 16];

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <bool kLoads>
double gflops(int64_t iters) {
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      if (kLoads) {
        _tile_loadd(4, operands[0], 64);
        _tile_loadd(6, operands[2], 64);
        _tile_loadd(7, operands[3], 64);
      }
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (kLoads) _tile_loadd(5, operands[1], 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    const double s = seconds_since(t0);
    _tile_stored(0, out, 64);  // the result is used: the loop cannot be dropped
    const double rate = 4.0 * 16 * 16 * 32 * 2 * static_cast<double>(iters) / s / 1e9;
    if (rate > best) best = rate;
  }
  return best;
}

}  // namespace

int main() {
  if (!torchrec_ascend::amx::request_tile_state()) {
    std::fprintf(stderr, "amx_tile_rate: the OS refused the AMX tile state (no AMX, or Linux < 5.16)\n");
    return 2;
  }
  torchrec_ascend::amx::configure_tiles_16x64();
  for (auto& tile : operands)
    for (auto& x : tile) x = 0x3f80;  // bf16 1.0
  _tile_loadd(4, operands[0], 64);
  _tile_loadd(5, operands[1], 64);
  _tile_loadd(6, operands[2], 64);
  _tile_loadd(7, operands[3], 64);
  const int64_t iters = 1000000;
  const double tdp = gflops<false>(iters), loads = gflops<true>(iters);
  _tile_release();
  std::printf("{\"probe\": \"amx_tile_rate\", \"threads\": 1, \"tdp_gflops\": %.0f, \"tdp_l1_loads_gflops\": %.0f, "
              "\"check\": %.0f}\n", tdp, loads, static_cast<double>(out[0]));
  return 0;
}
