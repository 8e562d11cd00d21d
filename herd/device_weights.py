"""Weights from a GPU learner to an inference server on the same GPU, device to device.

The host board (herd/weights.py SharedWeights) goes learner -> pinned buffer -> shared
memory -> the server's pinned buffer -> its GPU: two trips over PCIe for weights that never
had to leave the device. Where the server runs on the learner's own CUDA device it reads
them from this board instead: the same weight board (herd/weights.py WeightBoard) with two
slots of the flat float32 parameters, [2, P], in the learner's device memory, handed to the
server process as a CUDA IPC handle (torch.multiprocessing's pickling; the learner keeps the
board alive for the run). On a CPU the slots are shared memory, so the same protocol runs,
and is tested, with CPU tensors and real processes."""
from __future__ import annotations

import torch
import torch.multiprocessing as mp

from herd.weights import WeightBoard


def same_cuda_device(learner: torch.device, server: torch.device) -> tuple[bool, str]:
    """Whether a server on `server` can take the weights from a board on `learner` device
    to device, and why (for the log). Called in the learner's process: its "cuda" means its
    current device; a server process starts fresh, so its "cuda" means cuda:0."""
    learner, server = torch.device(learner), torch.device(server)
    if learner.type != "cuda" or server.type != "cuda":
        where = "the learner" if learner.type != "cuda" else "the server"
        return False, f"{where} is not on a CUDA device (learner {learner}, server {server})"
    mine = learner.index if learner.index is not None else (
        torch.cuda.current_device() if torch.cuda.is_available() else 0)
    theirs = server.index if server.index is not None else 0
    if mine != theirs:
        return False, f"the learner is on cuda:{mine}, the server on cuda:{theirs}"
    return True, f"the learner and the server share cuda:{mine}"


class DeviceWeightBoard(WeightBoard):
    """Two slots of the flat parameters on the learner's device (herd/weights.py WeightBoard)."""

    def __init__(self, numel: int, device: torch.device | str, context=None):
        super().__init__(numel, device, 2, context or mp.get_context("spawn"))

    @classmethod
    def for_model(cls, model: torch.nn.Module, context=None) -> "DeviceWeightBoard":
        params = list(model.parameters())
        return cls(sum(p.numel() for p in params), params[0].device, context)
