"""draw_timeline writes a PNG with one lane per stage."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrec")
pytest.importorskip("matplotlib")

from torchrec_ascend.distributed.train_pipeline.stages import Span  # noqa: E402
from torchrec_ascend.distributed.train_pipeline.timeline import draw_timeline  # noqa: E402


def test_draws_a_png_of_the_chosen_steps(tmp_path):
    spans = [Span("dense_fwd", s, s * 1.0, s + 0.4) for s in range(4)]
    spans += [Span("lookup", s, s + 0.4, s + 0.6) for s in range(4)]
    out = draw_timeline(spans, str(tmp_path / "pipeline.png"), steps=[1, 2], title="t")
    data = (tmp_path / "pipeline.png").read_bytes()
    assert out.endswith("pipeline.png") and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    with pytest.raises(ValueError, match="none to draw"):
        draw_timeline(spans, str(tmp_path / "x.png"), steps=[9])
