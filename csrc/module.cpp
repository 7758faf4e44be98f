// Python module torchrec_ascend._C: binds the kernels of every csrc/<area>.cpp.
#include "direct.h"
#include "torchrec_ascend.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torchrec_ascend C++ CPU kernels (OpenMP)";
  torchrec_ascend::bind_jagged(m);
  torchrec_ascend::bind_sparse(m);
  torchrec_ascend::bind_embedding(m);
  torchrec_ascend::bind_hstu(m);
  torchrec_ascend::bind_load_balance(m);
  // after every bind_<area>: they fill the table of direct dispatcher kernels that this binds
  torchrec_ascend::direct::bind(m);
}
