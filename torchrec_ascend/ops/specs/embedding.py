"""Registration table of the table-batched embedding (TBE) ops: fbgemm's schemas, the reference
adapters, fake kernels, autograd formulas and specs (TorchRec's FUSED and DENSE compute kernels).

TorchRec's FUSED kernel drives fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen``, whose
``forward`` calls one autograd op per optimizer, ``fbgemm::split_embedding_codegen_lookup_<opt>
_function_pt2``; on CPU that op's C++ autograd function dispatches the ``*_pt2_wrapper`` ops
registered here under their fbgemm names and schemas (forward; backward fused with the optimizer
update, in place on weights and states; gradient of per-sample weights).  The DATA_PARALLEL
kernel calls ``fbgemm::dense_embedding_codegen_lookup_function``.  Adam has no CPU kernel in
fbgemm: its ops are ``torchrec_ascend::`` only.  Names: ``<op>_reference`` / ``<op>_fake`` /
``<op>_setup_context`` / ``<op>_backward``; ``tbe_*`` serve a whole family of generated variants.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ..measured import FAR_PREFETCH
from ..reference import embedding as ref
from ..registry import OpSpec, register

__all__ = ["SPECS", "register_all", "backward_op_name", "OPTIMIZERS", "POOLING_MODES",
           "N_STATES"]

_ops = torch.ops.torchrec_ascend
POOLING_MODES = {"sum": ref.SUM, "mean": ref.MEAN, "none": ref.NONE}
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
N_STATES = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 1, "adam": 2}
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


def tbe_forward_reference(weighted: bool, nobag: bool):
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


def tbe_forward_fake(nobag: bool):
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


def split_embedding_codegen_grad_indice_weights_reference(grad_output, host_weights, dev_weights, uvm_weights, lxu_cache_weights, weights_placements,
                  weights_offsets, D_offsets, max_D, indices, offsets, lxu_cache_locations, feature_requires_grad):
    # fbgemm's contract: no pooling mode here, so SUM semantics (see docs/embedding_ops.md)
    w = ref.pick(host_weights, dev_weights)
    frg = feature_requires_grad if _defined(feature_requires_grad) else None
    return ref.grad_indice_weights(grad_output, w, weights_offsets, D_offsets, max_D, indices, offsets, frg)


def split_embedding_codegen_grad_indice_weights_fake(grad_output, *args):
    indices = args[8]
    return grad_output.new_empty((indices.shape[0],), dtype=torch.float32 if grad_output.dtype != torch.float64
                                 else torch.float64)


def _untracked(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage under a fresh version counter: the fused update writes the weights and
    states in place without bumping the counter autograd checks, as fbgemm's kernels do (they
    write through raw pointers).  fbgemm's lookup autograd saves the weights, and TorchRec runs
    two forwards before their two backwards (``test_optimizer_load_state_dict``): a bumped
    counter would fail the second backward."""
    return t.data


def _state(a: Dict[str, object], k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _untracked(ref.pick(a[f"momentum{k}_host"], a[f"momentum{k}_dev"])), a[f"momentum{k}_offsets"]


def tbe_backward_reference(optimizer: str, weighted: bool, nobag: bool):
    names = _arg_names(_backward_schema(optimizer, nobag))

    def impl(*args):
        a = dict(zip(names, args))
        w = _untracked(ref.pick(a["host_weights"], a["dev_weights"]))
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


def tbe_backward_fake(grad_output, *args, **kwargs):
    return grad_output.new_empty(0)


# --------------------------------------------------------------------------- dense lookup

_DENSE_SCHEMA = ("(Tensor dev_weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, "
                 "Tensor hash_size_cumsum, int total_hash_size_bits, Tensor indices, Tensor offsets, "
                 "int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, int output_dtype=0, "
                 "Tensor? B_offsets=None, Tensor? vbe_output_offsets_feature_rank=None, "
                 "Tensor? vbe_B_offsets_rank_per_feature=None, SymInt max_B=-1, SymInt max_B_feature_rank=-1, "
                 "SymInt vbe_output_size=-1, bool mixed_D=True) -> Tensor")


def dense_embedding_codegen_lookup_function_reference(dev_weights, weights_offsets, D_offsets, total_D, max_D, hash_size_cumsum, total_hash_size_bits,
                indices, offsets, pooling_mode, indice_weights, feature_requires_grad, output_dtype=0,
                B_offsets=None, vbe_output_offsets_feature_rank=None, vbe_B_offsets_rank_per_feature=None,
                max_B=-1, max_B_feature_rank=-1, vbe_output_size=-1, mixed_D=True):
    if B_offsets is not None:
        raise ValueError("B_offsets: variable batch size per feature (VBE) is not supported")
    return ref.dense_lookup(dev_weights, weights_offsets, D_offsets, total_D, max_D, indices, offsets,
                            pooling_mode, indice_weights, feature_requires_grad, output_dtype)


def dense_embedding_codegen_lookup_function_fake(dev_weights, weights_offsets, D_offsets, total_D, max_D, hash_size_cumsum, total_hash_size_bits,
                indices, offsets, pooling_mode, *rest):
    output_dtype = rest[2] if len(rest) > 2 else 0
    dtype = ref.output_dtype_of(dev_weights, output_dtype)
    if int(pooling_mode) == ref.NONE:
        return dev_weights.new_empty((indices.shape[0], max_D), dtype=dtype)
    T = D_offsets.shape[0] - 1
    return dev_weights.new_empty(((offsets.shape[0] - 1) // T, total_D), dtype=dtype)


def dense_embedding_codegen_lookup_function_setup_context(ctx, inputs, output):
    (dev_weights, weights_offsets, D_offsets, total_D, max_D, _, _, indices, offsets, pooling_mode,
     indice_weights, feature_requires_grad) = inputs[:12]
    # the weights are read only for the indice-weight gradient: saved only then (an optimizer
    # step between forward and backward, as in TorchRec's semi-sync pipeline, stays valid)
    ctx.need_w = indice_weights is not None and indice_weights.requires_grad
    ctx.save_for_backward(dev_weights if ctx.need_w else None, weights_offsets, D_offsets, indices, offsets,
                          indice_weights, feature_requires_grad)
    ctx.w_meta = (dev_weights.shape, dev_weights.dtype, dev_weights.device)
    ctx.max_D, ctx.pooling_mode, ctx.n_inputs = max_D, pooling_mode, len(inputs)


def dense_embedding_codegen_lookup_function_backward(ctx, grad):
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


def dense_embedding_codegen_lookup_backward_reference(grad_output, dev_weights, weights_offsets, D_offsets, max_D, indices, offsets, pooling_mode,
                    indice_weights, feature_requires_grad, want_indice_weights_grad=True):
    gw, giw = ref.dense_lookup_backward(grad_output, dev_weights, weights_offsets, D_offsets, max_D, indices,
                                        offsets, pooling_mode, indice_weights, feature_requires_grad)
    if giw is None or not want_indice_weights_grad:
        giw = (indice_weights if indice_weights is not None else grad_output).new_empty(0)
    return gw, giw


def dense_embedding_codegen_lookup_backward_fake(grad_output, dev_weights, weights_offsets, D_offsets, max_D, indices, offsets, pooling_mode,
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


def split_embedding_codegen_lookup_function_reference(placeholder_autograd_tensor, weights, weights_offsets, D_offsets, total_D, max_D,
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


def split_embedding_codegen_lookup_function_fake(placeholder_autograd_tensor, weights, weights_offsets, D_offsets, total_D, max_D,
                 hash_size_cumsum, indices, offsets, pooling_mode, indice_weights, optimizer, *rest):
    dtype = ref.output_dtype_of(weights, rest[-1] if len(rest) == 13 else 0)
    if int(pooling_mode) == ref.NONE:
        return weights.new_empty((indices.shape[0], max_D), dtype=dtype)
    T = D_offsets.shape[0] - 1
    return weights.new_empty(((offsets.shape[0] - 1) // T, total_D), dtype=dtype)


_LOOKUP_NAMES = _arg_names(_LOOKUP_SCHEMA)


def split_embedding_codegen_lookup_function_setup_context(ctx, inputs, output):
    # the dispatcher drops trailing defaulted arguments: fill them from the schema
    schema = _ops.split_embedding_codegen_lookup_function.default._schema
    a = {arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()}
    a.update(zip(_LOOKUP_NAMES, inputs))
    ctx.a = a
    ctx.n_inputs = len(inputs)


def split_embedding_codegen_lookup_function_backward(ctx, grad):
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


# --------------------------------------------------------------------------- the table


def specs() -> List[OpSpec]:
    """Every TBE op's spec, in registration order (variants generated per optimizer / pooling)."""
    out: List[OpSpec] = []
    for weighted, kind in _VARIANTS:
        nobag = kind == "nobag"
        w = "weighted" if weighted == "weighted" else "unweighted"
        out.append(OpSpec(
            name=f"split_embedding{'_nobag' if nobag else ''}_codegen_forward_{w}_pt2_wrapper",
            schema=_NOBAG_FWD_SCHEMA if nobag else _FWD_SCHEMA,
            reference=tbe_forward_reference(w == "weighted", nobag),
            cpu_kernel="tbe_nobag_forward" if nobag else f"tbe_forward_{w}",
            fake=tbe_forward_fake(nobag),
            fbgemm=True,
            detail=None if nobag else FAR_PREFETCH,
        ))
    out.append(OpSpec(
        name="split_embedding_codegen_grad_indice_weights_pt2_wrapper",
        schema=_GRAD_IW_SCHEMA,
        reference=split_embedding_codegen_grad_indice_weights_reference,
        cpu_kernel="tbe_grad_indice_weights",
        fake=split_embedding_codegen_grad_indice_weights_fake,
        fbgemm=True,
    ))
    for opt in OPTIMIZERS:
        for weighted, kind in _VARIANTS:
            nobag = kind == "nobag"
            out.append(OpSpec(
                name=backward_op_name(opt, weighted == "weighted", nobag),
                schema=_backward_schema(opt, nobag),
                reference=tbe_backward_reference(opt, weighted == "weighted", nobag),
                cpu_kernel=f"tbe_backward_{opt}_{'nobag' if nobag else weighted}",
                fake=tbe_backward_fake,
                fbgemm=opt != "adam",
            ))
    out.append(OpSpec(
        name="dense_embedding_codegen_lookup_function",
        schema=_DENSE_SCHEMA,
        reference=dense_embedding_codegen_lookup_function_reference,
        cpu_kernel="dense_lookup",
        detail=FAR_PREFETCH,
        fake=dense_embedding_codegen_lookup_function_fake,
        backward=dense_embedding_codegen_lookup_function_backward,
        setup_context=dense_embedding_codegen_lookup_function_setup_context,
        fbgemm=True,
        fbgemm_ascend=True,
    ))
    out.append(OpSpec(
        name="dense_embedding_codegen_lookup_backward",
        schema=_DENSE_BWD_SCHEMA,
        reference=dense_embedding_codegen_lookup_backward_reference,
        cpu_kernel="dense_lookup_backward",
        fake=dense_embedding_codegen_lookup_backward_fake,
    ))
    out.append(OpSpec(
        name="split_embedding_codegen_lookup_function",
        schema=_LOOKUP_SCHEMA,
        reference=split_embedding_codegen_lookup_function_reference,
        fake=split_embedding_codegen_lookup_function_fake,
        backward=split_embedding_codegen_lookup_function_backward,
        setup_context=split_embedding_codegen_lookup_function_setup_context,
    ))
    return out


SPECS: List[OpSpec] = specs()


def register_all() -> None:
    """Register every spec of :data:`SPECS` (once: importing :mod:`torchrec_ascend.ops`)."""
    for s in SPECS:
        register(s)
