"""Training losses."""
from herd.losses.impala import ImpalaLossWeights, VTraceTargets, impala_loss, vtrace_targets  # noqa: F401
