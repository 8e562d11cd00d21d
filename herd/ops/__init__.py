"""Pure tensor ops (no modules, no config): V-trace and categorical-distribution helpers."""
from herd.ops.distributions import action_log_probs, entropy, kl_divergence  # noqa: F401
from herd.ops.vtrace import (  # noqa: F401
    VTraceFromLogitsReturns,
    VTraceReturns,
    from_importance_weights,
    from_logits,
)
