"""What an inference server computes for a batch of rows, on any device, and its options."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from herd.models.core import CoreInput, state_from_rows, state_to_rows


@dataclass(frozen=True)
class ServerOptions:
    """How a server batches and computes (the --inference_* options, herd/config.py)."""
    batch_wait_us: float = 0.0      # after a first request, wait up to this long for a fuller batch
    min_clients: int = 0            # ... until this many clients ask (0: all of the server's clients)
    weights_interval: int = 1       # pull published weights once they are this many versions newer
    bf16: bool = False              # autocast the forward pass to bfloat16
    channels_last: bool = False     # CUDA: convolutions in NHWC
    cuda_graphs: bool = False       # CUDA: replay graphs captured for padded batch sizes
    graphs_measured: bool = False   # ... kept only for the sizes where replay measured faster than eager


def sample_actions(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """logits [N, A], uniforms [N] in [0, 1) -> actions [N] int64 drawn from softmax(logits).

    Inverse CDF: the first action whose cumulative probability exceeds u * total. Actions of
    probability zero are never drawn (their CDF step is empty). No host read and fixed
    shapes, so it can run inside a captured CUDA graph."""
    cdf = torch.softmax(logits.float(), dim=-1).cumsum(dim=-1)               # [N, A]
    target = (uniforms * cdf[:, -1]).unsqueeze(1)                            # [N, 1]
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=logits.shape[1] - 1)


def policy_outputs(model: torch.nn.Module, inputs: dict, recurrent: bool, features: bool) -> dict:
    """inputs: obs [N, *obs_shape], uniforms [N] (core_state [N, 2, L, H] when recurrent) ->
    actions [N], logits [N, A], value [N] float32 (features [N, F] if asked; core_state
    [N, 2, L, H], the states after the step, when recurrent). Call under inference_mode."""
    if recurrent:                                                                 # over [1, N, ...]
        start = CoreInput(state_from_rows(inputs["core_state"]), None)            # [2, L, N, H]
        out, state = model.unroll(inputs["obs"].unsqueeze(0), start)
    else:
        out = model(inputs["obs"].unsqueeze(0))
    logits = out.logits[0].float()
    results = {"actions": sample_actions(logits, inputs["uniforms"]), "logits": logits,
               "value": out.value[0].float()}
    if features:
        results["features"] = out.features[0].float()
    if recurrent:
        results["core_state"] = state_to_rows(state).float()                      # [N, 2, L, H]
    return results
