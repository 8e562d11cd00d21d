"""Networks: every one maps time-major observations [T, B, ...] to ModelOutput
(logits [T, B, A], value [T, B], features [T, B, F])."""
from __future__ import annotations

from torch import nn

from herd.models.base import ModelOutput  # noqa: F401
from herd.models.cnn import ImpalaResNet, NatureCNN
from herd.models.mlp import MLPNet

NETWORKS = ("auto", "mlp", "nature_cnn", "resnet")


def build_model(network: str, obs_shape: tuple, obs_dtype: str, num_actions: int, feature_size: int,
                use_feature_layer: bool = True, hidden_sizes=(64, 64)) -> nn.Module:
    if network not in NETWORKS:
        raise ValueError(f"unknown network '{network}' (use one of {', '.join(NETWORKS)})")
    if network == "auto":
        network = "mlp" if len(obs_shape) == 1 else "nature_cnn"
    if network == "mlp":
        if len(obs_shape) != 1:
            raise ValueError(f"network mlp needs vector observations, this environment gives shape {tuple(obs_shape)}")
        return MLPNet(obs_shape[0], num_actions, tuple(hidden_sizes), feature_size, use_feature_layer)
    if len(obs_shape) != 3:
        raise ValueError(f"network {network} needs frames [C, H, W], this environment gives shape {tuple(obs_shape)}")
    cls = NatureCNN if network == "nature_cnn" else ImpalaResNet
    return cls(obs_shape[0], num_actions, feature_size, use_feature_layer, frame_hw=tuple(obs_shape[1:]))


def model_signature(model: nn.Module) -> dict[str, list[int]]:
    """Parameter name -> shape: two models with equal signatures can share a checkpoint."""
    return {name: list(p.shape) for name, p in model.state_dict().items()}
