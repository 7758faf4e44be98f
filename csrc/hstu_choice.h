// Which engine (csrc/hstu_kernel.h) runs the HSTU attention of each dtype: measured once per
// process on first use (csrc/hstu_choice.cpp), reported, and forceable for tests / benchmarks.
#pragma once

#include <string>
#include <vector>

#include "hstu_kernel.h"

namespace torchrec_ascend {
namespace hstu {

enum class Dtype { kFloat, kBFloat16 };

struct Choice {
  Engine engine = Engine::kBlas;  // for bf16 with widen: the fp32 choice's engine
  bool widen = false;             // bf16 inputs computed in fp32
  std::string name;               // avx512_fp32 / avx2_fp32 / blas / amx_bf16 / avx512_bf16 / fp32
  std::string reason;             // the measurement (ms per candidate) or "forced"
};

// The engine for `d` (measures on first use, and again if the chosen one stopped being usable).
Choice chosen_engine(Dtype d);
// Force `name` for `d` ("" forgets the choice: the next use measures).
void force_engine(Dtype d, const std::string& name);
// The candidates that run here, fastest-first preference order.
std::vector<std::string> usable_engines(Dtype d);

}  // namespace hstu
}  // namespace torchrec_ascend
