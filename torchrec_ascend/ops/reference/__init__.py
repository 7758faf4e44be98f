"""Torch-composite implementations of every op: device-agnostic, vectorised (gather, scatter,
cumsum, bmm -- what NPUs run well), no Python loop over the batch.  They are both the backend of
last resort and the oracle the faster backends are tested against."""
