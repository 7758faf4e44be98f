// Argument checks of the row kernels' entry points (hstu_layer.cpp, rows.cpp): one rule, one
// message each -- "<name>: expected a <dim>-D <dtype> CPU tensor[ [<rows>]], got <dtype> <sizes>
// on <device>", "<name>: shape <sizes> must equal <other>'s <sizes>" -- raised as ValueError in
// Python.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

namespace torchrec_ascend {

inline const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    case at::kBool: return "bool";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    default: return c10::toString(t);
  }
}

// `t` on the CPU with `dim` dimensions, one of `dtypes`, and (rows >= 0) `rows` entries along
// its first dimension; else ValueError naming `name` and the rule
inline void check_cpu_tensor(const char* name, const at::Tensor& t, int64_t dim,
                             std::initializer_list<at::ScalarType> dtypes, int64_t rows = -1) {
  bool dtype_ok = false;
  for (at::ScalarType d : dtypes) dtype_ok = dtype_ok || t.scalar_type() == d;
  const bool ok = t.device().is_cpu() && t.dim() == dim && dtype_ok && (rows < 0 || t.size(0) == rows);
  if (ok) return;
  std::ostringstream want;
  const char* sep = "";
  for (at::ScalarType d : dtypes) {
    want << sep << dtype_name(d);
    sep = " or ";
  }
  TORCH_CHECK_VALUE(false, name, ": expected a ", dim, "-D ", want.str(), " CPU tensor",
                    rows >= 0 ? " [" + std::to_string(rows) + (dim > 1 ? ", ...]" : "]") : std::string(),
                    ", got ", dtype_name(t.scalar_type()), " ", t.sizes(), " on ", t.device());
}

// `t` of `other`'s shape; else ValueError "<name>: shape <t's> must equal <other_name>'s <other's>"
inline void check_same_shape(const char* name, const at::Tensor& t, const char* other_name, const at::Tensor& other) {
  TORCH_CHECK_VALUE(t.sizes() == other.sizes(), name, ": shape ", t.sizes(), " must equal ", other_name, "'s ",
                    other.sizes());
}

// check_cpu_tensor, then `t` contiguous
inline at::Tensor contiguous_cpu_tensor(const char* name, const at::Tensor& t, int64_t dim,
                                        std::initializer_list<at::ScalarType> dtypes, int64_t rows = -1) {
  check_cpu_tensor(name, t, dim, dtypes, rows);
  return t.contiguous();
}

}  // namespace torchrec_ascend
