"""benchmarks/train.py: which contenders a run times, given the GEMM peaks it measured."""

import torch

from benchmarks.train import runnable_contenders

CONTENDERS = [("hstu", "fp32"), ("hstu", "bf16"), ("sasrec", "fp32")]


def test_bf16_skipped_where_emulated():
    keep, skipped = runnable_contenders(CONTENDERS, {torch.float32: 40.0, torch.bfloat16: 1.1})
    assert keep == [("hstu", "fp32"), ("sasrec", "fp32")]
    assert list(skipped) == ["hstu/bf16"]
    assert "1.10 GFLOP/s" in skipped["hstu/bf16"] and "40.0" in skipped["hstu/bf16"]


def test_bf16_kept_where_native_or_close():
    for bf16 in (75.0, 10.0):  # faster than fp32; slower, but within 4x
        keep, skipped = runnable_contenders(CONTENDERS, {torch.float32: 40.0, torch.bfloat16: bf16})
        assert keep == CONTENDERS and skipped == {}


def test_run_config_times_every_contender_end_to_end(monkeypatch):
    """benchmarks/train.py's whole path (trainers, alternating rounds, the step breakdown) on a
    tiny config: one row per contender with its parts summing to the step."""
    import benchmarks.train as bench
    from torchrec_ascend.training.process_group import init_distributed

    tiny = {"model": {"embedding_dim": 16, "num_layers": 1, "num_heads": 2, "attention_dim": 8,
                      "linear_dim": 8, "max_seq_len": 24, "dropout": 0.1,
                      "normalization": "max_len", "use_time_bias": True, "use_actions": True,
                      "sasrec_ffn_dim": 32},
            "train": dict(bench._TRAIN, batch_size=4, num_negatives=32),
            "num_items": 300, "num_users": 60,
            "contenders": [("hstu", "fp32"), ("sasrec", "fp32")],
            "protocol": {True: (1, 2, 2)}}
    monkeypatch.setitem(bench.CONFIGS, "tiny", tiny)
    monkeypatch.setattr(bench, "PEAK_N", 128)
    rows, info = bench.run_config("tiny", init_distributed("cpu"), quick=True)
    assert [(r["model"], r["dtype"]) for r in rows] == [("hstu", "float32"), ("sasrec", "float32")]
    for r in rows:
        assert r["steps"] == 4 and r["tokens"] > 0 and 0 < r["mfu"] < 1
        assert r["warmup_tokens_per_s"] > 0  # the one warm-up step's rate, kept apart
        parts = r["breakdown_ms"]
        assert parts["step"] > 0 and parts["sampled_softmax"] > 0
        assert abs(sum(v for k, v in parts.items() if k != "step") - parts["step"]) < 1e-6
    assert rows[0]["breakdown_ms"]["attention"] > 0 and rows[1]["breakdown_ms"]["attention"] == 0
    assert info["protocol"]["rounds"] == 2
