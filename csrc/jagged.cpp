// CPU kernels for jagged <-> padded dense conversion and the complete cumsum.
// One jagged dimension; values are [T, *inner] and handled as [T, D] rows.
// OpenMP over (sequence, row) pairs; each output row is a single contiguous copy or fill.
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
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
  const int64_t D = v.dim() > 1 ? v.numel() / std::max<int64_t>(v.size(0), 1) : 1;
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
  const int64_t D = (B * N) > 0 ? x.numel() / (B * N) : 1;
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

at::Tensor asynchronous_complete_cumsum(const at::Tensor& t_in) {
  TORCH_CHECK(t_in.dim() == 1, "t_in: the C++ kernel takes 1-D input");
  auto x = t_in.contiguous();
  auto out = at::empty({x.numel() + 1}, x.options());
  AT_DISPATCH_INDEX_TYPES(x.scalar_type(), "asynchronous_complete_cumsum", [&] {
    const index_t* src = x.data_ptr<index_t>();
    index_t* dst = out.data_ptr<index_t>();
    index_t acc = 0;
    dst[0] = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      acc += src[i];
      dst[i + 1] = acc;
    }
  });
  return out;
}

void bind_jagged(pybind11::module& m) {
  m.def("jagged_to_padded_dense_forward", &jagged_to_padded_dense_forward);
  m.def("dense_to_jagged_forward", &dense_to_jagged_forward);
  m.def("jagged_to_padded_dense_backward", &jagged_to_padded_dense_backward);
  m.def("asynchronous_complete_cumsum", &asynchronous_complete_cumsum);
}

}  // namespace torchrec_ascend
