// CPU kernels for jagged <-> padded dense conversion and the jagged
// batched GEMMs (jagged_jagged_bmm / jagged_dense_bmm: one BLAS GEMM per sequence).
// One jagged dimension; values are [T, *inner] and handled as [T, D] rows.
// OpenMP over (sequence, row) pairs; each output row is a single contiguous copy or fill.
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

const at::Tensor& single_offsets(const std::vector<at::Tensor>& offsets) {
  TORCH_CHECK(offsets.size() == 1, "offsets: exactly one jagged dimension is supported, got ",
              offsets.size());
  TORCH_CHECK(offsets[0].dim() == 1, "offsets[0]: expected 1-D");
  return offsets[0];
}

template <typename index_t>
std::vector<int64_t> offsets_vec(const at::Tensor& off) {
  auto c = off.contiguous();
  const index_t* p = c.data_ptr<index_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// Elements per row: the product of the sizes from dimension `from` on (right for empty tensors,
// unlike numel / rows).
int64_t row_width(const at::Tensor& t, int64_t from) {
  int64_t d = 1;
  for (int64_t i = from; i < t.dim(); ++i) d *= t.size(i);
  return d;
}

std::vector<int64_t> to_vec(const at::Tensor& off) {
  return off.scalar_type() == at::kInt ? offsets_vec<int32_t>(off) : offsets_vec<int64_t>(off);
}

// dst[b, j] = src[off[b] + j] for j < len(b), else pad; rows of D elements.
template <typename scalar_t>
void jagged_to_dense_rows(const scalar_t* src, const std::vector<int64_t>& off, int64_t N, int64_t D,
                          scalar_t pad, scalar_t* dst) {
  const int64_t B = static_cast<int64_t>(off.size()) - 1;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < B * N; ++r) {
    const int64_t b = r / N, j = r % N;
    scalar_t* d = dst + r * D;
    if (j < off[b + 1] - off[b]) {
      std::memcpy(d, src + (off[b] + j) * D, sizeof(scalar_t) * D);
    } else {
      std::fill(d, d + D, pad);
    }
  }
}

// dst[off[b] + j] = src[b, j] for j < N, zero for j >= N; rows past `total` are not written,
// rows past the last offset (total > off.back()) are zero.
template <typename scalar_t>
void dense_to_jagged_rows(const scalar_t* src, const std::vector<int64_t>& off, int64_t N, int64_t D,
                          int64_t total, scalar_t* dst) {
  const int64_t B = static_cast<int64_t>(off.size()) - 1;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = std::min(off[b + 1], total) - off[b];
    for (int64_t j = 0; j < len; ++j) {
      scalar_t* d = dst + (off[b] + j) * D;
      if (j < N) {
        std::memcpy(d, src + (b * N + j) * D, sizeof(scalar_t) * D);
      } else {
        std::fill(d, d + D, scalar_t(0));
      }
    }
  }
  if (total > off.back()) std::fill(dst + off.back() * D, dst + total * D, scalar_t(0));
}

// Sequences ordered longest first: with dynamic scheduling the heavy tail starts early
// (longest-processing-time-first), so no thread is left finishing one long sequence alone.
std::vector<int64_t> longest_first(const std::vector<int64_t>& off, int64_t max_L) {
  const int64_t B = static_cast<int64_t>(off.size()) - 1;
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::min(off[a + 1] - off[a], max_L) > std::min(off[b + 1] - off[b], max_L);
  });
  return order;
}

// body(b, start, used_rows, all_rows) for every sequence; OpenMP over sequences, dynamic
// schedule.  GEMMs called inside run single-threaded (nested parallel region).
template <typename F>
void for_each_sequence(const std::vector<int64_t>& off, int64_t max_L, F&& body) {
  const auto order = longest_first(off, max_L);
  const int64_t B = static_cast<int64_t>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < B; ++i) {
    at::AutoDispatchBelowADInplaceOrView guard;  // worker threads: plain kernels, no autograd
    const int64_t b = order[i];
    const int64_t full = off[b + 1] - off[b];
    body(b, off[b], std::max<int64_t>(std::min(full, max_L), 0), full);
  }
}

}  // namespace

at::Tensor jagged_to_padded_dense_forward(const at::Tensor& values,
                                          const std::vector<at::Tensor>& offsets,
                                          const std::vector<int64_t>& max_lengths,
                                          double padding_value) {
  const auto off = to_vec(single_offsets(offsets));
  TORCH_CHECK(max_lengths.size() == 1, "max_lengths: expected one entry");
  const int64_t B = static_cast<int64_t>(off.size()) - 1;
  const int64_t N = max_lengths[0];
  auto v = values.contiguous();
  const int64_t D = row_width(v, 1);
  std::vector<int64_t> out_shape = {B, N};
  for (int64_t i = 1; i < v.dim(); ++i) out_shape.push_back(v.size(i));
  auto out = at::empty(out_shape, v.options());
  if (B == 0 || N == 0 || D == 0) return out;
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, v.scalar_type(), "jagged_to_padded_dense", [&] {
    jagged_to_dense_rows<scalar_t>(v.data_ptr<scalar_t>(), off, N, D,
                                   static_cast<scalar_t>(padding_value), out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor dense_to_jagged_forward(const at::Tensor& dense, const std::vector<at::Tensor>& offsets,
                                   c10::optional<int64_t> total_L) {
  const auto off = to_vec(single_offsets(offsets));
  const int64_t B = static_cast<int64_t>(off.size()) - 1;
  TORCH_CHECK(dense.dim() >= 2 && dense.size(0) == B, "dense: expected [B, N, ...] with B=", B);
  const int64_t N = dense.size(1);
  const int64_t total = total_L.has_value() ? *total_L : off.back();
  auto x = dense.contiguous();
  const int64_t D = row_width(x, 2);
  std::vector<int64_t> out_shape = {total};
  for (int64_t i = 2; i < x.dim(); ++i) out_shape.push_back(x.size(i));
  auto out = at::empty(out_shape, x.options());
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dense_to_jagged", [&] {
    dense_to_jagged_rows<scalar_t>(x.data_ptr<scalar_t>(), off, N, D, total, out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor jagged_to_padded_dense_backward(const at::Tensor& grad_output,
                                           const std::vector<at::Tensor>& offsets,
                                           int64_t total_L) {
  return dense_to_jagged_forward(grad_output, offsets, total_L);
}

at::Tensor jagged_jagged_bmm_forward(const at::Tensor& x_values, const at::Tensor& y_values,
                                     const at::Tensor& x_offsets, int64_t max_L) {
  TORCH_CHECK(x_values.dim() == 2 && y_values.dim() == 2, "x_values, y_values: expected 2-D");
  const auto off = to_vec(x_offsets);
  const int64_t B = static_cast<int64_t>(off.size()) - 1;
  auto x = x_values.contiguous();
  auto y = y_values.contiguous();
  auto out = at::empty({B, x.size(1), y.size(1)}, x.options());
  for_each_sequence(off, max_L, [&](int64_t b, int64_t start, int64_t len, int64_t) {
    auto o = out.select(0, b);
    if (len == 0) {
      o.zero_();
    } else {
      at::mm_out(o, x.narrow(0, start, len).t(), y.narrow(0, start, len));
    }
  });
  return out;
}

at::Tensor jagged_dense_bmm_forward(const at::Tensor& x_values, const at::Tensor& x_offsets,
                                    const at::Tensor& y, int64_t max_L) {
  TORCH_CHECK(x_values.dim() == 2 && y.dim() == 3, "x_values: expected 2-D, y: 3-D");
  const auto off = to_vec(x_offsets);
  auto x = x_values.contiguous();
  auto yc = y.contiguous();
  auto out = at::empty({x.size(0), yc.size(2)}, x.options());
  for_each_sequence(off, max_L, [&](int64_t b, int64_t start, int64_t len, int64_t full) {
    if (len > 0) {
      auto o = out.narrow(0, start, len);
      at::mm_out(o, x.narrow(0, start, len), yc.select(0, b));
    }
    if (full > len) out.narrow(0, start + len, full - len).zero_();  // rows past max_L
  });
  if (x.size(0) > off.back()) out.narrow(0, off.back(), x.size(0) - off.back()).zero_();
  return out;
}

void bind_jagged(pybind11::module& m) {
  m.def("jagged_to_padded_dense_forward", &jagged_to_padded_dense_forward);
  m.def("dense_to_jagged_forward", &dense_to_jagged_forward);
  m.def("jagged_to_padded_dense_backward", &jagged_to_padded_dense_backward);
  m.def("jagged_jagged_bmm_forward", &jagged_jagged_bmm_forward);
  m.def("jagged_dense_bmm_forward", &jagged_dense_bmm_forward);
}

}  // namespace torchrec_ascend
