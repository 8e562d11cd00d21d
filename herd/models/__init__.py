"""Networks: every one maps time-major observations [T, B, *obs_shape] to ModelOutput
(logits [T, B, A], value [T, B], features [T, B, F])."""
from __future__ import annotations

from typing import Optional

import numpy as np
from torch import nn

from herd.models.base import HEADS, ModelOutput, action_distribution_of
from herd.models.cnn import ImpalaResNet, NatureCNN
from herd.models.constant import ConstantPolicy
from herd.models.core import CoreInput, EnvCoreStates, recurrent_core
from herd.models.minatar_cnn import MinAtarCNN
from herd.models.mlp import MLPNet
from herd.models.normalize import ObservationNormalizer

__all__ = ["HEADS", "NETWORKS", "ConstantPolicy", "CoreInput", "EnvCoreStates", "ModelOutput", "MLPNet", "NatureCNN", "ImpalaResNet",
           "MinAtarCNN", "action_distribution_of", "build_model", "model_signature", "observation_normalizer",
           "recurrent_core"]

NETWORKS = ("auto", "mlp", "nature_cnn", "resnet", "minatar_cnn", "constant")
# The Nature CNN's strides (8/4, 4/2, 3/1) need frames of at least 36x36; "auto" gives
# smaller frames (MinAtar's 10x10) the small network made for them.
NATURE_CNN_MIN_SIDE = 36
IMAGE_NETWORKS = {"nature_cnn": NatureCNN, "resnet": ImpalaResNet, "minatar_cnn": MinAtarCNN}
# The image networks with a per-pixel FrameNormalizer (MinAtar's frames are 0/1 channels of
# objects, already as informative as a normaliser would make them).
FRAME_NORMALIZING_NETWORKS = ("nature_cnn", "resnet")


def build_model(network: str, obs_shape: tuple, obs_dtype: str, num_actions: int, feature_size: Optional[int],
                use_feature_layer: bool = True, hidden_sizes=(64, 64), head: str = "actor_critic",
                lstm_size: int = 0, action_distribution: str = "categorical", initial_log_std: float = -1.0,
                normalize_observations: bool = False) -> nn.Module:
    """The network for an environment. "auto" picks mlp for vector observations [D],
    nature_cnn for frames [C, H, W], minatar_cnn for frames smaller than 36x36. Image
    networks scale uint8 frames by 1/255; float frames are taken as already in [0, 1].
    feature_size=None means the torso's own size.
    head: "actor_critic" (policy logits and value) or "dueling_q" (Q values in the logits
    field, max_a Q in the value field; herd.models.base.HEADS).
    lstm_size > 0: an LSTM core of that size between the torso and the heads
    (herd/models/core.py); such a network also has unroll(obs, CoreInput) -> (out, state).
    action_distribution: "categorical" (num_actions logits) or "gaussian" (continuous actions
    of dimension num_actions: mean and log-std in the logits field, initial_log_std its start);
    normalize_observations: a running mean/std normaliser of vector observations (mlp) or of
    frames, per pixel (nature_cnn, resnet).
    Every mismatch raises ValueError with one line (the config layer shows it as is)."""
    if head not in HEADS:
        raise ValueError(f"unknown head '{head}' (use one of {', '.join(HEADS)})")
    if network not in NETWORKS:
        raise ValueError(f"unknown network '{network}' (use one of {', '.join(NETWORKS)})")
    obs_shape = tuple(int(d) for d in obs_shape)
    try:
        np.dtype(obs_dtype)
    except TypeError:
        raise ValueError(f"unknown observation dtype '{obs_dtype}'") from None
    if num_actions < 1:
        raise ValueError(f"networks need at least one action, got num_actions={num_actions}")
    if lstm_size < 0:
        raise ValueError(f"lstm_size must be positive, got {lstm_size}")
    if feature_size is not None and feature_size < 1:
        raise ValueError(f"feature_out_layer_size must be positive, got {feature_size}")
    if network == "auto":
        if len(obs_shape) not in (1, 3):
            raise ValueError(f"network auto handles vectors [D] and frames [C, H, W], this environment gives "
                             f"shape {obs_shape}")
        network = ("mlp" if len(obs_shape) == 1 else
                   "minatar_cnn" if min(obs_shape[1:]) < NATURE_CNN_MIN_SIDE else "nature_cnn")
    if network == "constant":
        # Nothing reads the observations, so nothing would use a core, a Q head or a normaliser.
        for name, given in (("lstm_size", lstm_size > 0), ("head", head != "actor_critic"),
                            ("action_distribution", action_distribution != "categorical"),
                            ("normalize_observations", normalize_observations)):
            if given:
                raise ValueError(f"network constant (one policy for every observation, discrete actions) takes no "
                                 f"{name}: leave it unset or pick another network")
        return ConstantPolicy(num_actions, feature_size)
    if network == "mlp":
        if len(obs_shape) != 1:
            raise ValueError(f"network mlp needs vector observations [D], this environment gives shape {obs_shape}")
        if any(int(h) < 1 for h in hidden_sizes):
            raise ValueError(f"hidden_sizes must be positive, got {tuple(hidden_sizes)}")
        return MLPNet(obs_shape[0], num_actions, tuple(int(h) for h in hidden_sizes), feature_size, use_feature_layer,
                      head=head, core_size=lstm_size, action_distribution=action_distribution,
                      initial_log_std=initial_log_std, normalize_observations=normalize_observations)
    if action_distribution != "categorical":
        raise ValueError(f"network {network} has discrete actions: continuous actions need vector observations "
                         "(network mlp)")
    if normalize_observations and network not in FRAME_NORMALIZING_NETWORKS:
        raise ValueError(f"network {network} has no observation normaliser: --normalize_observations needs "
                         f"network {' or '.join(('mlp',) + FRAME_NORMALIZING_NETWORKS)}")
    if len(obs_shape) != 3:
        raise ValueError(f"network {network} needs frames [C, H, W], this environment gives shape {obs_shape}")
    cls = IMAGE_NETWORKS[network]
    extra = dict(normalize_observations=True) if normalize_observations else {}
    return cls(obs_shape[0], num_actions, feature_size, use_feature_layer, frame_hw=obs_shape[1:], head=head,
               core_size=lstm_size, **extra)


def observation_normalizer(model: nn.Module):
    """The network's ObservationNormalizer (herd/models/normalize.py), or None."""
    for module in model.modules():
        if isinstance(module, ObservationNormalizer):
            return module
    return None


def model_signature(model: nn.Module) -> dict[str, list[int]]:
    """Parameter (and buffer) name -> shape, i.e. everything a checkpoint holds: two models
    with equal signatures can load each other's state_dict."""
    return {name: list(t.shape) for name, t in model.state_dict().items()}
