// CPU kernels for the table-batched embedding (TBE) lookup forwards (ops/embedding.py):
// pooled (sum / mean, optionally per-index weighted) and sequence (no pooling), in fbgemm's
// pt2-wrapper argument order.  Semantics are the torch reference's (ops/reference/embedding.py):
// fbgemm's layout, fp32 accumulation (fp64 for fp64 weights), indices past offsets[-1] belong
// to no bag (zero rows in sequence output), and a row outside the weights is a ValueError
// (fbgemm trusts bounds_check_indices instead).
// Parallel over bags (pooled) or indices (sequence): every output row is written by one thread.
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "parallel.h"
#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

constexpr int64_t kPoolMean = 1, kPoolNone = 2;

std::vector<int64_t> i64(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// fbgemm SparseType -> dtype (FP32, FP16, BF16); fp64 weights always give fp64.
at::ScalarType out_dtype(const at::Tensor& w, int64_t output_dtype) {
  if (w.scalar_type() == at::kDouble) return at::kDouble;
  switch (output_dtype) {
    case 0: return at::kFloat;
    case 1: return at::kHalf;
    case 5: return at::kBFloat16;
    default: return w.scalar_type();
  }
}

const at::Tensor& pick(const at::Tensor& host, const at::Tensor& dev) {
  return host.numel() > 0 ? host : dev;
}

// o[d] += s * row[d]: the pooled inner loop.  fp32 gets an AVX2/FMA clone picked at load time
// (the extension is built for the baseline ISA); other types a generic loop.
__attribute__((target_clones("arch=haswell", "default")))
void axpy_f32(float* __restrict o, const float* __restrict row, float s, int64_t D) {
  for (int64_t d = 0; d < D; ++d) o[d] += s * row[d];
}

template <typename acc, typename scalar_t>
inline void axpy(acc* o, const scalar_t* row, acc s, int64_t D) {
  if constexpr (std::is_same_v<acc, float> && std::is_same_v<scalar_t, float>) {
    axpy_f32(o, row, s, D);
  } else {
    for (int64_t d = 0; d < D; ++d) o[d] += s * static_cast<acc>(row[d]);
  }
}

constexpr int64_t kAhead = 8;  // rows prefetched ahead of the one being summed

// Ask for a row ahead of its use (rows are random: the hardware prefetcher cannot guess them).
template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t D) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b);
}

template <typename index_t>
void check_row(int64_t start, int64_t D, int64_t numel, int64_t pos, index_t idx) {
  TORCH_CHECK_VALUE(idx >= 0 && start >= 0 && start + D <= numel, "indices: indices[", pos, "]=",
                    static_cast<int64_t>(idx), " addresses a row outside the weights (run "
                    "bounds_check_indices first)");
}

at::Tensor pooled(const at::Tensor& weights_in, const at::Tensor& weights_offsets,
                  const at::Tensor& D_offsets, int64_t total_D, const at::Tensor& indices_in,
                  const at::Tensor& offsets_in, int64_t pooling_mode,
                  const c10::optional<at::Tensor>& indice_weights, int64_t output_dtype) {
  auto w = weights_in.contiguous();
  auto indices = indices_in.contiguous();
  const auto w_off = i64(weights_offsets);
  const auto d_off = i64(D_offsets);
  const auto offs = i64(offsets_in);
  const int64_t T = static_cast<int64_t>(w_off.size());
  TORCH_CHECK_VALUE(T > 0 && static_cast<int64_t>(d_off.size()) == T + 1,
                    "D_offsets: needs len(weights_offsets) + 1 entries");
  const int64_t B = (static_cast<int64_t>(offs.size()) - 1) / T;
  const int64_t N = indices.numel();
  const at::ScalarType acc_t = w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto out = at::zeros({B, total_D}, w.options().dtype(acc_t));
  at::Tensor iw;
  if (indice_weights.has_value() && indice_weights->numel() > 0) {
    iw = indice_weights->to(acc_t).contiguous();
    TORCH_CHECK_VALUE(iw.numel() == N, "indice_weights: needs one weight per index");
  }
  for (int64_t k = 0; k < T * B; ++k) {
    TORCH_CHECK_VALUE(offs[k] >= 0 && offs[k] <= offs[k + 1] && offs[k + 1] <= N,
                      "offsets: bag ", k, " spans [", offs[k], ", ", offs[k + 1],
                      ") outside the ", N, " indices");
  }
  const int64_t wn = w.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, w.scalar_type(), "tbe_pooled", [&] {
    using acc = at::opmath_type<scalar_t>;
    const scalar_t* wp = w.data_ptr<scalar_t>();
    acc* op = out.data_ptr<acc>();
    const acc* iwp = iw.defined() ? iw.data_ptr<acc>() : nullptr;
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "tbe_pooled_idx", [&] {
      const index_t* ip = indices.data_ptr<index_t>();
      const int64_t work = (offs[T * B] - offs[0]) * std::max<int64_t>(total_D / T, 1);
      parallel_over(T * B, work, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t t = k / B, b = k % B;
          const int64_t D = d_off[t + 1] - d_off[t];
          acc* o = op + b * total_D + d_off[t];
          for (int64_t i = offs[k]; i < offs[k + 1]; ++i) {
            const int64_t start = w_off[t] + static_cast<int64_t>(ip[i]) * D;
            check_row(start, D, wn, i, ip[i]);
            if (i + kAhead < offs[k + 1]) {
              const int64_t next = w_off[t] + static_cast<int64_t>(ip[i + kAhead]) * D;
              if (next >= 0 && next + D <= wn) prefetch_row(wp + next, D);
            }
            axpy<acc, scalar_t>(o, wp + start, iwp ? iwp[i] : acc(1), D);
          }
          const int64_t L = offs[k + 1] - offs[k];
          if (pooling_mode == kPoolMean && L > 0) {
            const acc inv = acc(1) / static_cast<acc>(L);
            for (int64_t d = 0; d < D; ++d) o[d] *= inv;
          }
        }
      });
    });
  });
  const auto dt = out_dtype(w, output_dtype);
  return dt == acc_t ? out : out.to(dt);
}

at::Tensor nobag(const at::Tensor& weights_in, const at::Tensor& weights_offsets, int64_t D,
                 const at::Tensor& indices_in, const at::Tensor& offsets_in, int64_t output_dtype) {
  auto w = weights_in.contiguous();
  auto indices = indices_in.contiguous();
  const auto w_off = i64(weights_offsets);
  const auto offs = i64(offsets_in);
  const int64_t T = static_cast<int64_t>(w_off.size());
  TORCH_CHECK_VALUE(T > 0, "weights_offsets: need at least one feature");
  const int64_t B = (static_cast<int64_t>(offs.size()) - 1) / T;
  const int64_t N = indices.numel();
  const auto dt = out_dtype(w, output_dtype);
  auto out = at::empty({N, D}, w.options().dtype(dt));
  for (int64_t k = 0; k < T * B; ++k) {
    TORCH_CHECK_VALUE(offs[k] >= 0 && offs[k] <= offs[k + 1] && offs[k + 1] <= N,
                      "offsets: bag ", k, " spans [", offs[k], ", ", offs[k + 1],
                      ") outside the ", N, " indices");
  }
  const int64_t end = T * B > 0 ? offs[T * B] : 0;
  const int64_t wn = w.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, w.scalar_type(), "tbe_nobag", [&] {
    const scalar_t* wp = w.data_ptr<scalar_t>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "tbe_nobag_out", [&] {
      using out_t = scalar_t;
      out_t* op = out.data_ptr<out_t>();
      AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "tbe_nobag_idx", [&] {
        const index_t* ip = indices.data_ptr<index_t>();
        // rows of indices in no bag are zero
        for (int64_t i = std::max<int64_t>(end, 0); i < N; ++i) std::fill(op + i * D, op + (i + 1) * D, out_t(0));
        for (int64_t i = 0; i < std::min(offs[0], N); ++i) std::fill(op + i * D, op + (i + 1) * D, out_t(0));
        parallel_over(T * B, (end - offs[0]) * D, [&](int64_t k0, int64_t k1) {
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t t = k / B;
            for (int64_t i = offs[k]; i < offs[k + 1]; ++i) {
              const int64_t start = w_off[t] + static_cast<int64_t>(ip[i]) * D;
              check_row(start, D, wn, i, ip[i]);
              const auto* row = wp + start;
              out_t* o = op + i * D;
              for (int64_t d = 0; d < D; ++d) o[d] = static_cast<out_t>(row[d]);
            }
          }
        });
      });
    });
  });
  return out;
}

}  // namespace

// split_embedding_codegen_forward_{unweighted,weighted}_pt2_wrapper
at::Tensor tbe_forward(bool weighted, const at::Tensor& host_weights, const at::Tensor& dev_weights,
                       const at::Tensor& /*uvm_weights*/, const at::Tensor& /*lxu_cache_weights*/,
                       const at::Tensor& /*weights_placements*/, const at::Tensor& weights_offsets,
                       const at::Tensor& D_offsets, int64_t total_D, int64_t /*max_D*/,
                       const at::Tensor& /*hash_size_cumsum*/, const at::Tensor& indices,
                       const at::Tensor& offsets, int64_t pooling_mode,
                       const c10::optional<at::Tensor>& indice_weights,
                       const c10::optional<at::Tensor>& /*lxu_cache_locations*/,
                       const c10::optional<at::Tensor>& /*uvm_cache_stats*/, bool /*is_experimental*/,
                       int64_t output_dtype) {
  return pooled(pick(host_weights, dev_weights), weights_offsets, D_offsets, total_D, indices,
                offsets, pooling_mode, weighted ? indice_weights : c10::nullopt, output_dtype);
}

void bind_embedding(pybind11::module& m) {
  m.def("tbe_forward_unweighted",
        [](const at::Tensor& hw, const at::Tensor& dw, const at::Tensor& uw, const at::Tensor& lw,
           const at::Tensor& pl, const at::Tensor& wo, const at::Tensor& Do, int64_t total_D,
           int64_t max_D, const at::Tensor& hsc, const at::Tensor& idx, const at::Tensor& off,
           int64_t pm, const c10::optional<at::Tensor>& iw, const c10::optional<at::Tensor>& lcl,
           const c10::optional<at::Tensor>& ucs, bool exp, int64_t od) {
          return tbe_forward(false, hw, dw, uw, lw, pl, wo, Do, total_D, max_D, hsc, idx, off, pm,
                             iw, lcl, ucs, exp, od);
        });
  m.def("tbe_forward_weighted",
        [](const at::Tensor& hw, const at::Tensor& dw, const at::Tensor& uw, const at::Tensor& lw,
           const at::Tensor& pl, const at::Tensor& wo, const at::Tensor& Do, int64_t total_D,
           int64_t max_D, const at::Tensor& hsc, const at::Tensor& idx, const at::Tensor& off,
           int64_t pm, const c10::optional<at::Tensor>& iw, const c10::optional<at::Tensor>& lcl,
           const c10::optional<at::Tensor>& ucs, bool exp, int64_t od) {
          return tbe_forward(true, hw, dw, uw, lw, pl, wo, Do, total_D, max_D, hsc, idx, off, pm,
                             iw, lcl, ucs, exp, od);
        });
  // split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper
  m.def("tbe_nobag_forward",
        [](const at::Tensor& hw, const at::Tensor& dw, const at::Tensor&, const at::Tensor&,
           const at::Tensor&, const at::Tensor& wo, int64_t D, const at::Tensor&,
           const at::Tensor& idx, const at::Tensor& off, const c10::optional<at::Tensor>&,
           const c10::optional<at::Tensor>&, bool, int64_t od) {
          return nobag(pick(hw, dw), wo, D, idx, off, od);
        });
}

}  // namespace torchrec_ascend
