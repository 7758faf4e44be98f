"""Forced-backend run (issue #3): TorchRec on our kernels in place of fbgemm's CPU kernels.

``registry.use_backend(b, replace_fbgemm=True)`` overrides fbgemm's CPU kernel of every op of
our registry, so TorchRec's own ``torch.ops.fbgemm.*`` calls run our implementation.  Here:

* TorchRec's KeyedJaggedTensor / JaggedTensor / KeyedTensor operations (and the row-wise
  bucketizer of its input dist) give what they give on fbgemm's kernels (single process);
* a DistributedModelParallel training (gloo, EmbeddingBagCollection + EmbeddingCollection +
  dense, TrainPipelineSparseDist, 4 steps) under table_wise, row_wise, column_wise and
  data_parallel (world 2) and table_row_wise (world 4, LOCAL_WORLD_SIZE=2) gives the same
  losses and tables as on fbgemm's kernels.  One launch per world size trains each sharding
  three times in the same processes: fbgemm, forced ``reference``, forced ``cpu_kernel``.

Each forced run proves it ran on our kernels: :func:`forced_backend.kernel_log` records every
call reaching a registry kernel with the backend that served it and every fbgemm op dispatched;
every dispatched fbgemm op that our registry replaces must have been served by us with the
forced backend (where it has one).

Tolerance: 1e-6 absolute + 1e-5 relative on losses and weights (fp32; ours sum in another
order).  Measured: losses equal, weights within 7.5e-9 of fbgemm's (tables moved by up to 1e-3).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec_ascend.ops import registry  # noqa: E402
from torchrec_ascend.testing import forced_backend as FB  # noqa: E402

BACKENDS = ("reference", "cpu_kernel")
ATOL, RTOL = 1e-6, 1e-5
# fbgemm ops the training path dispatches that are not in our registry: no tensor math of the
# model (a feature-gate query; TBE's constructor's batch/table bit split).
OUTSIDE_REGISTRY = {"fbgemm::check_feature_gate_key", "fbgemm::get_infos_metadata"}


def _check_ours(log_ours, dispatched, backend, where):
    """Every dispatched fbgemm op we replace was served by us, by ``backend`` where it can."""
    replaceable = FB.replaceable_ops()
    names = {d.split("::", 1)[1] for d in dispatched}
    missed = sorted((names & replaceable) - set(log_ours))
    assert not missed, f"{where}: fbgemm's kernel served {missed} under the forced backend"
    assert log_ours, f"{where}: none of our kernels ran"
    for op, backends in log_ours.items():
        want = {b for b, _ in registry.available_backends(op, "cpu")} & {backend}
        want = want or {"reference"}
        assert set(backends) <= want | {"reference"} and set(backends) & want, (where, op, backends)


# --------------------------------------------------------------------------- single process


def _kjt(gen, weighted: bool, keys=("a", "b", "c", "d"), batch: int = 5, max_len: int = 4):
    from torchrec import KeyedJaggedTensor

    lengths = torch.randint(0, max_len + 1, (len(keys) * batch,), generator=gen)
    lengths[0], lengths[1], lengths[-1] = 0, 1, max_len  # 0, 1 and the max
    n = int(lengths.sum())
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys), values=torch.randint(0, 100, (n,), generator=gen), lengths=lengths,
        weights=torch.randn(n, generator=gen) if weighted else None)


def _torchrec_ops(seed: int) -> dict:
    """Results (and gradients) of TorchRec's own jagged/keyed operations on fresh inputs."""
    from torchrec import JaggedTensor, KeyedJaggedTensor, KeyedTensor
    from torchrec.distributed.embedding_sharding import bucketize_kjt_before_all2all
    from torchrec.sparse import jagged_tensor as jt_mod

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for weighted in (False, True):
        kjt = _kjt(gen, weighted)
        tag = "w" if weighted else "u"
        p = kjt.permute([3, 1, 0, 2, 1])
        out[f"{tag}.permute"] = (p.values(), p.lengths(), p.weights_or_none(), p.offsets())
        for i, part in enumerate(kjt.split([1, 0, 2, 1])):
            out[f"{tag}.split{i}"] = (part.values(), part.lengths(), part.weights_or_none(),
                                      part.offsets())
        for k, jt in kjt.to_dict().items():
            out[f"{tag}.dict.{k}"] = (jt.values(), jt.lengths(), jt.weights_or_none(), jt.offsets())
        out[f"{tag}.offsets"] = (kjt.offsets(), torch.tensor(kjt.offset_per_key()))
        cat = KeyedJaggedTensor.concat([kjt, _kjt(gen, weighted, keys=("e", "f"))])
        out[f"{tag}.concat"] = (cat.values(), cat.offsets(), torch.tensor(cat.length_per_key()))
        # row-wise input dist: bucketize ids into 3 uneven blocks, positions and permute kept
        bucketed, perm = bucketize_kjt_before_all2all(
            kjt, num_buckets=3, block_sizes=torch.tensor([40, 34, 50, 30]), output_permute=True,
            bucketize_pos=True)
        out[f"{tag}.bucketize"] = (bucketed.values(), bucketed.lengths(), bucketed.weights_or_none(),
                                   perm)
        # variable-batch KJT (stride per key per rank): to_dict, permute by segments
        strides = [[2], [3], [1], [4]]
        vlen = torch.randint(0, 4, (10,), generator=gen)
        vlen[0] = 0
        vbe = KeyedJaggedTensor(keys=["a", "b", "c", "d"], values=torch.arange(int(vlen.sum())),
                                lengths=vlen, stride_per_key_per_rank=strides,
                                weights=torch.randn(int(vlen.sum()), generator=gen) if weighted else None)
        out[f"{tag}.vbe.lpk"] = (torch.tensor(vbe.length_per_key()),)
        for k, jt in vbe.to_dict().items():
            out[f"{tag}.vbe.dict.{k}"] = (jt.values(), jt.lengths(), jt.weights_or_none())
        seg = torch.tensor(vbe.length_per_key(), dtype=torch.int32)
        pv, pw = jt_mod._permute_tensor_by_segments(
            vbe.values(), seg, torch.tensor([2, 0, 3, 1], dtype=torch.int32), vbe.weights_or_none())
        out[f"{tag}.vbe.by_segments"] = (pv, pw)

    # JaggedTensor -> padded dense (values and weights), forward and backward
    lengths = torch.randint(0, 6, (7,), generator=gen)
    lengths[0], lengths[1], lengths[2] = 0, 1, 5
    n = int(lengths.sum())
    values = torch.randn(n, generator=gen, requires_grad=True)
    w = torch.randn(n, generator=gen)
    jt = JaggedTensor(values=values, lengths=lengths, weights=w)
    dense = jt.to_padded_dense(desired_length=4, padding_value=-3.0)
    up = torch.randn(dense.shape, generator=gen)
    (g,) = torch.autograd.grad((dense * up).sum(), values)
    out["jt.padded"] = (dense.detach(), g, jt.to_padded_dense_weights(padding_value=0.5))
    out["jt.dense"] = tuple(t.detach() for t in jt.to_dense())

    # KeyedTensor: regroup (fbgemm fast path and the slow path), regroup_as_dict, to_dict,
    # with gradients through the regroup
    dims = [[3, 2], [4, 1, 2]]
    kts, leaves = [], []
    for i, ds in enumerate(dims):
        vals = torch.randn(5, sum(ds), generator=gen, requires_grad=True)
        leaves.append(vals)
        kts.append(KeyedTensor(keys=[f"k{i}{j}" for j in range(len(ds))], length_per_key=ds,
                               values=vals))
    groups = [["k11", "k00"], ["k01", "k12", "k10"]]
    fast = KeyedTensor.regroup(kts, groups)
    slow = KeyedTensor.regroup(kts, [["k11", "k00"], ["k01", "k00"]])  # k00 twice: slow path
    loss = sum((t * torch.randn(t.shape, generator=gen)).sum() for t in fast + slow)
    grads = torch.autograd.grad(loss, leaves)
    out["kt.regroup"] = tuple(t.detach() for t in fast + slow) + grads
    as_dict = KeyedTensor.regroup_as_dict(kts, groups, ["x", "y"])
    out["kt.regroup_as_dict"] = tuple(as_dict[k].detach() for k in ("x", "y"))
    out["kt.to_dict"] = tuple(v.detach() for v in kts[1].to_dict().values())
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert len(got[key]) == len(want[key]), key
        for a, b in zip(got[key], want[key]):
            if b is None:
                assert a is None, key
            elif b.is_floating_point():
                torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL, msg=key)
            else:
                assert torch.equal(a, b), key


@pytest.mark.parametrize("backend", BACKENDS)
def test_torchrec_jagged_and_keyed_ops_on_our_kernels(backend):
    for seed in (0, 1):
        with FB.kernel_log() as fb_log:
            want = _torchrec_ops(seed)
        assert not fb_log.ours, "fbgemm's run must not reach our kernels"
        with FB.forced(backend), FB.kernel_log() as log:
            got = _torchrec_ops(seed)
        _assert_same(got, want)
        ours = log.served()
        _check_ours({k: sorted(v) for k, v in ours.items()}, log.dispatched, backend, backend)
        # the operations exercised the ops they are meant to
        for op in ("permute_2D_sparse_data", "asynchronous_complete_cumsum",
                   "block_bucketize_sparse_features", "permute_1D_sparse_data", "segment_sum_csr",
                   "jagged_to_padded_dense_forward", "jagged_to_padded_dense_backward",
                   "permute_pooled_embs"):  # fbgemm's autograd kernel of the regroup calls it
            assert op in ours, f"{op} did not run on our kernels"


def test_kernel_log_can_fail():
    """The check above fails when fbgemm's kernel serves a replaceable op."""
    with FB.kernel_log() as log:
        torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 0, 2]))
    with pytest.raises(AssertionError, match="fbgemm's kernel served"):
        _check_ours({"invert_permute": ["reference"]}, log.dispatched, "reference", "probe")


TBE_FORWARDS = ("split_embedding_codegen_forward_unweighted_pt2_wrapper",
                "split_embedding_codegen_forward_weighted_pt2_wrapper",
                "split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper")


def test_cpu_kernel_tbe_forward_callable_from_fbgemm_autograd():
    """fbgemm's own TBE module (TorchRec's FUSED kernel) on our csrc forward kernel: fbgemm's
    autograd passes None for the weight placements a table does not use."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)], learning_rate=0.1)
    indices, offsets = torch.tensor([1, 2, 9]), torch.tensor([0, 1, 1, 3])  # bags of 1, 0, 2
    want = tbe(indices, offsets)
    with registry.use_backend("cpu_kernel", ops=list(TBE_FORWARDS), replace_fbgemm=True), \
            FB.kernel_log() as log:
        got = tbe(indices, offsets)
    assert log.served() == {TBE_FORWARDS[0]: {"cpu_kernel"}}, log.ours
    torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------- multi-process


def _compare(per_rank, shardings):
    from torchrec_ascend.testing import torchrec_workload as W

    init = W.initial_state()
    for sharding in shardings:
        fb = W.assemble([r[sharding]["fbgemm"]["result"] for r in per_rank])
        moved = max(float((fb[k] - init[k]).abs().max()) for k in fb)
        assert moved > 1e-4, f"{sharding}: training did not move the tables"
        for r in per_rank:
            assert not r[sharding]["fbgemm"]["ours"] or sharding in W.FBGEMM_CPU_BROKEN, \
                f"{sharding}: fbgemm's run reached our kernels"
        for backend in BACKENDS:
            runs = [r[sharding][backend] for r in per_rank]
            for rank, run in enumerate(runs):
                where = f"{sharding}/{backend}/rank{rank}"
                _check_ours(run["ours"], run["dispatched"], backend, where)
                assert set(run["dispatched"]) - {f"fbgemm::{o}" for o in run["ours"]} <= \
                    OUTSIDE_REGISTRY, where
                want = per_rank[rank][sharding]["fbgemm"]["result"]
                assert run["result"]["sharding_types"] == want["sharding_types"]
                torch.testing.assert_close(torch.tensor(run["result"]["losses"]),
                                           torch.tensor(want["losses"]), atol=ATOL, rtol=RTOL,
                                           msg=where)
            got = W.assemble([run["result"] for run in runs])
            for k in fb:
                assert not torch.isnan(fb[k]).any(), k
                torch.testing.assert_close(got[k], fb[k], atol=ATOL, rtol=RTOL,
                                           msg=f"{sharding}/{backend}/{k}")


@pytest.mark.slow
def test_dmp_training_world2_same_on_our_kernels():
    from torchrec_ascend.testing.multiprocess import run_multiprocess

    shardings = ("table_wise", "row_wise", "column_wise", "data_parallel")
    per_rank = run_multiprocess(FB.compare_worker, 2, (shardings, BACKENDS, 4))
    _compare(per_rank, shardings)


@pytest.mark.slow
def test_dmp_training_table_row_wise_world4_same_on_our_kernels():
    from torchrec_ascend.testing.multiprocess import run_multiprocess

    per_rank = run_multiprocess(FB.compare_worker, 4, (("table_row_wise",), BACKENDS, 4),
                                local_world_size=2)
    _compare(per_rank, ("table_row_wise",))
