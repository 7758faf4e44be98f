// parallel_over: the one OpenMP policy of the memory-bound sparse / embedding CPU kernels, and
// empty_output: their large outputs on huge pages.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace torchrec_ascend {

// Elements touched below which a loop stays on the calling thread.  An OpenMP region costs
// 20-30 us on an idle machine but waits for its worker to be scheduled when other processes hold
// the cores: 10-40 ms per region measured at load 4-8 on 2 cores (a 4M-element torch.add took
// 12 ms instead of 2), more than any kernel of this size gains from a second thread.  The
// baseline does not pay it: fbgemm-gpu-cpu's binaries are built without OpenMP, so its CPU
// kernels run on the calling thread.  Below this size ours do too (every benchmark shape,
// including the full TBE batches of ~33M elements); above it the memory-bound loops split.
constexpr int64_t kParallelWork = int64_t{1} << 25;

// Elements per chunk of a split loop.
constexpr int64_t kChunkWork = int64_t{1} << 16;

// f(begin, end) over [0, n): on the calling thread unless `work` (elements touched) reaches
// kParallelWork, else at::parallel_for with chunks of about kChunkWork elements.
template <typename F>
void parallel_over(int64_t n, int64_t work, F&& f) {
  if (n <= 0) return;
  if (work < kParallelWork || n == 1) {
    f(0, n);
    return;
  }
  at::parallel_for(0, n, std::max<int64_t>(1, n * kChunkWork / work), f);
}

// f(r0, r1) over the rows of a [rows, cols] tensor: parallel_over with the elements as the work
// (the row kernels: csrc/hstu_layer.cpp, csrc/rows.cpp)
template <typename F>
void over_rows(int64_t rows, int64_t cols, F&& f) {
  parallel_over(rows, rows * cols, [&](int64_t r0, int64_t r1) { f(r0, r1); });
}

}  // namespace torchrec_ascend

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <ATen/ATen.h>

namespace torchrec_ascend {

// Outputs at least this large get transparent huge pages.
constexpr int64_t kHugeOutputBytes = int64_t{16} << 20;

#if defined(__linux__)
// Whether the pages of [lo, hi) (page-aligned, hi > lo) are already mapped in, sampled at the
// first, middle and last page: a block glibc hands out again from its heap (blocks under its
// mmap threshold once a free has raised it: up to 32 MiB) was written by an earlier call.
inline bool pages_resident(uintptr_t lo, uintptr_t hi) {
  const uintptr_t mid = lo + (((hi - lo) / 2) & ~uintptr_t{4095});
  for (uintptr_t q : {lo, mid, hi - 4096}) {
    unsigned char v = 0;
    if (mincore(reinterpret_cast<void*>(q), 4096, &v) != 0 || !(v & 1)) return false;
  }
  return true;
}
#endif

// at::empty(shape, options), and for a fresh CPU buffer of >= kHugeOutputBytes on Linux, asks for
// transparent huge pages on its 2 MiB-aligned interior before anything touches it.  glibc maps
// such a buffer freshly on every call, and first touching it takes one page fault per 4 KiB: a
// sequence-TBE output of 130 MB was 32k faults, most of the op's time (worse with two threads
// faulting at once); with THP it is ~65.  Where THP is off or "never", madvise fails and nothing
// changes.  A block that is already mapped in (reused from the heap) is left alone: populating
// 16.8 MB of resident pages again cost ~210 us per call (AVX-512 AMD EPYC), a third of the J=2
// jagged_to_padded_dense forward writing it.
inline at::Tensor empty_output(at::IntArrayRef shape, const at::TensorOptions& options) {
  auto out = at::empty(shape, options);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const int64_t bytes = out.numel() * static_cast<int64_t>(out.element_size());
  if (out.is_cpu() && bytes >= kHugeOutputBytes) {
    const auto p = reinterpret_cast<uintptr_t>(out.data_ptr());
    const uintptr_t page_lo = p & ~uintptr_t{4095};
    const uintptr_t page_hi = (p + static_cast<uintptr_t>(bytes)) & ~uintptr_t{4095};
    if (page_hi > page_lo && pages_resident(page_lo, page_hi)) return out;
    constexpr uintptr_t kHuge = uintptr_t{2} << 20;
    const uintptr_t lo = (p + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t hi = (p + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // advice only
#if defined(MADV_POPULATE_WRITE)
    // and maps it now, from this one thread: when the kernel's threads first-touch it together,
    // the huge pages fall back to 4 KiB ones (3.6x the faults measured, at twice the time)
    madvise(reinterpret_cast<void*>(page_lo), p + static_cast<uintptr_t>(bytes) - page_lo,
            MADV_POPULATE_WRITE);  // Linux >= 5.14; elsewhere EINVAL and the threads fault it in
#endif
  }
#endif
  return out;
}

// Outputs at least this large that are mostly zero come from a fresh mapping in zeroed_output:
// glibc's malloc maps every block from its largest mmap threshold (32 MiB on 64-bit) up afresh
// anyway, so at::zeros would fault in and clear every page; a smaller block is reused from the
// heap between calls (once the first free has raised the threshold), where writing it costs less
// than the page faults of a fresh mapping on its data rows (J=2 jagged_to_padded_dense, 16.8 MB
// at 21% data: 1.56 ms on a fresh mapping against fbgemm's 0.86 ms in a reused buffer).
constexpr int64_t kLazyZeroBytes = int64_t{32} << 20;

// A CPU tensor of zeros whose pages are not touched here (calloc's trick): a buffer of at least
// kLazyZeroBytes is a fresh anonymous mapping, zero by construction, released with munmap when
// the tensor dies, so a kernel that fills a padded output writes only its data rows and the
// untouched padding costs nothing until it is read (reads map the shared zero page).  Smaller
// buffers, other devices and other systems: at::zeros.
inline at::Tensor zeroed_output(at::IntArrayRef shape, const at::TensorOptions& options) {
#if defined(__linux__)
  int64_t numel = 1;
  for (auto n : shape) numel *= n;
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(
      c10::typeMetaToScalarType(options.dtype())));
  if (options.device().is_cpu() && bytes >= kLazyZeroBytes) {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      const size_t len = static_cast<size_t>(bytes);
      return at::from_blob(p, shape, [len](void* q) { munmap(q, len); }, options);
    }
  }
#endif
  return at::zeros(shape, options);
}

}  // namespace torchrec_ascend
