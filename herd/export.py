"""`herd export RUN`: a run's policy for use without herd.

Writes into RUN/export/ (or --out):
  policy.pt               TorchScript: forward(observation [N, *obs_shape]) ->
                          (action [N] int64 or [N, A] float32 in [-1, 1], policy parameters
                          [N, A] logits (Ape-X: Q values) or [N, 2A] mean and log-std, value [N]).
                          The action is the greedy one: the most probable (Ape-X: the largest
                          Q value; continuous: the Gaussian's mean).
  weights.safetensors     the network's weights (torch's state_dict names), readable without pickle.
  preprocessing.json      what turns the environment's observations into the network's input
                          (herd.api.Policy.preprocessing: the env id and its kind, herd's
                          preprocessing options, shapes and dtypes), the outputs, and for
                          continuous actions the Box bounds [-1, 1] maps onto.
Runs with an LSTM core (--use_lstm) are refused in one line: their state is not exported yet.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from herd.errors import UserError

FILES = ("policy.pt", "weights.safetensors", "preprocessing.json")


class ExportError(UserError):
    """A run that cannot be exported (one line, exit 2)."""


class GreedyPolicy(nn.Module):
    """The network with a batch of observations in, greedy actions out (what is traced)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        from herd.models import action_distribution_of
        from herd.ops.distributions import get_distribution
        self.model = model.requires_grad_(False)             # no autograd graph in the exported outputs
        self.distribution = get_distribution(action_distribution_of(model))

    def forward(self, observation: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = self.model(observation.unsqueeze(0))          # [1, N, ...]: herd's networks are time-major
        params = out.logits[0]                               # [N, A] or [N, 2A]
        return self.distribution.mode(params), params, out.value[0]


def action_bounds(policy) -> dict[str, Any]:
    """The Box a continuous policy's [-1, 1] actions are rescaled to (herd's RescaleClipAction)."""
    if policy.plan.env_spec.action_kind != "continuous":
        return {}
    env = policy.make_env()
    try:
        space = env.unwrapped.action_space
        return {"action_low": space.low.tolist(), "action_high": space.high.tolist()}
    finally:
        env.close()


def export_run(run: str | Path, out: str | Path | None = None, env: str | None = None) -> Path:
    """Exports the policy of a run folder (its newest checkpoint) or a checkpoint file;
    returns the folder written. env: --env, which a custom environment's id must be given
    as (herd.api.load_policy)."""
    from safetensors.torch import save

    from herd.api import load_policy
    from herd.files import run_subfolder, write_bytes, write_json
    from herd.models import recurrent_core
    policy = load_policy(run, greedy=True, env=env)
    if recurrent_core(policy.model) is not None:
        raise ExportError(f"{run}: runs with an LSTM core (--use_lstm) cannot be exported yet (its state "
                          "would have to be an input and an output of the exported policy)")
    checkpoint = Path(policy.plan.checkpoint_path)
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    if out is None:
        folder = run_subfolder(run_dir, "export")     # a linked export/ is refused, not written through
    else:
        folder = Path(out)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ExportError(f"cannot create '{folder}': {err.strerror or err}") from None
    example = torch.zeros((1, *policy.obs_shape), dtype=getattr(torch, str(policy.obs_dtype)))
    with torch.no_grad():
        traced = torch.jit.trace(GreedyPolicy(policy.model).eval(), example, check_trace=False)
    # Serialised in memory, then written by write_bytes: a linked policy.pt is refused.
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    write_bytes(folder / "policy.pt", buffer.getvalue())
    weights = {name: tensor.detach().contiguous().clone() for name, tensor in policy.model.state_dict().items()}
    write_bytes(folder / "weights.safetensors", save(weights, metadata={"format": "pt", "source": str(checkpoint)}))
    spec = policy.preprocessing
    spec.pop("greedy")                         # the exported policy is greedy by construction
    write_json(folder / "preprocessing.json", {
        **spec, **action_bounds(policy), "checkpoint": str(checkpoint),
        "input": {"observation": ["N", *spec["obs_shape"]], "dtype": spec["obs_dtype"]},
        "outputs": ["action", "policy_parameters", "value"],
        "action": ("int64 [N], the most probable action" if spec["action_kind"] == "discrete" else
                   "float32 [N, A] in [-1, 1], the Gaussian's mean: map onto [action_low, action_high]")})
    return folder


def export_command(run: str, out: str | None, env: str | None = None) -> int:
    """`herd export RUN [--out DIR] [--env ID]`: prints the files written."""
    folder = export_run(run, out, env)
    for name in FILES:
        print(folder / name)
    return 0
