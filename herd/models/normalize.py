"""Running observation normalisation: (x - mean) / std, clipped; for vector observations
(ObservationNormalizer, one mean and std per feature) and for stacked frames
(FrameNormalizer, one mean and std per pixel, as Sample Factory's and rl_games' Atari
defaults normalise their inputs).

Where the statistics live and who updates them, so that every process agrees:
  - They are part of the model, as frozen parameters (requires_grad=False, like the
    feature layer of herd.models.base.Heads): the learner's weight publishing
    (herd.weights.SharedWeights) carries them to every actor, the inference server and the
    evaluation worker together with the weights they belong to, and the checkpoint's
    model state_dict saves them as plain tensors (weights_only loading), so `herd resume`
    and `herd test` normalise exactly as training did.
  - Only the learner updates them, from the raw observations of every fresh rollout it
    ingests (herd/training.py wires that), never from replayed data (already counted) and
    never in the actors (each would drift its own way). Trajectories store raw
    observations; the learner normalises them with its current statistics, and V-trace's
    importance ratio corrects for the actor's older ones like for any older weights.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

CLIP = 10.0          # normalised values beyond +-10 std are outliers, not information
EPSILON = 1e-8       # keeps a constant feature (std 0) finite
# Rows of uint8 levels whose float32 sums (of levels and of their squares) are exact
# integers: 256 * 255^2 < 2^24. Four times cheaper than int64 sums on a CPU.
EXACT_FLOAT32_ROWS = 256


class ObservationNormalizer(nn.Module):
    variance_floor = EPSILON
    rollout_stride = 1      # update_from_rollout counts every rollout_stride-th step

    def __init__(self, size: int):
        super().__init__()
        # float32 like every other parameter (SharedWeights holds one flat float32 vector);
        # the merge below runs in float64. The count is exact in float32 up to 2^24 steps
        # per update of it, far above one rollout.
        self.count = nn.Parameter(torch.zeros(()), requires_grad=False)
        self.mean = nn.Parameter(torch.zeros(size), requires_grad=False)
        self.var = nn.Parameter(torch.ones(size), requires_grad=False)

    def forward(self, obs: Tensor) -> Tensor:
        """obs [N, D] float -> normalised [N, D]."""
        return ((obs - self.mean) / torch.sqrt(self.var + self.variance_floor)).clamp(-CLIP, CLIP)

    @torch.no_grad()
    def update(self, obs) -> None:
        """Adds a batch of raw observations [..., D] (numpy or a tensor on the host or the
        statistics' device) to the statistics: its moments in float64 where they are,
        merged on the statistics' device."""
        obs = obs if isinstance(obs, torch.Tensor) else torch.as_tensor(np.asarray(obs))
        batch = obs.to(torch.float64).reshape(-1, self.mean.shape[0])                                   # [N, D]
        if batch.shape[0]:
            self.merge(batch.shape[0], batch.mean(0), batch.var(0, unbiased=False))

    def update_from_rollout(self, obs) -> None:
        """A fresh rollout's observations [T+1, E, ...] (obs[T] is the next rollout's
        obs[0], counted there) -> update() with every rollout_stride-th step of them."""
        self.update(obs[:-1:self.rollout_stride])

    @torch.no_grad()
    def merge(self, n: int, batch_mean, batch_var) -> None:
        """Chan et al.'s parallel merge of the statistics with n observations' mean and
        (biased) variance [D] (tensors or numpy arrays), all in float64 and on the
        statistics' device: no host read of a GPU's. On a CPU in numpy (merge_on_host)."""
        if self.mean.device.type == "cpu":
            self.merge_on_host(n, np.asarray(batch_mean, dtype=np.float64), np.asarray(batch_var, dtype=np.float64))
        else:
            self.merge_on_device(n, torch.as_tensor(batch_mean), torch.as_tensor(batch_var))

    @torch.no_grad()
    def merge_on_host(self, n: int, batch_mean: np.ndarray, batch_var: np.ndarray) -> None:
        """merge_on_device's arithmetic, the same float64 operations in the same order (so
        the same numbers, tests/models/test_frame_normalizer.py), in numpy: a dozen small
        torch ops cost a CPU learner more in dispatch than in arithmetic."""
        count = float(self.count)
        mean, var = self.mean.numpy().astype(np.float64), self.var.numpy().astype(np.float64)
        total = count + n
        delta = batch_mean - mean
        new_mean = mean + delta * (n / total)
        new_var = (var * count + batch_var * n + np.square(delta) * (count * n / total)) / total
        np.copyto(self.mean.numpy(), new_mean, casting="same_kind")
        np.copyto(self.var.numpy(), new_var, casting="same_kind")
        self.count.fill_(total)

    @torch.no_grad()
    def merge_on_device(self, n: int, batch_mean: Tensor, batch_var: Tensor) -> None:
        """merge() on the statistics' device, in torch."""
        device = self.mean.device
        batch_mean, batch_var = batch_mean.to(device, torch.float64), batch_var.to(device, torch.float64)
        count, mean, var = self.count.double(), self.mean.double(), self.var.double()
        total = count + n
        delta = batch_mean - mean
        new_mean = mean + delta * (n / total)
        # Before any data var is 1 (the identity transform), with weight count = 0.
        new_var = (var * count + batch_var * n + delta.pow(2) * (count * n / total)) / total
        self.mean.copy_(new_mean.to(self.mean.dtype))
        self.var.copy_(new_var.to(self.var.dtype))
        self.count.copy_(total.to(self.count.dtype))


class FrameNormalizer(ObservationNormalizer):
    """Stacked frames [N, C, H, W], uint8 or floats in [0, 1], normalised per pixel: one
    mean and std per (h, w), shared by the C stacked frames (the same pictures, a few steps
    apart) and gathered from each observation's newest frame only (a quarter of the work).
    A pixel that never changed (Pong's background) becomes 0; the ball and the paddles
    stand out by several stds. The variance floor (1e-5, std 0.003 of the [0, 1] range)
    keeps a pixel that was constant so far from turning one level of change into +-10.

    Computed in float32 and only then cast to the autocast dtype: in bfloat16 a constant
    pixel minus its mean would not be exactly 0 (two roundings), and the floor would
    magnify that into a fixed pattern of noise."""

    variance_floor = 1e-5
    # A rollout's frames update the statistics from every 4th step: per-pixel moments over
    # millions of frames need no more, and a profile of benchmarks/learner_loop.py (with a
    # Pong run beside it) put most of the loop's host time per trajectory in these sums.
    rollout_stride = 4

    def __init__(self, frame_hw: tuple[int, int]):
        super().__init__(int(frame_hw[0]) * int(frame_hw[1]))
        self.frame_hw = (int(frame_hw[0]), int(frame_hw[1]))

    def forward(self, frames: Tensor, dtype: torch.dtype = torch.float32,
                memory_format: torch.memory_format = torch.contiguous_format) -> Tensor:
        """frames [N, C, H, W] uint8 (or float in [0, 1]) -> normalised [N, C, H, W] in dtype."""
        x = frames.to(torch.float32, memory_format=memory_format)
        if frames.dtype == torch.uint8:
            x = x.div_(255.0)
        mean = self.mean.view(self.frame_hw)                                    # [H, W]
        inv_std = torch.rsqrt(self.var + self.variance_floor).view(self.frame_hw)
        return x.sub_(mean).mul_(inv_std).clamp_(-CLIP, CLIP).to(dtype, memory_format=memory_format)

    @torch.no_grad()
    def update(self, obs) -> None:
        """Adds the newest frame of each observation [..., C, H, W] (uint8 numpy or a CPU
        tensor). Its per-pixel moments come from exact sums of the uint8 levels, so a pixel
        that never changed gets exactly its value as mean and 0 as variance (and normalises
        to exactly 0). The sums are taken where the statistics live: on a CPU learner in
        numpy, in the loop's own thread (an fp32 CPU learner runs torch with one thread per
        core, which split these small sums, and with the actors on the other core each sum
        then waited for a descheduled thread: 4x slower on 2 busy cores); a GPU learner
        sends the newest frames (a quarter of the observations, uint8) to its device and
        sums there, which costs its host a copy instead of the sums (the learner process's
        host time is the GPU box's limit). Merged on the statistics' device in float64.
        Float frames (in [0, 1]) take float64 moments. Frames already on the statistics'
        device (recorded there by an inference server, herd/inference/records.py) are
        summed there without a copy."""
        on_device = isinstance(obs, torch.Tensor) and obs.device.type != "cpu"
        frames = obs[..., -1, :, :] if on_device else np.asarray(obs)[..., -1, :, :]    # [..., H, W]
        batch = frames.reshape(-1, self.mean.shape[0])                                   # [N, H * W]
        n = batch.shape[0]
        if n == 0:
            return
        if batch.dtype not in (np.uint8, torch.uint8):
            batch = torch.as_tensor(batch).to(torch.float64)
            self.merge(n, batch.mean(0), batch.var(0, unbiased=False))
            return
        if self.mean.device.type == "cpu" and not on_device:
            total, squares = np.zeros((2, batch.shape[1]), dtype=np.float64)
            for start in range(0, n, EXACT_FLOAT32_ROWS):
                levels = batch[start:start + EXACT_FLOAT32_ROWS].astype(np.float32)   # [<=256, H * W]
                total += levels.sum(0)
                squares += np.square(levels, out=levels).sum(0)
            mean = total / n
            self.merge(n, mean / 255.0, np.maximum(squares / n - mean * mean, 0.0) / 255.0 ** 2)
            return
        levels_on_device = torch.as_tensor(batch).to(self.mean.device)
        total, squares = torch.zeros(2, batch.shape[1], dtype=torch.float64, device=self.mean.device)
        for start in range(0, n, EXACT_FLOAT32_ROWS):
            levels = levels_on_device[start:start + EXACT_FLOAT32_ROWS].to(torch.float32)   # [<=256, H * W]
            total += levels.sum(0)
            squares += levels.square_().sum(0)
        mean = total / n
        var = (squares / n - mean * mean).clamp_(min=0.0)
        self.merge(n, mean / 255.0, var / 255.0 ** 2)
