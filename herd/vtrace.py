"""Public home of V-trace: `herd.vtrace.from_importance_weights` is the name users know.
The implementation lives in herd/ops/vtrace.py with the other pure tensor ops."""
from herd.ops.vtrace import (  # noqa: F401
    VTraceFromLogitsReturns,
    VTraceReturns,
    from_importance_weights,
    from_logits,
)

__all__ = ["VTraceReturns", "VTraceFromLogitsReturns", "from_importance_weights", "from_logits"]
