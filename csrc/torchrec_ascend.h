// Shared declarations of the torchrec_ascend C++ CPU extension.
// Each csrc/<area>.cpp defines `void bind_<area>(pybind11::module&)`; module.cpp calls them all.
#pragma once
#include <torch/extension.h>

namespace torchrec_ascend {
void bind_jagged(pybind11::module& m);
void bind_sparse(pybind11::module& m);
void bind_embedding(pybind11::module& m);
void bind_hstu(pybind11::module& m);
void bind_load_balance(pybind11::module& m);
void bind_rows(pybind11::module& m);
}  // namespace torchrec_ascend
