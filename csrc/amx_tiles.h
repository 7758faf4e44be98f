// AMX tile state: the OS's permission for it and the one tile configuration the kernels use
// (csrc/hstu_x86.cpp's bf16 engine; benchmarks/probes/amx_tile_rate.cpp).  No other dependency:
// the probe includes it as a standalone program.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace torchrec_ascend {
namespace amx {

// Linux keeps the AMX tile data state off until a process asks for it (arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); true when granted.  The request is idempotent (oneDNN
// makes it too).  Plain code: safe to call on any x86-64 CPU.
inline bool request_tile_state() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// LDTILECFG's operand (palette 1)
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// This thread's tiles 0-7 as 16 rows x 64 bytes each (16 x 16 fp32 C, 16 x 32 bf16 A, 16 pairs
// x 16 B); call after request_tile_state() succeeded, release with _tile_release()
__attribute__((target("amx-tile"))) inline void configure_tiles_16x64() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // the configuration is read by LDTILECFG
  _tile_loadconfig(&cfg);
}

}  // namespace amx
}  // namespace torchrec_ascend
