"""Table-batched embedding (TBE) lookup ops: TorchRec's FUSED and DENSE compute kernels.

TorchRec's FUSED kernel drives fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen``, whose
``forward`` calls one autograd op per optimizer, ``fbgemm::split_embedding_codegen_lookup_<opt>
_function_pt2``; on CPU that op's C++ autograd function dispatches the ``*_pt2_wrapper`` ops
below (forward; backward fused with the optimizer update, in place on weights and states;
gradient of per-sample weights).  We register those under their fbgemm names and schemas, so
``use_backend("reference", replace_fbgemm=True)`` runs TorchRec's training step on our kernels
with fbgemm's autograd plumbing unchanged.  The DATA_PARALLEL kernel calls
``fbgemm::dense_embedding_codegen_lookup_function`` (ours returns one row per index for
sequence tables, where fbgemm-gpu-cpu 1.8.0 returns pooled rows).  Adam has no CPU kernel in
fbgemm (TBE refuses it on CPU): ours are ``torchrec_ascend::`` only.  docs/embedding_ops.md has
the traced call path and the exact formulas.

Public API (validate, then dispatch through ``torch.ops.torchrec_ascend``):
:func:`split_embedding_forward` (no autograd), :func:`split_embedding_lookup` (forward + fused
optimizer in backward), :func:`dense_embedding_lookup` (differentiable).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import _checks
from .reference import embedding as ref
from .registry import OpSpec, register

__all__ = [
    "OPTIMIZERS",
    "POOLING_MODES",
    "split_embedding_forward",
    "split_embedding_lookup",
    "dense_embedding_lookup",
]

_ops = torch.ops.torchrec_ascend
POOLING_MODES = {"sum": ref.SUM, "mean": ref.MEAN, "none": ref.NONE}
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
_N_STATES = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 1, "adam": 2}
_PLACEMENT_DEVICE, _PLACEMENT_HOST = 0, 3  # fbgemm PlacementType values we can address

# --------------------------------------------------------------------------- schemas (fbgemm's)

_WEIGHTS_IN = ("Tensor host_weights, Tensor dev_weights, Tensor uvm_weights, Tensor lxu_cache_weights, "
               "Tensor weights_placements, Tensor weights_offsets")
_FWD_SCHEMA = (f"({_WEIGHTS_IN}, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor hash_size_cumsum, "
               "Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, "
               "Tensor lxu_cache_locations, Tensor(f!) uvm_cache_stats, bool is_experimental, "
               "int output_dtype) -> Tensor")
_NOBAG_FWD_SCHEMA = (f"({_WEIGHTS_IN}, SymInt D, Tensor hash_size_cumsum, Tensor indices, Tensor offsets, "
                     "Tensor lxu_cache_locations, Tensor(f!) uvm_cache_stats, bool is_experimental, "
                     "int output_dtype) -> Tensor")
_GRAD_IW_SCHEMA = (f"(Tensor grad_output, {_WEIGHTS_IN}, Tensor D_offsets, SymInt max_D, Tensor indices, "
                   "Tensor offsets, Tensor lxu_cache_locations, Tensor feature_requires_grad) -> Tensor")
_WEIGHTS_MUT = ("Tensor grad_output, Tensor(a!) host_weights, Tensor(b!) dev_weights, Tensor(c!) uvm_weights, "
                "Tensor(d!) lxu_cache_weights, Tensor weights_placements, Tensor weights_offsets")
_BWD_TAIL = ("Tensor lxu_cache_locations, int BT_block_size, int max_segment_length_per_warp, "
             "bool stochastic_rounding, int info_B_num_bits, int info_B_mask_int64, "
             "bool use_uniq_cache_locations, bool use_homogeneous_placements")
_BWD_HEAD = {
    "pooled": (f"{_WEIGHTS_MUT}, Tensor D_offsets, SymInt max_D, bool mixed_D, Tensor hash_size_cumsum, "
               f"int total_hash_size_bits, Tensor indices, Tensor offsets, int pooling_mode, "
               f"Tensor indice_weights, {_BWD_TAIL}"),
    "nobag": (f"{_WEIGHTS_MUT}, SymInt D, Tensor hash_size_cumsum, int total_hash_size_bits, "
              f"Tensor indices, Tensor offsets, {_BWD_TAIL}"),
}


def _momentum(k: int, letters: str) -> str:
    a, b, c = letters
    return (f"Tensor({a}!) momentum{k}_host, Tensor({b}!) momentum{k}_dev, Tensor({c}!) momentum{k}_uvm, "
            f"Tensor momentum{k}_placements, Tensor momentum{k}_offsets")


_OPT_ARGS = {
    "sgd": "Tensor learning_rate_tensor",
    "adagrad": f"{_momentum(1, 'ghi')}, Tensor learning_rate_tensor, float eps=0.",
    "rowwise_adagrad": (f"{_momentum(1, 'ghi')}, Tensor learning_rate_tensor, float eps=0., "
                        "float weight_decay=0., int weight_decay_mode=0, float max_norm=0."),
    # not in fbgemm-gpu-cpu (no CPU Adam); modelled on the others
    "adam": (f"{_momentum(1, 'ghi')}, {_momentum(2, 'jkl')}, Tensor learning_rate_tensor, float eps=0., "
             "float beta1=0., float beta2=0., float weight_decay=0., int iter=0"),
}

_VARIANTS = (("unweighted", "pooled"), ("weighted", "pooled"), ("unweighted", "nobag"))


def backward_op_name(optimizer: str, weighted: bool, nobag: bool) -> str:
    """fbgemm's name of the fused backward op (``*_pt2_wrapper``)."""
    return (f"split_embedding{'_nobag' if nobag else ''}_backward_codegen_{optimizer}_"
            f"{'weighted' if weighted else 'unweighted'}_pt2_wrapper")


def _backward_schema(optimizer: str, nobag: bool) -> str:
    tail = "" if nobag else ", int output_dtype=0"
    return f"({_BWD_HEAD['nobag' if nobag else 'pooled']}, {_OPT_ARGS[optimizer]}{tail}) -> Tensor"


def _arg_names(schema: str) -> List[str]:
    inner = schema[schema.index("(") + 1: schema.rindex(")")]
    return [a.strip().split("=")[0].split(" ")[-1] for a in inner.split(",")]


def _defined(t: Optional[torch.Tensor]) -> bool:
    return t is not None and t.numel() > 0


# --------------------------------------------------------------------------- kernels (reference)


def _forward_impl(weighted: bool, nobag: bool):
    names = _arg_names(_NOBAG_FWD_SCHEMA if nobag else _FWD_SCHEMA)

    def impl(*args):
        a = dict(zip(names, args))
        w = ref.pick(a["host_weights"], a["dev_weights"])
        if nobag:
            return ref.nobag_forward(w, a["weights_offsets"], a["D"], a["indices"], a["offsets"], a["output_dtype"])
        iw = a["indice_weights"] if weighted and _defined(a["indice_weights"]) else None
        return ref.pooled_forward(w, a["weights_offsets"], a["D_offsets"], a["total_D"], a["max_D"], a["indices"],
                                  a["offsets"], a["pooling_mode"], iw, a["output_dtype"])

    impl.__name__ = f"reference_forward_{'nobag' if nobag else 'weighted' if weighted else 'unweighted'}"
    return impl


def _forward_fake(nobag: bool):
    names = _arg_names(_NOBAG_FWD_SCHEMA if nobag else _FWD_SCHEMA)

    def fake(*args):
        a = dict(zip(names, args))
        w = a["host_weights"] if a["host_weights"] is not None and a["host_weights"].numel() else a["dev_weights"]
        dtype = ref.output_dtype_of(w, a["output_dtype"])
        if nobag:
            return w.new_empty((a["indices"].shape[0], a["D"]), dtype=dtype)
        T = a["D_offsets"].shape[0] - 1
        return w.new_empty(((a["offsets"].shape[0] - 1) // T, a["total_D"]), dtype=dtype)

    return fake


def _grad_iw_impl(grad_output, host_weights, dev_weights, uvm_weights, lxu_cache_weights, weights_placements,
                  weights_offsets, D_offsets, max_D, indices, offsets, lxu_cache_locations, feature_requires_grad):
    # fbgemm's contract: no pooling mode here, so SUM semantics (see docs/embedding_ops.md)
    w = ref.pick(host_weights, dev_weights)
    frg = feature_requires_grad if _defined(feature_requires_grad) else None
    return ref.grad_indice_weights(grad_output, w, weights_offsets, D_offsets, max_D, indices, offsets, frg)


def _grad_iw_fake(grad_output, *args):
    indices = args[8]
    return grad_output.new_empty((indices.shape[0],), dtype=torch.float32 if grad_output.dtype != torch.float64
                                 else torch.float64)


def _state(a: Dict[str, object], k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return ref.pick(a[f"momentum{k}_host"], a[f"momentum{k}_dev"]), a[f"momentum{k}_offsets"]


def _backward_impl(optimizer: str, weighted: bool, nobag: bool):
    names = _arg_names(_backward_schema(optimizer, nobag))

    def impl(*args):
        a = dict(zip(names, args))
        w = ref.pick(a["host_weights"], a["dev_weights"])
        iw = a["indice_weights"] if weighted and _defined(a["indice_weights"]) else None
        rg = ref.row_grads(a["grad_output"], a["weights_offsets"], None if nobag else a["D_offsets"],
                           a.get("D"), a.get("max_D", a.get("D")), a["indices"], a["offsets"],
                           a.get("pooling_mode", ref.NONE), iw)
        lr = a["learning_rate_tensor"]
        if optimizer == "sgd":
            ref.apply_sgd(w, rg, lr)
        elif optimizer == "adagrad":
            ref.apply_adagrad(w, *_state(a, 1), rg, lr, a["eps"])
        elif optimizer == "rowwise_adagrad":
            ref.apply_rowwise_adagrad(w, *_state(a, 1), rg, lr, a["eps"], a["weight_decay"],
                                      a["weight_decay_mode"], a["max_norm"])
        else:
            ref.apply_adam(w, *_state(a, 1), *_state(a, 2), rg, lr, a["eps"], a["beta1"], a["beta2"],
                           a["weight_decay"], a["iter"])
        return w.new_empty(0)

    impl.__name__ = "reference_" + backward_op_name(optimizer, weighted, nobag)
    return impl


def _backward_fake(grad_output, *args, **kwargs):
    return grad_output.new_empty(0)


# --------------------------------------------------------------------------- dense lookup

_DENSE_SCHEMA = ("(Tensor dev_weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, "
                 "Tensor hash_size_cumsum, int total_hash_size_bits, Tensor indices, Tensor offsets, "
                 "int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, int output_dtype=0, "
                 "Tensor? B_offsets=None, Tensor? vbe_output_offsets_feature_rank=None, "
                 "Tensor? vbe_B_offsets_rank_per_feature=None, SymInt max_B=-1, SymInt max_B_feature_rank=-1, "
                 "SymInt vbe_output_size=-1, bool mixed_D=True) -> Tensor")


def _dense_impl(dev_weights, weights_offsets, D_offsets, total_D, max_D, hash_size_cumsum, total_hash_size_bits,
                indices, offsets, pooling_mode, indice_weights, feature_requires_grad, output_dtype=0,
                B_offsets=None, vbe_output_offsets_feature_rank=None, vbe_B_offsets_rank_per_feature=None,
                max_B=-1, max_B_feature_rank=-1, vbe_output_size=-1, mixed_D=True):
    if B_offsets is not None:
        raise ValueError("B_offsets: variable batch size per feature (VBE) is not supported")
    return ref.dense_lookup(dev_weights, weights_offsets, D_offsets, total_D, max_D, indices, offsets,
                            pooling_mode, indice_weights, feature_requires_grad, output_dtype)


def _dense_fake(dev_weights, weights_offsets, D_offsets, total_D, max_D, hash_size_cumsum, total_hash_size_bits,
                indices, offsets, pooling_mode, *rest):
    output_dtype = rest[2] if len(rest) > 2 else 0
    dtype = ref.output_dtype_of(dev_weights, output_dtype)
    if int(pooling_mode) == ref.NONE:
        return dev_weights.new_empty((indices.shape[0], max_D), dtype=dtype)
    T = D_offsets.shape[0] - 1
    return dev_weights.new_empty(((offsets.shape[0] - 1) // T, total_D), dtype=dtype)


def _dense_setup(ctx, inputs, output):
    (dev_weights, weights_offsets, D_offsets, total_D, max_D, _, _, indices, offsets, pooling_mode,
     indice_weights, feature_requires_grad) = inputs[:12]
    # the weights are read only for the indice-weight gradient: saved only then (an optimizer
    # step between forward and backward, as in TorchRec's semi-sync pipeline, stays valid)
    ctx.need_w = indice_weights is not None and indice_weights.requires_grad
    ctx.save_for_backward(dev_weights if ctx.need_w else None, weights_offsets, D_offsets, indices, offsets,
                          indice_weights, feature_requires_grad)
    ctx.w_meta = (dev_weights.shape, dev_weights.dtype, dev_weights.device)
    ctx.max_D, ctx.pooling_mode, ctx.n_inputs = max_D, pooling_mode, len(inputs)


def _dense_backward(ctx, grad):
    dev_weights, wo, Do, indices, offsets, iw, frg = ctx.saved_tensors
    if dev_weights is None:  # a zero-strided stand-in of the right shape: never read
        shape, dtype, device = ctx.w_meta
        dev_weights = torch.zeros((), dtype=dtype, device=device).expand(shape)
    gw, giw = _ops.dense_embedding_codegen_lookup_backward(grad.contiguous(), dev_weights, wo, Do, ctx.max_D,
                                                            indices, offsets, ctx.pooling_mode, iw, frg,
                                                            ctx.need_w)
    out = [None] * ctx.n_inputs
    out[0] = gw
    out[10] = giw if ctx.need_w and int(ctx.pooling_mode) != ref.NONE else None
    return tuple(out)


# the dense lookup's backward as an op of its own (torchrec_ascend:: only), so that the autograd
# formula above runs on the registry's backend: (grad of dev_weights, grad of indice_weights, or
# an empty tensor when there are none / the lookup is a sequence one / not wanted).  The values of
# dev_weights are read only for the indice-weight gradient.
_DENSE_BWD_SCHEMA = ("(Tensor grad_output, Tensor dev_weights, Tensor weights_offsets, Tensor D_offsets, "
                     "SymInt max_D, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, "
                     "Tensor? feature_requires_grad, bool want_indice_weights_grad=True) -> (Tensor, Tensor)")


def _dense_bwd_impl(grad_output, dev_weights, weights_offsets, D_offsets, max_D, indices, offsets, pooling_mode,
                    indice_weights, feature_requires_grad, want_indice_weights_grad=True):
    gw, giw = ref.dense_lookup_backward(grad_output, dev_weights, weights_offsets, D_offsets, max_D, indices,
                                        offsets, pooling_mode, indice_weights, feature_requires_grad)
    if giw is None or not want_indice_weights_grad:
        giw = (indice_weights if indice_weights is not None else grad_output).new_empty(0)
    return gw, giw


def _dense_bwd_fake(grad_output, dev_weights, weights_offsets, D_offsets, max_D, indices, offsets, pooling_mode,
                    indice_weights, feature_requires_grad, want_indice_weights_grad=True):
    if (want_indice_weights_grad and indice_weights is not None and indice_weights.numel() > 0
            and int(pooling_mode) != ref.NONE):
        giw = indice_weights.new_empty(indices.shape[0])
    else:
        giw = (indice_weights if indice_weights is not None else grad_output).new_empty(0)
    return torch.empty_like(dev_weights, memory_format=torch.contiguous_format), giw


# --------------------------------------------------------------------------- fused lookup (ours)

_LOOKUP_SCHEMA = ("(Tensor placeholder_autograd_tensor, Tensor weights, Tensor weights_offsets, Tensor D_offsets, "
                  "SymInt total_D, SymInt max_D, Tensor hash_size_cumsum, Tensor indices, Tensor offsets, "
                  "int pooling_mode, Tensor? indice_weights, str optimizer, Tensor[] states, "
                  "Tensor[] states_offsets, Tensor learning_rate_tensor, float eps=0., float beta1=0.9, "
                  "float beta2=0.999, float weight_decay=0., int weight_decay_mode=0, float max_norm=0., "
                  "int iter=1, bool gradient_clipping=False, float max_gradient=1., int output_dtype=0) -> Tensor")


def _lookup_forward(placeholder_autograd_tensor, weights, weights_offsets, D_offsets, total_D, max_D,
                    hash_size_cumsum, indices, offsets, pooling_mode, indice_weights, optimizer, states,
                    states_offsets, learning_rate_tensor, eps=0.0, beta1=0.9, beta2=0.999, weight_decay=0.0,
                    weight_decay_mode=0, max_norm=0.0, iter=1, gradient_clipping=False, max_gradient=1.0,
                    output_dtype=0):
    e = weights.new_empty(0)
    p = torch.full((weights_offsets.shape[0],), _PLACEMENT_HOST, dtype=torch.int32, device=weights.device)
    ei = torch.empty(0, dtype=torch.int32, device=weights.device)
    if int(pooling_mode) == ref.NONE:
        return _ops.split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper(
            weights, e, e, e, p, weights_offsets, max_D, hash_size_cumsum, indices, offsets, ei, ei, False,
            output_dtype)
    weighted = indice_weights is not None
    op = (_ops.split_embedding_codegen_forward_weighted_pt2_wrapper if weighted
          else _ops.split_embedding_codegen_forward_unweighted_pt2_wrapper)
    return op(weights, e, e, e, p, weights_offsets, D_offsets, total_D, max_D, hash_size_cumsum, indices, offsets,
              pooling_mode, indice_weights, ei, ei, False, output_dtype)


def _lookup_fake(placeholder_autograd_tensor, weights, weights_offsets, D_offsets, total_D, max_D,
                 hash_size_cumsum, indices, offsets, pooling_mode, indice_weights, optimizer, *rest):
    dtype = ref.output_dtype_of(weights, rest[-1] if len(rest) == 13 else 0)
    if int(pooling_mode) == ref.NONE:
        return weights.new_empty((indices.shape[0], max_D), dtype=dtype)
    T = D_offsets.shape[0] - 1
    return weights.new_empty(((offsets.shape[0] - 1) // T, total_D), dtype=dtype)


_LOOKUP_NAMES = _arg_names(_LOOKUP_SCHEMA)


def _lookup_setup(ctx, inputs, output):
    # the dispatcher drops trailing defaulted arguments: fill them from the schema
    schema = _ops.split_embedding_codegen_lookup_function.default._schema
    a = {arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()}
    a.update(zip(_LOOKUP_NAMES, inputs))
    ctx.a = a
    ctx.n_inputs = len(inputs)


def _lookup_backward(ctx, grad):
    """Fused: update weights and optimizer states in place; no gradient flows to ``weights``."""
    a = ctx.a
    nobag = int(a["pooling_mode"]) == ref.NONE
    if a["gradient_clipping"]:
        grad = torch.clamp(grad, -a["max_gradient"], a["max_gradient"])
    grad = grad.contiguous()
    w = a["weights"]
    e = w.new_empty(0)
    ei = torch.empty(0, dtype=torch.int32, device=w.device)
    p = torch.full((a["weights_offsets"].shape[0],), _PLACEMENT_HOST, dtype=torch.int32, device=w.device)
    iw = a["indice_weights"]
    out: list = [None] * ctx.n_inputs
    for k in ("states", "states_offsets"):  # Tensor[] inputs take a list of (no) gradients
        out[_LOOKUP_NAMES.index(k)] = [None] * len(a[k])
    if iw is not None and iw.requires_grad and not nobag:
        out[_LOOKUP_NAMES.index("indice_weights")] = ref.grad_indice_weights(
            grad, w, a["weights_offsets"], a["D_offsets"], a["max_D"], a["indices"], a["offsets"], None,
            a["pooling_mode"]).to(iw.dtype)
    opt = a["optimizer"]
    head: list = [grad, w, e, e, e, p, a["weights_offsets"]]
    if nobag:
        head += [a["max_D"], a["hash_size_cumsum"], 0, a["indices"], a["offsets"]]
    else:
        head += [a["D_offsets"], a["max_D"], True, a["hash_size_cumsum"], 0, a["indices"], a["offsets"],
                 a["pooling_mode"], iw.detach() if iw is not None else None]  # undefined, as fbgemm passes
    head += [ei, 0, 0, False, 0, 0, False, True]
    states = []
    for s, so in zip(a["states"], a["states_offsets"]):
        states += [s, e, e, p, so]
    lr = a["learning_rate_tensor"]
    hyper = {
        "sgd": [lr],
        "adagrad": [lr, a["eps"]],
        "rowwise_adagrad": [lr, a["eps"], a["weight_decay"], a["weight_decay_mode"], a["max_norm"]],
        "adam": [lr, a["eps"], a["beta1"], a["beta2"], a["weight_decay"], a["iter"]],
    }[opt]
    tail = [] if nobag else [a["output_dtype"]]
    op = getattr(_ops, backward_op_name(opt, iw is not None and not nobag, nobag))
    op(*head, *states, *hyper, *tail)
    return tuple(out)


# --------------------------------------------------------------------------- registration

def _register_all() -> None:
    for weighted, kind in _VARIANTS:
        nobag = kind == "nobag"
        w = "weighted" if weighted == "weighted" else "unweighted"
        register(OpSpec(
            name=f"split_embedding{'_nobag' if nobag else ''}_codegen_forward_{w}_pt2_wrapper",
            schema=_NOBAG_FWD_SCHEMA if nobag else _FWD_SCHEMA,
            reference=_forward_impl(w == "weighted", nobag),
            cpu_kernel="tbe_nobag_forward" if nobag else f"tbe_forward_{w}",
            fake=_forward_fake(nobag),
            fbgemm=True,
        ))
    register(OpSpec(
        name="split_embedding_codegen_grad_indice_weights_pt2_wrapper",
        schema=_GRAD_IW_SCHEMA,
        reference=_grad_iw_impl,
        cpu_kernel="tbe_grad_indice_weights",
        fake=_grad_iw_fake,
        fbgemm=True,
    ))
    for opt in OPTIMIZERS:
        for weighted, kind in _VARIANTS:
            nobag = kind == "nobag"
            register(OpSpec(
                name=backward_op_name(opt, weighted == "weighted", nobag),
                schema=_backward_schema(opt, nobag),
                reference=_backward_impl(opt, weighted == "weighted", nobag),
                cpu_kernel=f"tbe_backward_{opt}_{'nobag' if nobag else weighted}",
                fake=_backward_fake,
                fbgemm=opt != "adam",
            ))
    register(OpSpec(
        name="dense_embedding_codegen_lookup_function",
        schema=_DENSE_SCHEMA,
        reference=_dense_impl,
        cpu_kernel="dense_lookup",
        fake=_dense_fake,
        backward=_dense_backward,
        setup_context=_dense_setup,
        fbgemm=True,
        fbgemm_ascend=True,
    ))
    register(OpSpec(
        name="dense_embedding_codegen_lookup_backward",
        schema=_DENSE_BWD_SCHEMA,
        reference=_dense_bwd_impl,
        cpu_kernel="dense_lookup_backward",
        fake=_dense_bwd_fake,
    ))
    register(OpSpec(
        name="split_embedding_codegen_lookup_function",
        schema=_LOOKUP_SCHEMA,
        reference=_lookup_forward,
        fake=_lookup_fake,
        backward=_lookup_backward,
        setup_context=_lookup_setup,
    ))


_register_all()


# --------------------------------------------------------------------------- validation


def _pooling(pooling_mode: Union[str, int]) -> int:
    if isinstance(pooling_mode, str):
        if pooling_mode.lower() not in POOLING_MODES:
            raise ValueError(f"pooling_mode: {pooling_mode!r} is not one of {sorted(POOLING_MODES)}")
        return POOLING_MODES[pooling_mode.lower()]
    if int(pooling_mode) not in POOLING_MODES.values():
        raise ValueError(f"pooling_mode: {pooling_mode} is not 0 (sum), 1 (mean) or 2 (none)")
    return int(pooling_mode)


def _check_tbe(weights, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, pooling_mode,
               per_sample_weights, validate: bool) -> Tuple[int, int, int]:
    """Checks shared by every entry point; returns (total_D, max_D, B)."""
    _checks.check_tensor("weights", weights, dim=1, dtypes=_checks.FLOAT_DTYPES)
    _checks.check_tensor("weights_offsets", weights_offsets, dim=1, dtypes=(torch.int64,))
    _checks.check_tensor("D_offsets", D_offsets, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_tensor("hash_size_cumsum", hash_size_cumsum, dim=1, dtypes=(torch.int64,))
    _checks.check_tensor("indices", indices, dim=1, dtypes=_checks.INDEX_DTYPES)
    if per_sample_weights is not None:
        _checks.check_tensor("per_sample_weights", per_sample_weights, dim=1, dtypes=_checks.FLOAT_DTYPES)
        if per_sample_weights.numel() != indices.numel():
            raise ValueError(f"per_sample_weights: has {per_sample_weights.numel()} entries, "
                             f"indices has {indices.numel()}; need one weight per index")
    _checks.check_same_device(weights=weights, weights_offsets=weights_offsets, D_offsets=D_offsets,
                              hash_size_cumsum=hash_size_cumsum, indices=indices, offsets=offsets,
                              per_sample_weights=per_sample_weights)
    T = weights_offsets.numel()
    if T == 0:
        raise ValueError("weights_offsets: need at least one feature (T >= 1)")
    if D_offsets.numel() != T + 1:
        raise ValueError(f"D_offsets: expected T + 1 = {T + 1} entries (T from weights_offsets), "
                         f"got {D_offsets.numel()}")
    if hash_size_cumsum.numel() != T + 1:
        raise ValueError(f"hash_size_cumsum: expected T + 1 = {T + 1} entries, got {hash_size_cumsum.numel()}")
    _checks.check_offsets("offsets", offsets, indices.numel(), validate)
    if (offsets.numel() - 1) % T != 0:
        raise ValueError(f"offsets: has {offsets.numel()} entries; must be T * B + 1 with T = {T}")
    B = (offsets.numel() - 1) // T
    dims = (D_offsets[1:] - D_offsets[:-1]).tolist()
    if int(D_offsets[0]) != 0 or min(dims) <= 0:
        raise ValueError(f"D_offsets: must start at 0 and increase strictly (every dim > 0), got "
                         f"{D_offsets.tolist()}")
    if pooling_mode == ref.NONE and len(set(dims)) != 1:
        raise ValueError(f"D_offsets: pooling_mode none (sequence) needs one dim for all features, got {dims}")
    if validate and indices.numel() > 0:
        _check_indices(weights, weights_offsets, dims, hash_size_cumsum, indices, offsets, B)
    return int(D_offsets[-1]), max(dims), B


def _check_indices(weights, weights_offsets, dims, hash_size_cumsum, indices, offsets, B) -> None:
    """Every index lies in its feature's table, and the table lies inside ``weights``."""
    T = len(dims)
    hs = hash_size_cumsum.tolist()
    # a feature's table size: the next non-zero step of hash_size_cumsum (shared tables repeat it)
    sizes = []
    for t in range(T):
        nxt = next((hs[u + 1] for u in range(t, T) if hs[u + 1] != hs[t]), hs[t])
        sizes.append(nxt - hs[t])
    wo = weights_offsets.tolist()
    for t in range(T):
        if wo[t] < 0 or wo[t] + sizes[t] * dims[t] > weights.numel():
            raise ValueError(f"weights_offsets: feature {t}'s table [{wo[t]}, {wo[t] + sizes[t] * dims[t]}) "
                             f"does not fit in weights of {weights.numel()} elements")
    offs = offsets.to(torch.int64)
    n_used = int(offs[-1])
    feat = torch.searchsorted(offs[B:T * B + 1:B].contiguous() if B > 0 else offs[-1:], 
                              torch.arange(n_used, device=indices.device), right=True)
    size = torch.tensor(sizes, dtype=torch.int64, device=indices.device)[torch.clamp(feat, max=T - 1)]
    idx = indices[:n_used].to(torch.int64)
    bad = (idx < 0) | (idx >= size)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"indices: indices[{i}]={int(idx[i])} is out of range [0, {int(size[i])}) "
                         f"for feature {int(feat[i])}")


def _default_hash_size_cumsum(weights: torch.Tensor, weights_offsets: torch.Tensor, D_offsets: torch.Tensor):
    """Rows per feature from the weights layout (tables in feature order, none shared)."""
    dims = (D_offsets[1:] - D_offsets[:-1]).to(torch.int64)
    ends = torch.cat([weights_offsets[1:], weights_offsets.new_tensor([weights.numel()])])
    rows = torch.div(ends - weights_offsets, dims, rounding_mode="floor")
    return torch.cat([rows.new_zeros(1), torch.cumsum(rows, 0)])


def _prepare(weights, weights_offsets, D_offsets, indices, offsets, pooling_mode, per_sample_weights,
             hash_size_cumsum, validate):
    pm = _pooling(pooling_mode)
    if hash_size_cumsum is None:
        _checks.check_tensor("weights", weights, dim=1, dtypes=_checks.FLOAT_DTYPES)
        _checks.check_tensor("weights_offsets", weights_offsets, dim=1, dtypes=(torch.int64,))
        _checks.check_tensor("D_offsets", D_offsets, dim=1, dtypes=_checks.INDEX_DTYPES)
        hash_size_cumsum = _default_hash_size_cumsum(weights, weights_offsets, D_offsets)
    total_D, max_D, _ = _check_tbe(weights, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, pm,
                                   per_sample_weights, validate)
    return pm, hash_size_cumsum, total_D, max_D


# --------------------------------------------------------------------------- public API


def split_embedding_forward(weights: torch.Tensor, weights_offsets: torch.Tensor, D_offsets: torch.Tensor,
                            indices: torch.Tensor, offsets: torch.Tensor, **options) -> torch.Tensor:
    """Table-batched lookup, no autograd: pooled ``[B, total_D]`` (``"sum"``/``"mean"``, with
    optional per-sample weights) or sequence ``[N, D]`` (``"none"``).

    Args:
        weights: flat weights of all tables; feature ``t``'s row ``i`` starts at
            ``weights_offsets[t] + i * D_t``.
        weights_offsets: ``[T]`` int64.  D_offsets: ``[T + 1]`` cumulative dims.
        indices: row ids local to each feature's table; offsets: ``[T * B + 1]`` bag bounds.
        options: the keyword arguments of :func:`dense_embedding_lookup` -- ``pooling_mode``,
            ``per_sample_weights``, ``hash_size_cumsum`` (``[T + 1]`` cumulative table sizes,
            default: from the weights layout), ``output_dtype`` (fbgemm SparseType int: 0 fp32,
            1 fp16, 5 bf16), ``validate`` (check values: offsets monotone, indices in range;
            costs a device sync).
    """
    with torch.no_grad():
        return dense_embedding_lookup(weights, weights_offsets, D_offsets, indices, offsets, **options)


def split_embedding_lookup(
    weights: torch.Tensor,
    weights_offsets: torch.Tensor,
    D_offsets: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    optimizer: str,
    learning_rate: Union[float, torch.Tensor],
    states: Sequence[torch.Tensor] = (),
    states_offsets: Sequence[torch.Tensor] = (),
    pooling_mode: Union[str, int] = "sum",
    per_sample_weights: Optional[torch.Tensor] = None,
    hash_size_cumsum: Optional[torch.Tensor] = None,
    eps: float = 0.0,
    beta1: float = 0.9,
    beta2: float = 0.999,
    weight_decay: float = 0.0,
    weight_decay_mode: int = 0,
    max_norm: float = 0.0,
    iter: int = 1,
    gradient_clipping: bool = False,
    max_gradient: float = 1.0,
    output_dtype: int = 0,
    validate: bool = True,
) -> torch.Tensor:
    """Lookup whose backward applies ``optimizer`` to ``weights`` and ``states`` in place (fbgemm's
    FUSED training): the output requires grad; calling ``backward`` updates the tables.

    ``optimizer``: ``"sgd"`` (no state), ``"adagrad"`` (state: ``[like weights]``),
    ``"rowwise_adagrad"`` (state: one float per row), ``"adam"`` (two states like weights;
    ``iter`` is the 1-based step for bias correction).  ``states_offsets[k][t]``: where feature
    ``t``'s slice of state ``k`` starts.  Other arguments as :func:`split_embedding_forward`.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: {optimizer!r} is not one of {OPTIMIZERS}")
    pm, hsc, total_D, max_D = _prepare(weights, weights_offsets, D_offsets, indices, offsets, pooling_mode,
                                       per_sample_weights, hash_size_cumsum, validate)
    states, states_offsets = list(states), list(states_offsets)
    n = _N_STATES[optimizer]
    if len(states) != n or len(states_offsets) != n:
        raise ValueError(f"states: optimizer {optimizer!r} needs {n} state tensor(s) and as many offsets, got "
                         f"{len(states)} and {len(states_offsets)}")
    for k, (s, so) in enumerate(zip(states, states_offsets)):
        _checks.check_tensor(f"states[{k}]", s, dim=1, dtypes=_checks.FLOAT_DTYPES)
        _checks.check_tensor(f"states_offsets[{k}]", so, dim=1, dtypes=(torch.int64,))
        _checks.check_same_device(weights=weights, **{f"states[{k}]": s, f"states_offsets[{k}]": so})
        if so.numel() != weights_offsets.numel():
            raise ValueError(f"states_offsets[{k}]: expected {weights_offsets.numel()} entries (one per feature)")
    if weight_decay_mode not in (0, 1, 2, 5):
        raise ValueError(f"weight_decay_mode: {weight_decay_mode} is not 0 (none), 1 (L2), 2 or 5 (decoupled)")
    if optimizer == "adam" and int(iter) < 1:
        raise ValueError(f"iter: Adam's step must be >= 1 (bias correction), got {iter}")
    lr = learning_rate if isinstance(learning_rate, torch.Tensor) else torch.tensor(
        float(learning_rate), dtype=torch.float32, device=weights.device)
    placeholder = torch.zeros(0, device=weights.device, requires_grad=True)
    return _ops.split_embedding_codegen_lookup_function(
        placeholder, weights, weights_offsets, D_offsets, total_D, max_D, hsc, indices, offsets, pm,
        per_sample_weights, optimizer, states, states_offsets, lr, eps, beta1, beta2, weight_decay,
        weight_decay_mode, max_norm, iter, gradient_clipping, max_gradient, output_dtype)


def dense_embedding_lookup(
    weights: torch.Tensor,
    weights_offsets: torch.Tensor,
    D_offsets: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    pooling_mode: Union[str, int] = "sum",
    per_sample_weights: Optional[torch.Tensor] = None,
    hash_size_cumsum: Optional[torch.Tensor] = None,
    output_dtype: int = 0,
    validate: bool = True,
) -> torch.Tensor:
    """Data-parallel lookup, differentiable w.r.t. ``weights`` and ``per_sample_weights``:
    pooled ``[B, total_D]``, or for ``pooling_mode="none"`` one row per index ``[N, D]``.
    Arguments as :func:`split_embedding_forward`."""
    pm, hsc, total_D, max_D = _prepare(weights, weights_offsets, D_offsets, indices, offsets, pooling_mode,
                                       per_sample_weights, hash_size_cumsum, validate)
    return _ops.dense_embedding_codegen_lookup_function(
        weights, weights_offsets, D_offsets, total_D, max_D, hsc, 0, indices, offsets, pm, per_sample_weights,
        None, output_dtype)
