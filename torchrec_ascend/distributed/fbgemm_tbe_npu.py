"""npu (PrivateUse1) kernels of fbgemm's TBE plumbing: what TorchRec's FUSED kernel needs on npu
besides the lookup ops of :mod:`torchrec_ascend.ops.embedding` (TorchRec integration, not an op of
the registry: it adapts fbgemm's TBE module to those ops).

On ``npu`` TorchRec builds fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` in its CPU mode
(``ComputeDevice.CPU``, ``EmbeddingLocation.HOST``, weights on the npu).  Two fbgemm ops on that
path have no npu kernel of ours through the registry:

* ``fbgemm::get_infos_metadata(Tensor unused, int B, int T) -> (int, int)`` (TBE's constructor):
  host arithmetic, registered here for PrivateUse1.  fbgemm's rule: ``T`` takes
  ``T.bit_length()`` of 32 info bits, B the rest: ``info_B_num_bits = 32 - T.bit_length()``,
  ``info_B_mask = 2**info_B_num_bits - 1``; ``B`` and ``T`` must be positive and
  ``B <= info_B_mask``.
* ``fbgemm::split_embedding_codegen_lookup_<opt>_function_pt2`` (TBE's forward, one op per
  optimizer).  fbgemm registers it at the ``Autograd`` alias key; that kernel runs for
  PrivateUse1 too and refuses non-CPU weights ("currently on device NPU").  We register, for
  ``AutogradPrivateUse1`` and ``PrivateUse1``, a kernel that unpacks fbgemm's packed arguments
  (fbgemm-gpu 1.8.0's lookup invokers: ``weights``/``momentum1`` lists, ``aux_*`` and
  ``optim_*`` lists) and calls ``torchrec_ascend::split_embedding_codegen_lookup_function``:
  forward through the ``*_pt2_wrapper`` forward ops, backward = the fused optimizer update in
  place (the ``*_backward_codegen_<opt>_*_pt2_wrapper`` ops), each served by the registry.
  Optimizers: sgd, adagrad, rowwise_adagrad (what fbgemm's CPU TBE and our backward ops have).

Unsupported (``ValueError`` naming the argument): variable batch size per feature (VBE,
``aux_tensor[0]`` B_offsets), UVM / cache placements, global weight decay,
``feature_requires_grad``.  Nothing is registered when fbgemm_gpu is absent (no TBE calls these).
"""

from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..ops import registry
from ..ops.registry.environment import has_schema

__all__ = ["INFO_NUM_BITS", "LOOKUP_OPTIMIZERS", "REGISTERED", "infos_metadata", "lookup_pt2"]

INFO_NUM_BITS = 32  # fbgemm's DEFAULT_INFO_NUM_BITS: T and B share one 32-bit info word
LOOKUP_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
# fbgemm-gpu 1.8.0 lookup invokers' packing of the aux lists (names in order)
_AUX_TENSOR = ("B_offsets", "vbe_output_offsets_feature_rank", "vbe_B_offsets_rank_per_feature",
               "lxu_cache_locations", "uvm_cache_stats", "prev_iter_dev", "vbe_output_offsets")
_AUX_INT = ("iter", "info_B_num_bits", "info_B_mask")
_AUX_FLOAT = ("gwd_lower_bound", "max_gradient")
_AUX_BOOL = ("is_experimental_tbe", "use_uniq_cache_locations_bwd", "use_homogeneous_placements",
             "apply_global_weight_decay", "gradient_clipping", "stochastic_rounding", "mixed_D")
_OPTIM_INT = {"sgd": (), "adagrad": (), "rowwise_adagrad": ("weight_decay_mode",)}
_OPTIM_FLOAT = {"sgd": (), "adagrad": ("eps",), "rowwise_adagrad": ("eps", "weight_decay", "max_norm")}
_PLACEMENT_DEVICE, _PLACEMENT_HOST = 0, 3  # fbgemm EmbeddingLocation values we can address

REGISTERED: List[str] = []  # qualified names of the fbgemm ops given npu kernels here
_LIB: Optional[torch.library.Library] = None
# placements tensors already validated: {id: (weak reference, tensor version)}.  A TBE module's
# placements are a constant buffer, so after the first lookup no call copies them to the host
# again (on a real npu that copy is a device sync per forward); an in-place change bumps the
# version and is checked again.
_CHECKED_PLACEMENTS: Dict[int, Tuple[weakref.ref, int]] = {}


def infos_metadata(B: int, T: int) -> Tuple[int, int]:
    """``(info_B_num_bits, info_B_mask)`` for batch size ``B`` and ``T`` features (fbgemm's rule)."""
    if int(T) <= 0:
        raise ValueError(f"T: must be positive (number of features), got {T}")
    if int(B) <= 0:
        raise ValueError(f"B: must be positive (batch size), got {B}")
    b_bits = INFO_NUM_BITS - int(T).bit_length()
    mask = (1 << b_bits) - 1
    if int(B) > mask:
        raise ValueError(f"B: {B} does not fit the {b_bits} info bits left by T={T} "
                         f"(max B = {mask})")
    return b_bits, mask


def _get_infos_metadata(unused: torch.Tensor, B: int, T: int) -> Tuple[int, int]:
    return infos_metadata(B, T)


def _unpack_table(what: str, parts: Sequence[Optional[torch.Tensor]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(flat tensor, per-feature offsets) from fbgemm's packed list: CPU mode
    ``[host, placements, offsets]`` or device mode ``[dev, uvm, placements, offsets(, lxu_cache)]``."""
    parts = list(parts)
    if len(parts) == 3:
        host, placements, offsets = parts
        flat, allowed = host, (_PLACEMENT_HOST,)
    elif len(parts) in (4, 5):
        dev, uvm, placements, offsets = parts[:4]
        if uvm is not None and uvm.numel() > 0:
            raise ValueError(f"{what}: UVM-placed tables are not supported on npu (uvm part has "
                             f"{uvm.numel()} elements)")
        flat, allowed = dev, (_PLACEMENT_DEVICE,)
    else:
        raise ValueError(f"{what}: expected fbgemm's packed list of 3 (host) or 4-5 (device) "
                         f"tensors, got {len(parts)}")
    if placements is not None and placements.numel() > 0:
        _check_placements(what, placements, allowed)
    return flat, offsets


def _check_placements(what: str, placements: torch.Tensor, allowed: Tuple[int, ...]) -> None:
    """Every placement is one of ``allowed``; read to the host once per tensor version."""
    hit = _CHECKED_PLACEMENTS.get(id(placements))
    if hit is not None and hit[0]() is placements and hit[1] == placements._version:
        return
    bad = sorted(set(int(p) for p in placements.cpu().tolist()) - set(allowed))
    if bad:
        raise ValueError(f"{what}: placements {bad} are not supported on npu (only {allowed})")
    key = id(placements)
    _CHECKED_PLACEMENTS[key] = (weakref.ref(placements, lambda _: _CHECKED_PLACEMENTS.pop(key, None)),
                                placements._version)


def _named(what: str, values: Sequence, names: Sequence[str]) -> dict:
    if len(values) != len(names):
        raise ValueError(f"{what}: expected {len(names)} entries {list(names)} (fbgemm-gpu 1.8.0's "
                         f"lookup invoker), got {len(values)}")
    return dict(zip(names, values))


def lookup_pt2(optimizer: str, placeholder_autograd_tensor, weights, D_offsets, total_D, max_D,
               hash_size_cumsum, total_hash_size_bits, indices, offsets, pooling_mode,
               indice_weights, feature_requires_grad, output_dtype, aux_tensor, aux_int, aux_float,
               aux_bool, momentum1=None, learning_rate_tensor=None, optim_int=(), optim_float=(),
               max_B=-1, max_B_feature_rank=-1, vbe_output_size=-1, vbe_output=None):
    """fbgemm's ``split_embedding_codegen_lookup_<optimizer>_function_pt2`` on our fused lookup."""
    at = _named("aux_tensor", aux_tensor, _AUX_TENSOR)
    ai = _named("aux_int", aux_int, _AUX_INT)
    af = _named("aux_float", aux_float, _AUX_FLOAT)
    ab = _named("aux_bool", aux_bool, _AUX_BOOL)
    oi = _named("optim_int", optim_int, _OPTIM_INT[optimizer])
    of = _named("optim_float", optim_float, _OPTIM_FLOAT[optimizer])
    if at["B_offsets"] is not None or vbe_output is not None:
        raise ValueError("aux_tensor: B_offsets is set: variable batch size per feature (VBE) is "
                         "not supported on npu")
    if ab["apply_global_weight_decay"]:
        raise ValueError("aux_bool: apply_global_weight_decay=True is not supported on npu")
    if feature_requires_grad is not None:
        raise ValueError("feature_requires_grad: per-feature gradient masks are not supported on npu")
    flat, weights_offsets = _unpack_table("weights", weights)
    states, states_offsets = [], []
    if optimizer != "sgd":
        if momentum1 is None:
            raise ValueError(f"momentum1: optimizer {optimizer!r} needs its state")
        m, mo = _unpack_table("momentum1", momentum1)
        states, states_offsets = [m], [mo]
    return torch.ops.torchrec_ascend.split_embedding_codegen_lookup_function(
        placeholder_autograd_tensor, flat, weights_offsets, D_offsets, total_D, max_D,
        hash_size_cumsum, indices, offsets, pooling_mode, indice_weights, optimizer, states,
        states_offsets, learning_rate_tensor,
        eps=float(of.get("eps", 0.0)), weight_decay=float(of.get("weight_decay", 0.0)),
        weight_decay_mode=int(oi.get("weight_decay_mode", 0)),
        max_norm=float(of.get("max_norm", 0.0)), iter=max(int(ai["iter"]), 1),
        gradient_clipping=bool(ab["gradient_clipping"]), max_gradient=float(af["max_gradient"]),
        output_dtype=int(output_dtype))


def _lookup_kernel(optimizer: str):
    names = [a.name for a in getattr(
        torch.ops.fbgemm, f"split_embedding_codegen_lookup_{optimizer}_function_pt2").default._schema.arguments]

    def kernel(*args, **kwargs):
        a = dict(zip(names, args))
        a.update(kwargs)
        return lookup_pt2(optimizer, **a)

    kernel.__name__ = f"npu_split_embedding_codegen_lookup_{optimizer}_function_pt2"
    return kernel


def _register() -> None:
    global _LIB
    if _LIB is not None or not registry.fbgemm_loaded():
        return
    lib = torch.library.Library("fbgemm", "IMPL")
    q = "fbgemm::get_infos_metadata"
    if has_schema(q) and not torch._C._dispatch_has_kernel_for_dispatch_key(q, "PrivateUse1"):
        lib.impl("get_infos_metadata", _get_infos_metadata, "PrivateUse1")
        REGISTERED.append(q)
    for opt in LOOKUP_OPTIMIZERS:
        name = f"split_embedding_codegen_lookup_{opt}_function_pt2"
        q = f"fbgemm::{name}"
        if not has_schema(q) or torch._C._dispatch_has_kernel_for_dispatch_key(q, "AutogradPrivateUse1"):
            continue
        kernel = _lookup_kernel(opt)
        lib.impl(name, kernel, "AutogradPrivateUse1")
        lib.impl(name, kernel, "PrivateUse1")  # no-grad / inference calls skip the autograd key
        REGISTERED.append(q)
    _LIB = lib


_register()
