// Python module torchrec_ascend._C: binds the kernels of every csrc/<area>.cpp.
#include "direct.h"
#include "isa.h"
#include "torchrec_ascend.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torchrec_ascend C++ CPU kernels (OpenMP)";
  torchrec_ascend::bind_jagged(m);
  torchrec_ascend::bind_sparse(m);
  torchrec_ascend::bind_embedding(m);
  torchrec_ascend::bind_hstu(m);
  torchrec_ascend::bind_load_balance(m);
  torchrec_ascend::bind_rows(m);
  // tests: cap the vector ISA the kernels pick (2 AVX-512, 1 AVX2, 0 scalar); returns the old cap
  m.def("_set_isa_cap", &torchrec_ascend::set_isa_cap);
  // tests: the LLC size in bytes the kernels plan for (-1: the OS's); returns the old override
  m.def("_set_llc_bytes", &torchrec_ascend::set_llc_bytes);
  // after every bind_<area>: they fill the table of direct dispatcher kernels that this binds
  torchrec_ascend::direct::bind(m);
}
