"""ops/extension.py: the compiled csrc/ extension loads and exposes its kernels."""

import pytest
import torch

from torchrec_ascend.ops import extension


def test_extension_loaded_after_make_build():
    # `make test` builds csrc/ first, so in the suite the extension must be there
    assert extension.available(), "torchrec_ascend._C did not load: run `make build`"
    assert extension.extension().__name__ == "torchrec_ascend._C"


def test_kernel_lookup():
    assert callable(extension.kernel("jagged_to_padded_dense_forward"))
    assert extension.kernel("no_such_kernel") is None


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_complete_cumsum_kernel_matches_torch(dtype):
    k = extension.kernel("asynchronous_complete_cumsum_rows")  # the 1-D/2-D kernel the spec uses
    for n in (0, 1, 1000):
        x = torch.randint(0, 50, (n,), dtype=dtype)
        want = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(x.long(), 0)]).to(dtype)
        got = k(x)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
