// parallel_over: the one OpenMP policy of the memory-bound sparse / embedding CPU kernels.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace torchrec_ascend {

// Elements touched below which a loop stays on the calling thread: waking the pool costs
// 20-30 us idle and milliseconds when other processes hold the cores, more than a memory-bound
// loop of this size (a TorchRec batch of ~100k ids) gains from a second thread.
constexpr int64_t kParallelWork = 1 << 18;

// f(begin, end) over [0, n): on the calling thread unless `work` (elements touched) is large,
// else at::parallel_for with chunks of about kParallelWork / 4 elements.
template <typename F>
void parallel_over(int64_t n, int64_t work, F&& f) {
  if (n <= 0) return;
  if (work < kParallelWork || n == 1) {
    f(0, n);
    return;
  }
  at::parallel_for(0, n, std::max<int64_t>(1, n * (kParallelWork / 4) / work), f);
}

}  // namespace torchrec_ascend
