// CPU kernels of the jagged family: jagged <-> dense conversions and the elementwise jagged (x)
// dense ops with any number of jagged dimensions, jagged softmax, the batched jagged GEMMs
// (one BLAS GEMM per sequence), batched dense-vector x jagged, index select / slice, and the
// stacked (keyed) conversions.
//
// A jagged tensor with J jagged dimensions is values [T, *inner] (handled as [T, D] rows) and J
// offsets tensors; its dense form [B, N_0, ..., N_{J-1}, *inner] is handled as R = B * N_0 * ...
// * N_{J-2} dense rows of N = N_{J-1} slots (DenseRows): slot j of dense row r holds values row
// begin[r] + j for j < len[r] (and padding past it).  Every kernel is a loop over slots or
// segments, each a contiguous copy / fill / elementwise pass over D elements.
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <vector>

#include "direct.h"
#include "isa.h"
#include "parallel.h"
#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

template <typename index_t>
std::vector<int64_t> offsets_vec(const at::Tensor& off) {
  auto c = off.contiguous();
  const index_t* p = c.data_ptr<index_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

std::vector<int64_t> to_vec(const at::Tensor& off, const char* arg) {
  TORCH_CHECK_VALUE(off.dim() == 1, arg, ": expected a 1-D offsets tensor, got ", off.dim(), "-D");
  TORCH_CHECK_VALUE(off.scalar_type() == at::kInt || off.scalar_type() == at::kLong, arg,
                    ": expected int32 or int64, got ", off.scalar_type());
  return off.scalar_type() == at::kInt ? offsets_vec<int32_t>(off) : offsets_vec<int64_t>(off);
}

// Elements per row: the product of the sizes from dimension `from` on (right for empty tensors,
// unlike numel / rows).
int64_t row_width(const at::Tensor& t, int64_t from) {
  int64_t d = 1;
  for (int64_t i = from; i < t.dim(); ++i) d *= t.size(i);
  return d;
}

// Offsets start at 0 or more and never decrease (else the walk would read out of bounds).
void check_monotone(const std::vector<int64_t>& off, const char* arg, int64_t d) {
  TORCH_CHECK_VALUE(!off.empty(), arg, "[", d, "]: must have at least one entry");
  TORCH_CHECK_VALUE(off[0] >= 0, arg, "[", d, "]: must start at 0 or more, starts at ", off[0]);
  for (size_t i = 1; i < off.size(); ++i) {
    TORCH_CHECK_VALUE(off[i] >= off[i - 1], arg, "[", d, "]: must be non-decreasing, but entry ",
                      i, " (", off[i], ") < entry ", i - 1, " (", off[i - 1], ")");
  }
}

// Dense rows of a jagged tensor against a dense shape [B, dims[0], ..., dims[J-1]].
struct DenseRows {
  int64_t R = 0;  // dense rows: B * dims[0] * ... * dims[J-2]
  int64_t N = 0;  // slots per dense row: dims[J-1]
  int64_t first = 0;  // first offset of the innermost jagged dimension
  int64_t last = 0;   // its last offset (the values rows the jagged tensor spans end there)
  std::vector<int64_t> begin, len, full;  // first values row, slots used (<= N), segment rows
};

DenseRows dense_rows(const std::vector<at::Tensor>& offsets, const int64_t* dims, int64_t B,
                     const char* arg) {
  const int64_t J = static_cast<int64_t>(offsets.size());
  TORCH_CHECK_VALUE(J >= 1, arg, ": needs at least one offsets tensor (one per jagged dimension)");
  DenseRows out;
  std::vector<int64_t> parent(B);  // index into the current level's offsets, -1: outside
  std::iota(parent.begin(), parent.end(), int64_t{0});
  int64_t entries = B;
  for (int64_t d = 0; d < J; ++d) {
    const auto off = to_vec(offsets[d], arg);
    TORCH_CHECK(static_cast<int64_t>(off.size()) == entries + 1, arg, "[", d, "] has ",
                off.size(), " entries, but the ", d == 0 ? "batch" : "previous jagged dimension",
                " needs ", entries + 1);
    check_monotone(off, arg, d);
    const int64_t n = dims[d];
    TORCH_CHECK_VALUE(n >= 0, "max_lengths[", d, "]: must be >= 0, got ", n);
    if (d + 1 < J) {
      std::vector<int64_t> child(parent.size() * n);
      for (size_t e = 0; e < parent.size(); ++e) {
        const int64_t p = parent[e];
        const int64_t l = p >= 0 ? off[p + 1] - off[p] : 0;
        for (int64_t j = 0; j < n; ++j) child[e * n + j] = j < l ? off[p] + j : -1;
      }
      parent.swap(child);
    } else {
      out.R = static_cast<int64_t>(parent.size());
      out.N = n;
      out.begin.resize(out.R);
      out.len.resize(out.R);
      out.full.resize(out.R);
      for (int64_t r = 0; r < out.R; ++r) {
        const int64_t p = parent[r];
        out.begin[r] = p >= 0 ? off[p] : 0;
        out.full[r] = p >= 0 ? off[p + 1] - off[p] : 0;
        out.len[r] = std::min(out.full[r], n);
      }
    }
    entries = off.back();
    out.first = off[0];
    out.last = off.back();
  }
  return out;
}

// dims of a dense partner [B, N_0, ..., N_{J-1}, *inner] and its checks.
std::vector<int64_t> dense_dims(const at::Tensor& dense, int64_t J, const char* arg) {
  TORCH_CHECK_VALUE(dense.dim() >= 1 + J, arg, ": expected at least ", 1 + J,
                    " dims (batch + one per jagged dimension), got ", dense.dim());
  return std::vector<int64_t>(dense.sizes().begin() + 1, dense.sizes().begin() + 1 + J);
}

// f(r, slot, values_row, n) for every dense row r holding n = len[r] > 0 slots: its slots
// r * N .. + n hold values rows values_row .. + n, contiguous on both sides (one span per row);
// in parallel, `width` elements per slot.
template <typename F>
void for_each_span(const DenseRows& rows, int64_t width, F&& f) {
  parallel_over(rows.R, rows.R * std::max<int64_t>(rows.N, 1) * width, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (rows.len[r] > 0) f(r, r * rows.N, rows.begin[r], rows.len[r]);
    }
  });
}

// ------------------------------------------------------------------------------ row helpers

template <typename scalar_t>
inline void fill_row(scalar_t* d, scalar_t v, int64_t D) {
  std::fill(d, d + D, v);
}

template <typename scalar_t>
inline void copy_row(scalar_t* d, const scalar_t* s, int64_t D) {
  if (D > 0) std::memcpy(d, s, sizeof(scalar_t) * D);
}

// o = a + b (+ c)
template <typename scalar_t>
inline void add_rows(scalar_t* __restrict o, const scalar_t* __restrict a,
                     const scalar_t* __restrict b, int64_t D) {
  for (int64_t i = 0; i < D; ++i) o[i] = a[i] + b[i];
}

template <typename scalar_t>
inline void add3_rows(scalar_t* __restrict o, const scalar_t* __restrict a,
                      const scalar_t* __restrict b, const scalar_t* __restrict c, int64_t D) {
  for (int64_t i = 0; i < D; ++i) o[i] = a[i] + b[i] + c[i];
}

template <typename scalar_t>
inline void add_into(scalar_t* __restrict o, const scalar_t* __restrict a, int64_t D) {
  for (int64_t i = 0; i < D; ++i) o[i] += a[i];
}

template <typename scalar_t>
inline void mul_rows(scalar_t* __restrict o, const scalar_t* __restrict a,
                     const scalar_t* __restrict b, int64_t D) {
  for (int64_t i = 0; i < D; ++i) o[i] = a[i] * b[i];
}

// o = a * 0 (what x * dense_to_jagged(y) gives where y holds no slot: 0, or NaN for inf / NaN)
template <typename scalar_t>
inline void mul_zero_rows(scalar_t* __restrict o, const scalar_t* __restrict a, int64_t D) {
  for (int64_t i = 0; i < D; ++i) o[i] = a[i] * scalar_t(0);
}

#define TRASC_DISPATCH_ALL(TYPE, NAME, ...) \
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, TYPE, NAME, __VA_ARGS__)
#define TRASC_DISPATCH_FLOAT(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

at::Tensor contiguous(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------ conversions

namespace {

at::Tensor jagged_to_padded_dense_impl(const at::Tensor& values,
                                       const std::vector<at::Tensor>& offsets,
                                       at::IntArrayRef max_lengths, double padding_value) {
  TORCH_CHECK_VALUE(max_lengths.size() == offsets.size(), "max_lengths: has ", max_lengths.size(),
                    " entries but there are ", offsets.size(), " jagged dimensions");
  TORCH_CHECK_VALUE(values.dim() >= 1, "values: expected at least 1-D");
  TORCH_CHECK_VALUE(!offsets.empty(), "offsets: needs at least one jagged dimension");
  const int64_t B = offsets[0].numel() - 1;
  TORCH_CHECK_VALUE(B >= 0, "offsets[0]: must have at least one entry");
  const auto rows = dense_rows(offsets, max_lengths.data(), B, "offsets");
  TORCH_CHECK_VALUE(rows.last <= values.size(0), "offsets: the last offset (", rows.last,
                    ") exceeds the ", values.size(0), " rows of values");
  auto v = contiguous(values);
  const int64_t D = row_width(v, 1);
  std::vector<int64_t> shape = {B};
  shape.insert(shape.end(), max_lengths.begin(), max_lengths.end());
  for (int64_t i = 1; i < v.dim(); ++i) shape.push_back(v.size(i));
  // every byte of the output written once: each row's data copied, its padding filled (a
  // padding of +0.0, all bits zero, by memset).  A lazily zeroed fresh mapping (only the data
  // rows written) was tried: it pays a page fault per 4 KiB of data on every call, while
  // at::empty reuses a block the allocator already mapped (e.g. the previous call's output), so
  // on a warm heap it measured 1.7x fbgemm's time (AVX2-only 2-core AMD EPYC VM, B=64, D=256)
  auto out = empty_output(shape, v.options());
  const int64_t slots = rows.R * rows.N;
  if (slots == 0 || D == 0) return out;
  const bool zero_pad = padding_value == 0.0 && !std::signbit(padding_value);
  TRASC_DISPATCH_ALL(v.scalar_type(), "jagged_to_padded_dense", [&] {
    const scalar_t* src = v.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const auto pad = static_cast<scalar_t>(padding_value);
    // per dense row its slots in one copy; the padding between one row's slots and the next
    // row's in one fill (empty rows' padding runs together: the J=3 quick case, 2048 rows of
    // 4 KiB with 455 values rows in all, is mostly padding).  A large zero-padded output by
    // non-temporal stores (stream_output in csrc/isa.h).
    const bool stream = zero_pad && stream_output(slots * D * static_cast<int64_t>(sizeof(scalar_t)));
    const int64_t row = rows.N * D;  // elements per dense row
    parallel_over(rows.R, slots * D, [&](int64_t r0, int64_t r1) {
      auto fill = [&](int64_t from, int64_t to) {  // the padding dst[from, to)
        if (to <= from) return;
        if (stream) {
          stream_zero(dst + from, sizeof(scalar_t) * (to - from));
        } else if (zero_pad) {
          std::memset(static_cast<void*>(dst + from), 0, sizeof(scalar_t) * (to - from));
        } else {
          fill_row(dst + from, pad, to - from);
        }
      };
      int64_t pad_from = r0 * row;  // the padding not yet written starts here
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = rows.len[r] * D;
        if (n == 0) continue;
        fill(pad_from, r * row);
        if (stream) {
          stream_copy(dst + r * row, src + rows.begin[r] * D, sizeof(scalar_t) * n);
        } else {
          copy_row(dst + r * row, src + rows.begin[r] * D, n);
        }
        pad_from = r * row + n;
      }
      fill(pad_from, r1 * row);
      if (stream) stream_fence();
    });
  });
  return out;
}

at::Tensor dense_to_jagged_impl(const at::Tensor& dense, const std::vector<at::Tensor>& offsets,
                                c10::optional<int64_t> total_L) {
  TORCH_CHECK_VALUE(!offsets.empty(), "x_offsets: needs at least one jagged dimension");
  const int64_t J = static_cast<int64_t>(offsets.size());
  const auto dims = dense_dims(dense, J, "dense");
  const int64_t B = dense.size(0);
  TORCH_CHECK(offsets[0].numel() == B + 1, "x_offsets[0]: has ", offsets[0].numel(),
              " entries but dense has batch size ", B);
  int64_t total = 0;
  if (total_L.has_value()) {
    total = *total_L;
  } else {
    const auto last = to_vec(offsets.back(), "x_offsets");
    total = last.empty() ? 0 : *std::max_element(last.begin(), last.end());
  }
  TORCH_CHECK_VALUE(total >= 0, "total_L: must be >= 0, got ", total);
  const auto rows = dense_rows(offsets, dims.data(), B, "x_offsets");
  auto x = contiguous(dense);
  const int64_t D = row_width(x, 1 + J);
  std::vector<int64_t> shape = {total};
  for (int64_t i = 1 + J; i < x.dim(); ++i) shape.push_back(x.size(i));
  auto out = empty_output(shape, x.options());
  if (total == 0 || D == 0) return out;
  TRASC_DISPATCH_ALL(x.scalar_type(), "dense_to_jagged", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    if (J == 1) {
      // each segment in one pass: its slots, then zeros for the truncated tail; rows past the
      // last offset are zero, rows at or past total are not written
      parallel_over(rows.R, std::min(total, rows.last) * D, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b0 = std::min(rows.begin[r], total);
          const int64_t held = std::min(b0 + rows.len[r], total);
          const int64_t end = std::min(rows.begin[r] + rows.full[r], total);
          copy_row(dst + b0 * D, src + r * rows.N * D, (held - b0) * D);
          fill_row(dst + held * D, scalar_t(0), (end - held) * D);
        }
      });
      std::fill(dst, dst + std::min(rows.first, total) * D, scalar_t(0));
      if (total > rows.last) std::fill(dst + rows.last * D, dst + total * D, scalar_t(0));
    } else {
      // rows under a truncated outer slot are never visited: zero everything first
      std::fill(dst, dst + total * D, scalar_t(0));
      for_each_span(rows, D, [&](int64_t, int64_t slot, int64_t row, int64_t n) {
        const int64_t m = std::max<int64_t>(std::min(n, total - row), 0);
        copy_row(dst + row * D, src + slot * D, m * D);
      });
    }
  });
  return out;
}

// SymInt arguments (the schemas' SymInt / SymInt[]) as the concrete ints a CPU kernel runs with
int64_t concrete(const c10::SymInt& v) { return v.guard_int(__FILE__, __LINE__); }

c10::optional<int64_t> concrete(const c10::optional<c10::SymInt>& v) {
  return v.has_value() ? c10::optional<int64_t>(concrete(*v)) : c10::nullopt;
}

std::vector<int64_t> concrete(c10::SymIntArrayRef v) {
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(concrete(x));
  return out;
}

}  // namespace

// The op signatures take the schemas' SymInt types (a symbolic size reaches the direct
// AutogradCPU kernel while tracing with dynamic shapes); the kernels run on concrete ints.
at::Tensor jagged_to_padded_dense_forward(const at::Tensor& values,
                                          const std::vector<at::Tensor>& offsets,
                                          c10::SymIntArrayRef max_lengths, double padding_value) {
  return jagged_to_padded_dense_impl(values, offsets, concrete(max_lengths), padding_value);
}

at::Tensor dense_to_jagged_forward(const at::Tensor& dense, const std::vector<at::Tensor>& offsets,
                                   c10::optional<c10::SymInt> total_L) {
  return dense_to_jagged_impl(dense, offsets, concrete(total_L));
}

at::Tensor jagged_to_padded_dense_backward(const at::Tensor& grad_output,
                                           const std::vector<at::Tensor>& offsets,
                                           c10::SymInt total_L) {
  const int64_t total = concrete(total_L);
  TORCH_CHECK_VALUE(total >= 0, "total_L: must be >= 0, got ", total);
  return dense_to_jagged_impl(grad_output, offsets, total);
}

std::tuple<at::Tensor, std::vector<at::Tensor>> dense_to_jagged(
    const at::Tensor& dense, const std::vector<at::Tensor>& offsets,
    c10::optional<c10::SymInt> total_L) {
  return {dense_to_jagged_impl(dense, offsets, concrete(total_L)), clone_all(offsets)};
}

at::Tensor jagged_1d_to_dense(const at::Tensor& values, const at::Tensor& offsets,
                              c10::SymInt max_sequence_length, int64_t padding_value) {
  TORCH_CHECK_VALUE(values.dim() == 1, "values: expected 1-D, got ", values.dim(), "-D");
  const int64_t ml[1] = {concrete(max_sequence_length)};
  return jagged_to_padded_dense_impl(values, {offsets}, at::IntArrayRef(ml, 1),
                                     static_cast<double>(padding_value));
}

at::Tensor jagged_2d_to_dense(const at::Tensor& values, const at::Tensor& offsets,
                              c10::SymInt max_sequence_length) {
  TORCH_CHECK_VALUE(values.dim() == 2, "values: expected 2-D, got ", values.dim(), "-D");
  const int64_t ml[1] = {concrete(max_sequence_length)};
  return jagged_to_padded_dense_impl(values, {offsets}, at::IntArrayRef(ml, 1), 0.0);
}

// ------------------------------------------------------------------------------ elementwise

namespace {

// Jagged x [T, D] against a dense partner y [B, N_0, ..., D]: the dense rows and the row width.
struct JaggedDense {
  DenseRows rows;
  int64_t T = 0, D = 0;
};

JaggedDense jagged_dense(const at::Tensor& x, const std::vector<at::Tensor>& offsets,
                         const at::Tensor& y, const char* y_arg) {
  TORCH_CHECK_VALUE(!offsets.empty(), "x_offsets: needs at least one jagged dimension");
  const int64_t J = static_cast<int64_t>(offsets.size());
  const auto dims = dense_dims(y, J, y_arg);
  TORCH_CHECK_VALUE(x.dim() >= 1, "x_values: expected at least 1-D");
  TORCH_CHECK_VALUE(y.dim() == x.dim() + J, y_arg, ": expected ", x.dim() + J,
                    " dims (x_values' ", x.dim(), " + ", J, " jagged), got ", y.dim());
  TORCH_CHECK_VALUE(x.scalar_type() == y.scalar_type(), y_arg, ": dtype ", y.scalar_type(),
                    " differs from x_values' ", x.scalar_type());
  for (int64_t i = 1; i < x.dim(); ++i) {
    TORCH_CHECK_VALUE(y.size(J + i) == x.size(i), y_arg, ": inner dims must match x_values'");
  }
  TORCH_CHECK(offsets[0].numel() == y.size(0) + 1, "x_offsets[0]: has ", offsets[0].numel(),
              " entries but ", y_arg, " has batch size ", y.size(0));
  JaggedDense jd;
  jd.rows = dense_rows(offsets, dims.data(), y.size(0), "x_offsets");
  jd.T = x.size(0);
  jd.D = row_width(x, 1);
  TORCH_CHECK_VALUE(jd.rows.last <= jd.T, "x_offsets: the last offset (", jd.rows.last,
                    ") exceeds the ", jd.T, " rows of x_values");
  return jd;
}

// out = f(x, y) over each segment's held slots and g(x) over the rest of x's rows (truncated
// tails, rows outside the jagged tensor), span by span: f(o, x, slot, m) and g(o, x, m) get
// pointers into out / x, the first dense slot of the span and its length m in elements.
template <typename scalar_t, typename F, typename G>
void jagged_output_pass(const JaggedDense& jd, int64_t J, const scalar_t* x, scalar_t* out,
                        F&& f, G&& g) {
  const auto& rows = jd.rows;
  const int64_t D = jd.D;
  if (J == 1) {
    parallel_over(rows.R, jd.T * D, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b0 = rows.begin[r] * D, n = rows.len[r] * D, full = rows.full[r] * D;
        if (n > 0) f(out + b0, x + b0, r * rows.N, n);
        if (full > n) g(out + b0 + n, x + b0 + n, full - n);
      }
    });
    const int64_t head = std::min(rows.first, jd.T) * D;
    if (head > 0) g(out, x, head);
    if (jd.T > rows.last) g(out + rows.last * D, x + rows.last * D, (jd.T - rows.last) * D);
  } else {
    parallel_over(jd.T, jd.T * D, [&](int64_t i0, int64_t i1) {
      g(out + i0 * D, x + i0 * D, (i1 - i0) * D);
    });
    for_each_span(rows, D, [&](int64_t, int64_t slot, int64_t row, int64_t n) {
      f(out + row * D, x + row * D, slot, n * D);
    });
  }
}

}  // namespace

at::Tensor jagged_dense_elementwise_add(const at::Tensor& x_values,
                                        const std::vector<at::Tensor>& x_offsets,
                                        const at::Tensor& y) {
  const auto jd = jagged_dense(x_values, x_offsets, y, "y");
  auto x = contiguous(x_values);
  auto yc = contiguous(y);
  auto out = empty_output(yc.sizes(), yc.options());
  const auto& rows = jd.rows;
  const int64_t D = jd.D, slots = rows.R * rows.N;
  if (slots == 0 || D == 0) return out;
  TRASC_DISPATCH_ALL(x.scalar_type(), "jagged_dense_elementwise_add", [&] {
    const scalar_t* xs = x.data_ptr<scalar_t>();
    const scalar_t* ys = yc.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    parallel_over(rows.R, slots * D, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t d0 = r * rows.N * D, n = rows.len[r] * D;
        add_rows(o + d0, ys + d0, xs + rows.begin[r] * D, n);
        copy_row(o + d0 + n, ys + d0 + n, rows.N * D - n);
      }
    });
  });
  return out;
}

at::Tensor jagged_dense_elementwise_add_jagged_values(const at::Tensor& x_values,
                                                      const std::vector<at::Tensor>& x_offsets,
                                                      const at::Tensor& y) {
  const auto jd = jagged_dense(x_values, x_offsets, y, "y");
  auto x = contiguous(x_values);
  auto yc = contiguous(y);
  auto out = empty_output(x.sizes(), x.options());
  if (jd.T == 0 || jd.D == 0) return out;
  const int64_t D = jd.D;
  TRASC_DISPATCH_ALL(x.scalar_type(), "jagged_dense_elementwise_add_jagged_output", [&] {
    const scalar_t* ys = yc.data_ptr<scalar_t>();
    jagged_output_pass<scalar_t>(
        jd, static_cast<int64_t>(x_offsets.size()), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
        [&](scalar_t* o, const scalar_t* xr, int64_t slot, int64_t m) { add_rows(o, xr, ys + slot * D, m); },
        [&](scalar_t* o, const scalar_t* xr, int64_t m) { copy_row(o, xr, m); });
  });
  return out;
}

std::tuple<at::Tensor, std::vector<at::Tensor>> jagged_dense_elementwise_add_jagged_output(
    const at::Tensor& x_values, const std::vector<at::Tensor>& x_offsets, const at::Tensor& y) {
  return {jagged_dense_elementwise_add_jagged_values(x_values, x_offsets, y), clone_all(x_offsets)};
}

at::Tensor jagged_dense_elementwise_mul_forward(const at::Tensor& x_values,
                                                const std::vector<at::Tensor>& x_offsets,
                                                const at::Tensor& y) {
  const auto jd = jagged_dense(x_values, x_offsets, y, "y");
  auto x = contiguous(x_values);
  auto yc = contiguous(y);
  auto out = empty_output(x.sizes(), x.options());
  if (jd.T == 0 || jd.D == 0) return out;
  const int64_t D = jd.D;
  TRASC_DISPATCH_ALL(x.scalar_type(), "jagged_dense_elementwise_mul", [&] {
    const scalar_t* ys = yc.data_ptr<scalar_t>();
    jagged_output_pass<scalar_t>(
        jd, static_cast<int64_t>(x_offsets.size()), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
        [&](scalar_t* o, const scalar_t* xr, int64_t slot, int64_t m) { mul_rows(o, xr, ys + slot * D, m); },
        [&](scalar_t* o, const scalar_t* xr, int64_t m) { mul_zero_rows(o, xr, m); });
  });
  return out;
}

std::tuple<at::Tensor, std::vector<at::Tensor>> jagged_dense_elementwise_mul(
    const at::Tensor& x_values, const std::vector<at::Tensor>& x_offsets, const at::Tensor& y) {
  return {jagged_dense_elementwise_mul_forward(x_values, x_offsets, y), clone_all(x_offsets)};
}

std::tuple<at::Tensor, at::Tensor> jagged_dense_elementwise_mul_backward(
    const at::Tensor& grad_output, const std::vector<at::Tensor>& x_offsets, const at::Tensor& y,
    const at::Tensor& x_values) {
  const auto jd = jagged_dense(grad_output, x_offsets, y, "y");
  TORCH_CHECK_VALUE(x_values.sizes() == grad_output.sizes(),
                    "x_values: must have grad_output's shape");
  auto g = contiguous(grad_output);
  auto x = contiguous(x_values);
  auto yc = contiguous(y);
  auto grad_x = empty_output(g.sizes(), g.options());
  auto grad_y = zeroed_output(yc.sizes(), yc.options());
  const auto& rows = jd.rows;
  const int64_t D = jd.D, slots = rows.R * rows.N;
  TRASC_DISPATCH_ALL(g.scalar_type(), "jagged_dense_elementwise_mul_backward", [&] {
    const scalar_t* gs = g.data_ptr<scalar_t>();
    const scalar_t* xs = x.data_ptr<scalar_t>();
    const scalar_t* ys = yc.data_ptr<scalar_t>();
    scalar_t* gy = grad_y.data_ptr<scalar_t>();
    if (jd.T > 0 && D > 0) {
      jagged_output_pass<scalar_t>(
          jd, static_cast<int64_t>(x_offsets.size()), gs, grad_x.data_ptr<scalar_t>(),
          [&](scalar_t* o, const scalar_t* gr, int64_t slot, int64_t m) { mul_rows(o, gr, ys + slot * D, m); },
          [&](scalar_t* o, const scalar_t* gr, int64_t m) { mul_zero_rows(o, gr, m); });
    }
    if (slots > 0 && D > 0) {
      parallel_over(rows.R, slots * D, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t d0 = r * rows.N * D, n = rows.len[r] * D, row = rows.begin[r] * D;
          mul_rows(gy + d0, gs + row, xs + row, n);  // the padding slots are zero already
        }
      });
    }
  });
  return {grad_x, grad_y};
}

at::Tensor jagged_dense_dense_elementwise_add_jagged_output_forward(
    const at::Tensor& x_values, const std::vector<at::Tensor>& x_offsets, const at::Tensor& y_0,
    const at::Tensor& y_1) {
  const auto jd0 = jagged_dense(x_values, x_offsets, y_0, "y_0");
  const auto jd1 = jagged_dense(x_values, x_offsets, y_1, "y_1");
  auto x = contiguous(x_values);
  auto y0 = contiguous(y_0);
  auto y1 = contiguous(y_1);
  auto out = empty_output(x.sizes(), x.options());
  if (jd0.T == 0 || jd0.D == 0) return out;
  const int64_t D = jd0.D, J = static_cast<int64_t>(x_offsets.size());
  TRASC_DISPATCH_ALL(x.scalar_type(), "jagged_dense_dense_elementwise_add_jagged_output", [&] {
    const scalar_t* a = y0.data_ptr<scalar_t>();
    const scalar_t* b = y1.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    const scalar_t* xs = x.data_ptr<scalar_t>();
    if (y_0.sizes() == y_1.sizes()) {  // one pass: both dense terms hold the same slots
      jagged_output_pass<scalar_t>(
          jd0, J, xs, o,
          [&](scalar_t* orow, const scalar_t* xr, int64_t slot, int64_t m) {
            add3_rows(orow, xr, a + slot * D, b + slot * D, m);
          },
          [&](scalar_t* orow, const scalar_t* xr, int64_t m) { copy_row(orow, xr, m); });
    } else {  // x + y_0 where y_0 has the slot, then + y_1 where y_1 has it
      jagged_output_pass<scalar_t>(
          jd0, J, xs, o,
          [&](scalar_t* orow, const scalar_t* xr, int64_t slot, int64_t m) {
            add_rows(orow, xr, a + slot * D, m);
          },
          [&](scalar_t* orow, const scalar_t* xr, int64_t m) { copy_row(orow, xr, m); });
      for_each_span(jd1.rows, D, [&](int64_t, int64_t slot, int64_t row, int64_t n) {
        add_into(o + row * D, b + slot * D, n * D);
      });
    }
  });
  return out;
}

std::tuple<at::Tensor, std::vector<at::Tensor>> jagged_dense_dense_elementwise_add_jagged_output(
    const at::Tensor& x_values, const std::vector<at::Tensor>& x_offsets, const at::Tensor& y_0,
    const at::Tensor& y_1) {
  return {jagged_dense_dense_elementwise_add_jagged_output_forward(x_values, x_offsets, y_0, y_1),
          clone_all(x_offsets)};
}

// ------------------------------------------------------------------------------ softmax

namespace {

struct Segments1 {  // one jagged dimension: B segments of a [T, D] values tensor
  std::vector<int64_t> off;
  int64_t B = 0, T = 0, D = 0;
};

Segments1 segments(const at::Tensor& values, const at::Tensor& offsets, const char* v_arg,
                   const char* o_arg) {
  TORCH_CHECK_VALUE(values.dim() == 2, v_arg, ": expected 2-D [T, D], got ", values.dim(), "-D");
  Segments1 s;
  s.off = to_vec(offsets, o_arg);
  check_monotone(s.off, o_arg, 0);
  s.B = static_cast<int64_t>(s.off.size()) - 1;
  s.T = values.size(0);
  s.D = values.size(1);
  TORCH_CHECK_VALUE(s.off.back() <= s.T, o_arg, ": the last offset (", s.off.back(),
                    ") exceeds the ", s.T, " rows of ", v_arg);
  return s;
}

// f(b, first row, rows used (<= max_L), rows of the segment) per segment, in parallel
template <typename F>
void for_each_segment(const Segments1& s, int64_t max_L, int64_t work_per_row, F&& f) {
  parallel_over(s.B, s.T * work_per_row, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t full = s.off[b + 1] - s.off[b];
      f(b, s.off[b], std::min(full, std::max<int64_t>(max_L, 0)), full);
    }
  });
}

}  // namespace

at::Tensor jagged_softmax_forward(const at::Tensor& values, const at::Tensor& x_offsets,
                                  int64_t max_L) {
  const auto s = segments(values, x_offsets, "values", "x_offsets");
  auto v = contiguous(values);
  auto out = empty_output(v.sizes(), v.options());
  const int64_t D = s.D;
  if (s.T == 0 || D == 0) return out;
  TRASC_DISPATCH_FLOAT(v.scalar_type(), "jagged_softmax_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* x = v.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for_each_segment(s, max_L, D, [&](int64_t, int64_t start, int64_t n, int64_t full) {
      std::vector<acc_t> m(D, -std::numeric_limits<acc_t>::infinity()), sum(D, acc_t(0));
      std::vector<acc_t> e(std::is_same_v<acc_t, scalar_t> ? 0 : n * D);
      for (int64_t i = 0; i < n; ++i) {
        const scalar_t* xr = x + (start + i) * D;
        for (int64_t d = 0; d < D; ++d) m[d] = std::max(m[d], static_cast<acc_t>(xr[d]));
      }
      for (int64_t i = 0; i < n; ++i) {
        const scalar_t* xr = x + (start + i) * D;
        for (int64_t d = 0; d < D; ++d) {
          const acc_t ev = std::exp(static_cast<acc_t>(xr[d]) - m[d]);
          sum[d] += ev;
          if constexpr (std::is_same_v<acc_t, scalar_t>) {
            o[(start + i) * D + d] = ev;
          } else {
            e[i * D + d] = ev;
          }
        }
      }
      for (int64_t d = 0; d < D; ++d) sum[d] = acc_t(1) / sum[d];
      for (int64_t i = 0; i < n; ++i) {
        scalar_t* orow = o + (start + i) * D;
        for (int64_t d = 0; d < D; ++d) {
          if constexpr (std::is_same_v<acc_t, scalar_t>) {
            orow[d] *= sum[d];
          } else {
            orow[d] = static_cast<scalar_t>(e[i * D + d] * sum[d]);
          }
        }
      }
      // rows past max_L are 0 (fbgemm leaves them unset)
      std::fill(o + (start + n) * D, o + (start + full) * D, scalar_t(0));
    });
    std::fill(o + s.off.back() * D, o + s.T * D, scalar_t(0));
  });
  return out;
}

at::Tensor jagged_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output,
                                   const at::Tensor& x_offsets, int64_t max_L) {
  const auto s = segments(output, x_offsets, "output", "x_offsets");
  TORCH_CHECK_VALUE(grad_output.sizes() == output.sizes(), "grad_output: must have output's shape");
  auto g = contiguous(grad_output);
  auto y = contiguous(output);
  auto out = empty_output(g.sizes(), g.options());
  const int64_t D = s.D;
  if (s.T == 0 || D == 0) return out;
  TRASC_DISPATCH_FLOAT(g.scalar_type(), "jagged_softmax_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gs = g.data_ptr<scalar_t>();
    const scalar_t* ys = y.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for_each_segment(s, max_L, D, [&](int64_t, int64_t start, int64_t n, int64_t full) {
      std::vector<acc_t> dot(D, acc_t(0));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = (start + i) * D;
        for (int64_t d = 0; d < D; ++d) {
          dot[d] += static_cast<acc_t>(gs[r + d]) * static_cast<acc_t>(ys[r + d]);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = (start + i) * D;
        for (int64_t d = 0; d < D; ++d) {
          o[r + d] = static_cast<scalar_t>(static_cast<acc_t>(ys[r + d]) *
                                           (static_cast<acc_t>(gs[r + d]) - dot[d]));
        }
      }
      std::fill(o + (start + n) * D, o + (start + full) * D, scalar_t(0));
    });
    std::fill(o + s.off.back() * D, o + s.T * D, scalar_t(0));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> jagged_softmax(const at::Tensor& values,
                                                  const at::Tensor& x_offsets, int64_t max_L) {
  return {jagged_softmax_forward(values, x_offsets, max_L), x_offsets.clone()};
}

// ------------------------------------------------------------------------------ batched GEMMs

namespace {

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

at::Tensor jagged_jagged_bmm_forward(const at::Tensor& x_values, const at::Tensor& y_values,
                                     const at::Tensor& x_offsets, int64_t max_L) {
  TORCH_CHECK_VALUE(x_values.dim() == 2 && y_values.dim() == 2, "x_values, y_values: expected 2-D");
  const auto off = to_vec(x_offsets, "x_offsets");
  check_monotone(off, "x_offsets", 0);
  const int64_t B = static_cast<int64_t>(off.size()) - 1;
  TORCH_CHECK_VALUE(off.back() <= std::min(x_values.size(0), y_values.size(0)),
                    "x_offsets: the last offset exceeds the rows of x_values / y_values");
  auto x = contiguous(x_values);
  auto y = contiguous(y_values);
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
  TORCH_CHECK_VALUE(x_values.dim() == 2 && y.dim() == 3, "x_values: expected 2-D, y: 3-D");
  const auto off = to_vec(x_offsets, "x_offsets");
  check_monotone(off, "x_offsets", 0);
  TORCH_CHECK_VALUE(off.back() <= x_values.size(0),
                    "x_offsets: the last offset exceeds the rows of x_values");
  auto x = contiguous(x_values);
  auto yc = contiguous(y);
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

std::tuple<at::Tensor, at::Tensor> jagged_dense_bmm(const at::Tensor& x_values,
                                                    const at::Tensor& x_offsets, const at::Tensor& y,
                                                    int64_t max_L) {
  return {jagged_dense_bmm_forward(x_values, x_offsets, y, max_L), x_offsets.clone()};
}

// v [B*H, N] x jagged a [T, H*D] (each sequence truncated to N rows) -> [B*H, D]
at::Tensor batched_dense_vec_jagged_2d_mul_forward(const at::Tensor& v, const at::Tensor& a_values,
                                                   const at::Tensor& a_offsets) {
  const auto s = segments(a_values, a_offsets, "a_values", "a_offsets");
  TORCH_CHECK_VALUE(v.dim() == 2, "v: expected 2-D [B*H, N], got ", v.dim(), "-D");
  TORCH_CHECK_VALUE(v.scalar_type() == a_values.scalar_type(), "v: dtype differs from a_values'");
  const int64_t BH = v.size(0), N = v.size(1);
  const int64_t H = s.B ? BH / s.B : 1;
  TORCH_CHECK_VALUE(s.B == 0 ? BH == 0 : (H > 0 && BH == H * s.B), "v: rows (", BH,
                    ") must be B * H for B=", s.B);
  TORCH_CHECK_VALUE(s.D % H == 0, "a_values: width ", s.D, " is not a multiple of H=", H);
  const int64_t D = s.D / H;
  auto vc = contiguous(v);
  auto a = contiguous(a_values);
  auto out = at::empty({BH, D}, a.options());
  if (BH == 0 || D == 0) return out;
  TRASC_DISPATCH_FLOAT(a.scalar_type(), "batched_dense_vec_jagged_2d_mul_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* vs = vc.data_ptr<scalar_t>();
    const scalar_t* as = a.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    parallel_over(BH, s.T * D + BH * D, [&](int64_t p0, int64_t p1) {
      std::vector<acc_t> acc(D);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t b = p / H, h = p % H;
        const int64_t len = std::min(s.off[b + 1] - s.off[b], N);
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t l = 0; l < len; ++l) {
          const acc_t w = static_cast<acc_t>(vs[p * N + l]);
          const scalar_t* row = as + (s.off[b] + l) * s.D + h * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * static_cast<acc_t>(row[d]);
        }
        for (int64_t d = 0; d < D; ++d) o[p * D + d] = static_cast<scalar_t>(acc[d]);
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> batched_dense_vec_jagged_2d_mul_backward(
    const at::Tensor& grad_output, const at::Tensor& v, const at::Tensor& a_values,
    const at::Tensor& a_offsets) {
  const auto s = segments(a_values, a_offsets, "a_values", "a_offsets");
  TORCH_CHECK_VALUE(v.dim() == 2 && grad_output.dim() == 2, "v, grad_output: expected 2-D");
  const int64_t BH = v.size(0), N = v.size(1);
  const int64_t H = s.B ? BH / s.B : 1;
  TORCH_CHECK_VALUE(s.B == 0 ? BH == 0 : (H > 0 && BH == H * s.B), "v: rows must be B * H");
  TORCH_CHECK_VALUE(s.D % H == 0, "a_values: width is not a multiple of H");
  const int64_t D = s.D / H;
  TORCH_CHECK_VALUE(grad_output.size(0) == BH && grad_output.size(1) == D,
                    "grad_output: expected [B*H, D]");
  auto g = contiguous(grad_output);
  auto vc = contiguous(v);
  auto a = contiguous(a_values);
  auto grad_v = at::empty({BH, N}, vc.options());
  auto grad_a = at::empty(a.sizes(), a.options());
  TRASC_DISPATCH_FLOAT(a.scalar_type(), "batched_dense_vec_jagged_2d_mul_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gs = g.data_ptr<scalar_t>();
    const scalar_t* vs = vc.data_ptr<scalar_t>();
    const scalar_t* as = a.data_ptr<scalar_t>();
    scalar_t* gv = grad_v.data_ptr<scalar_t>();
    scalar_t* ga = grad_a.data_ptr<scalar_t>();
    // one sequence per task: grad_v rows b*H.. and grad_a rows of the segment are its own
    parallel_over(s.B, s.T * s.D + BH * N, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t full = s.off[b + 1] - s.off[b];
        const int64_t len = std::min(full, N);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t p = b * H + h;
          const scalar_t* grow = gs + p * D;
          for (int64_t l = 0; l < len; ++l) {
            const scalar_t* row = as + (s.off[b] + l) * s.D + h * D;
            acc_t dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += static_cast<acc_t>(grow[d]) * static_cast<acc_t>(row[d]);
            gv[p * N + l] = static_cast<scalar_t>(dot);
          }
          std::fill(gv + p * N + len, gv + (p + 1) * N, scalar_t(0));
        }
        for (int64_t l = 0; l < len; ++l) {
          scalar_t* garow = ga + (s.off[b] + l) * s.D;
          for (int64_t h = 0; h < H; ++h) {
            const acc_t w = static_cast<acc_t>(vs[(b * H + h) * N + l]);
            const scalar_t* grow = gs + (b * H + h) * D;
            for (int64_t d = 0; d < D; ++d) {
              garow[h * D + d] = static_cast<scalar_t>(w * static_cast<acc_t>(grow[d]));
            }
          }
        }
        std::fill(ga + (s.off[b] + len) * s.D, ga + (s.off[b] + full) * s.D, scalar_t(0));
      }
    });
    std::fill(ga + s.off.back() * s.D, ga + s.T * s.D, scalar_t(0));
  });
  return {grad_v, grad_a};
}

// ------------------------------------------------------------------------------ selection

namespace {

std::vector<int64_t> lengths_vec(const at::Tensor& lengths, const char* arg) {
  auto out = to_vec(lengths, arg);
  for (size_t i = 0; i < out.size(); ++i) {
    TORCH_CHECK_VALUE(out[i] >= 0, arg, ": must be non-negative, entry ", i, " is ", out[i]);
  }
  return out;
}

std::vector<int64_t> exclusive(const std::vector<int64_t>& len) {
  std::vector<int64_t> off(len.size() + 1, 0);
  for (size_t i = 0; i < len.size(); ++i) off[i + 1] = off[i] + len[i];
  return off;
}

// out rows [dst[k], dst[k] + n[k]) = in rows [src[k], src[k] + n[k]), rows of D elements
at::Tensor gather_runs(const at::Tensor& values, const std::vector<int64_t>& src,
                       const std::vector<int64_t>& dst, const std::vector<int64_t>& n,
                       int64_t total) {
  auto v = contiguous(values);
  const int64_t D = row_width(v, 1);
  std::vector<int64_t> shape = {total};
  for (int64_t i = 1; i < v.dim(); ++i) shape.push_back(v.size(i));
  auto out = empty_output(shape, v.options());
  if (total == 0 || D == 0) return out;
  const int64_t bytes = D * static_cast<int64_t>(v.element_size());
  const char* in = static_cast<const char*>(v.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  const int64_t K = static_cast<int64_t>(n.size());
  // a large output by non-temporal stores (csrc/isa.h)
  const bool stream = stream_output(total * bytes);
  parallel_over(K, total * D, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      if (n[k] <= 0) continue;
      if (stream) {
        stream_copy(o + dst[k] * bytes, in + src[k] * bytes, n[k] * bytes);
      } else {
        std::memcpy(o + dst[k] * bytes, in + src[k] * bytes, n[k] * bytes);
      }
    }
    if (stream) stream_fence();
  });
  return out;
}

at::Tensor lengths_like(const at::Tensor& like, const std::vector<int64_t>& len) {
  auto out = at::empty({static_cast<int64_t>(len.size())}, like.options());
  AT_DISPATCH_INDEX_TYPES(like.scalar_type(), "lengths", [&] {
    index_t* p = out.data_ptr<index_t>();
    for (size_t i = 0; i < len.size(); ++i) p[i] = static_cast<index_t>(len[i]);
  });
  return out;
}

}  // namespace

std::vector<at::Tensor> jagged_index_select(const at::Tensor& values, const at::Tensor& lengths,
                                            const at::Tensor& indices,
                                            c10::optional<int64_t> num_dense_output_rows) {
  TORCH_CHECK_VALUE(values.dim() >= 1, "values: expected at least 1-D");
  const auto len = lengths_vec(lengths, "lengths");
  const auto in_off = exclusive(len);
  TORCH_CHECK_VALUE(in_off.back() <= values.size(0), "lengths: sum to ", in_off.back(),
                    " but values has ", values.size(0), " rows");
  const auto idx = to_vec(indices, "indices");
  const int64_t B = static_cast<int64_t>(len.size());
  const int64_t K = static_cast<int64_t>(idx.size());
  std::vector<int64_t> src(K), n(K);
  for (int64_t k = 0; k < K; ++k) {
    TORCH_CHECK_VALUE(idx[k] >= 0 && idx[k] < B, "indices: entry ", k, " is ", idx[k],
                      ", outside [0, ", B, ")");
    src[k] = in_off[idx[k]];
    n[k] = len[idx[k]];
  }
  const auto dst = exclusive(n);
  TORCH_CHECK_VALUE(!num_dense_output_rows.has_value() || *num_dense_output_rows == dst.back(),
                    "num_dense_output_rows: is ", num_dense_output_rows.value_or(0),
                    " but the selected sequences have ", dst.back(), " rows");
  return {gather_runs(values, src, dst, n, dst.back()), lengths_like(lengths, n)};
}

std::tuple<at::Tensor, at::Tensor> jagged_slice(const at::Tensor& x_values,
                                                const at::Tensor& x_lengths,
                                                const at::Tensor& start, int64_t slice_length) {
  TORCH_CHECK_VALUE(x_values.dim() >= 1, "x_values: expected at least 1-D");
  TORCH_CHECK_VALUE(slice_length >= 0, "slice_length: must be >= 0, got ", slice_length);
  const auto len = lengths_vec(x_lengths, "x_lengths");
  const auto in_off = exclusive(len);
  TORCH_CHECK_VALUE(in_off.back() <= x_values.size(0), "x_lengths: sum to ", in_off.back(),
                    " but x_values has ", x_values.size(0), " rows");
  const auto st = to_vec(start, "start");
  const int64_t B = static_cast<int64_t>(len.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(st.size()) == B, "start: needs one entry per sequence");
  std::vector<int64_t> src(B), n(B);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK_VALUE(st[b] >= 0, "start: entry ", b, " is ", st[b], ", must be >= 0");
    n[b] = std::max<int64_t>(std::min(len[b] - st[b], slice_length), 0);
    src[b] = in_off[b] + st[b];
  }
  const auto dst = exclusive(n);
  return {gather_runs(x_values, src, dst, n, dst.back()), lengths_like(x_lengths, n)};
}

// ------------------------------------------------------------------------------ stacked (keyed)

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> stacked_jagged_2d_to_dense_forward(
    const at::Tensor& values, const at::Tensor& lengths, at::IntArrayRef offset_per_key,
    at::IntArrayRef max_lengths_per_key, int64_t padding_value) {
  TORCH_CHECK_VALUE(values.dim() == 2, "values: expected 2-D [T, D]");
  TORCH_CHECK_VALUE(lengths.dim() == 2, "lengths: expected 2-D [K, B]");
  const int64_t K = lengths.size(0), B = lengths.size(1), D = values.size(1);
  TORCH_CHECK_VALUE(static_cast<int64_t>(offset_per_key.size()) == K + 1,
                    "offset_per_key: needs K + 1 entries");
  TORCH_CHECK_VALUE(static_cast<int64_t>(max_lengths_per_key.size()) == K,
                    "max_lengths_per_key: needs K entries");
  const auto len = lengths_vec(lengths.contiguous().reshape({-1}), "lengths");
  auto v = contiguous(values);
  std::vector<at::Tensor> padded, offsets;
  for (int64_t k = 0; k < K; ++k) {
    std::vector<int64_t> lk(len.begin() + k * B, len.begin() + (k + 1) * B);
    const auto off = exclusive(lk);
    TORCH_CHECK_VALUE(offset_per_key[k] >= 0 && offset_per_key[k] + off.back() <= v.size(0),
                      "offset_per_key: key ", k, "'s rows run past the rows of values");
    auto off_t = lengths_like(lengths, off);
    const int64_t ml[1] = {max_lengths_per_key[k]};
    padded.push_back(jagged_to_padded_dense_impl(
        v.narrow(0, offset_per_key[k], off.back()), {off_t}, at::IntArrayRef(ml, 1),
        static_cast<double>(padding_value)));
    offsets.push_back(off_t);
  }
  (void)D;
  return {padded, offsets};
}

std::vector<at::Tensor> stacked_jagged_2d_to_dense(const at::Tensor& values,
                                                   const at::Tensor& lengths,
                                                   at::IntArrayRef offset_per_key,
                                                   at::IntArrayRef max_lengths_per_key,
                                                   int64_t padding_value) {
  return std::get<0>(stacked_jagged_2d_to_dense_forward(values, lengths, offset_per_key,
                                                        max_lengths_per_key, padding_value));
}

at::Tensor stacked_jagged_2d_to_dense_backward(int64_t B, int64_t D, int64_t total_L,
                                               const std::vector<at::Tensor>& grad_padded_values_per_key,
                                               const std::vector<at::Tensor>& offsets_tensor_per_key,
                                               at::IntArrayRef offset_per_key) {
  const int64_t K = static_cast<int64_t>(grad_padded_values_per_key.size());
  TORCH_CHECK_VALUE(K >= 1 && static_cast<int64_t>(offsets_tensor_per_key.size()) == K &&
                        static_cast<int64_t>(offset_per_key.size()) == K + 1,
                    "grad_padded_values_per_key / offsets_tensor_per_key / offset_per_key: need K, "
                    "K and K + 1 entries");
  auto out = at::zeros({total_L, D}, grad_padded_values_per_key[0].options());
  for (int64_t k = 0; k < K; ++k) {
    const int64_t lo = offset_per_key[k], hi = offset_per_key[k + 1];
    TORCH_CHECK_VALUE(0 <= lo && lo <= hi && hi <= total_L, "offset_per_key: key ", k,
                      " spans [", lo, ", ", hi, ") outside [0, ", total_L, ")");
    out.narrow(0, lo, hi - lo).copy_(dense_to_jagged_impl(
        grad_padded_values_per_key[k], {offsets_tensor_per_key[k]}, hi - lo));
  }
  (void)B;
  return out;
}

void bind_jagged(pybind11::module& m) {
  m.def("jagged_to_padded_dense_forward", &jagged_to_padded_dense_forward);
  m.def("dense_to_jagged_forward", &dense_to_jagged_forward);
  m.def("jagged_to_padded_dense_backward", &jagged_to_padded_dense_backward);
  m.def("dense_to_jagged", &dense_to_jagged);
  m.def("jagged_1d_to_dense", &jagged_1d_to_dense);
  m.def("jagged_2d_to_dense", &jagged_2d_to_dense);
  m.def("jagged_dense_elementwise_add", &jagged_dense_elementwise_add);
  m.def("jagged_dense_elementwise_add_jagged_output", &jagged_dense_elementwise_add_jagged_output);
  m.def("jagged_dense_elementwise_mul_forward", &jagged_dense_elementwise_mul_forward);
  m.def("jagged_dense_elementwise_mul_backward", &jagged_dense_elementwise_mul_backward);
  m.def("jagged_dense_elementwise_mul", &jagged_dense_elementwise_mul);
  m.def("jagged_dense_dense_elementwise_add_jagged_output_forward",
        &jagged_dense_dense_elementwise_add_jagged_output_forward);
  m.def("jagged_dense_dense_elementwise_add_jagged_output",
        &jagged_dense_dense_elementwise_add_jagged_output);
  m.def("jagged_softmax_forward", &jagged_softmax_forward);
  m.def("jagged_softmax_backward", &jagged_softmax_backward);
  m.def("jagged_softmax", &jagged_softmax);
  m.def("jagged_jagged_bmm_forward", &jagged_jagged_bmm_forward);
  m.def("jagged_dense_bmm_forward", &jagged_dense_bmm_forward);
  m.def("jagged_dense_bmm", &jagged_dense_bmm);
  m.def("batched_dense_vec_jagged_2d_mul_forward", &batched_dense_vec_jagged_2d_mul_forward);
  m.def("batched_dense_vec_jagged_2d_mul_backward", &batched_dense_vec_jagged_2d_mul_backward);
  m.def("jagged_index_select", &jagged_index_select);
  m.def("jagged_slice", &jagged_slice);
  m.def("stacked_jagged_2d_to_dense_forward", &stacked_jagged_2d_to_dense_forward);
  m.def("stacked_jagged_2d_to_dense_backward", &stacked_jagged_2d_to_dense_backward);
  m.def("stacked_jagged_2d_to_dense", &stacked_jagged_2d_to_dense);

  // direct dispatcher kernels (csrc/direct.h): every jagged op, its C++ covering every case
  auto& t = direct::table();
  t.push_back(direct::entry<&jagged_to_padded_dense_forward>("jagged_to_padded_dense_forward"));
  t.push_back(direct::entry<&jagged_to_padded_dense_forward>("jagged_to_padded_dense"));
  t.push_back(direct::entry<&jagged_to_padded_dense_backward>("jagged_to_padded_dense_backward"));
  t.push_back(direct::entry<&dense_to_jagged_forward>("dense_to_jagged_forward"));
  t.push_back(direct::entry<&dense_to_jagged>("dense_to_jagged"));
  t.push_back(direct::entry<&jagged_1d_to_dense>("jagged_1d_to_dense"));
  t.push_back(direct::entry<&jagged_2d_to_dense>("jagged_2d_to_dense"));
  t.push_back(direct::entry<&stacked_jagged_2d_to_dense_forward>("stacked_jagged_2d_to_dense_forward"));
  t.push_back(direct::entry<&stacked_jagged_2d_to_dense_backward>("stacked_jagged_2d_to_dense_backward"));
  t.push_back(direct::entry<&stacked_jagged_2d_to_dense>("stacked_jagged_2d_to_dense"));
  t.push_back(direct::entry<&jagged_dense_elementwise_add>("jagged_dense_elementwise_add"));
  t.push_back(direct::entry<&jagged_dense_elementwise_add_jagged_output>(
      "jagged_dense_elementwise_add_jagged_output"));
  t.push_back(direct::entry<&jagged_dense_elementwise_mul_forward>("jagged_dense_elementwise_mul_forward"));
  t.push_back(direct::entry<&jagged_dense_elementwise_mul_backward>("jagged_dense_elementwise_mul_backward"));
  t.push_back(direct::entry<&jagged_dense_elementwise_mul>("jagged_dense_elementwise_mul"));
  t.push_back(direct::entry<&jagged_dense_dense_elementwise_add_jagged_output_forward>(
      "jagged_dense_dense_elementwise_add_jagged_output_forward"));
  t.push_back(direct::entry<&jagged_dense_dense_elementwise_add_jagged_output>(
      "jagged_dense_dense_elementwise_add_jagged_output"));
  t.push_back(direct::entry<&jagged_softmax_forward>("jagged_softmax_forward"));
  t.push_back(direct::entry<&jagged_softmax_backward>("jagged_softmax_backward"));
  t.push_back(direct::entry<&jagged_softmax>("jagged_softmax"));
  t.push_back(direct::entry<&jagged_jagged_bmm_forward>("jagged_jagged_bmm_forward"));
  t.push_back(direct::entry<&jagged_jagged_bmm_forward>("jagged_jagged_bmm"));
  t.push_back(direct::entry<&jagged_dense_bmm_forward>("jagged_dense_bmm_forward"));
  t.push_back(direct::entry<&jagged_dense_bmm>("jagged_dense_bmm"));
  t.push_back(direct::entry<&batched_dense_vec_jagged_2d_mul_forward>(
      "batched_dense_vec_jagged_2d_mul_forward"));
  t.push_back(direct::entry<&batched_dense_vec_jagged_2d_mul_forward>(
      "batched_dense_vec_jagged_2d_mul"));
  t.push_back(direct::entry<&batched_dense_vec_jagged_2d_mul_backward>(
      "batched_dense_vec_jagged_2d_mul_backward"));
  t.push_back(direct::entry<&jagged_index_select>("jagged_index_select"));
  t.push_back(direct::entry<&jagged_slice>("jagged_slice"));
}

}  // namespace torchrec_ascend
