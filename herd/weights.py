"""Versioned policy weights in shared memory: the learner publishes, actors pull.

One flat float32 tensor holds every parameter. A lock makes a publish and a pull
mutually exclusive so an actor never loads half-old, half-new weights; the copy under the
lock is a single memcpy, so neither side waits long."""
from __future__ import annotations

import torch
import torch.multiprocessing as mp
from torch.nn.utils import parameters_to_vector, vector_to_parameters


class SharedWeights:
    def __init__(self, model: torch.nn.Module, context=None):
        context = context or mp.get_context("spawn")
        self.flat = parameters_to_vector(model.parameters()).detach().cpu().clone().share_memory_()
        self._version = context.Value("q", 0, lock=False)
        self._lock = context.Lock()

    @property
    def version(self) -> int:
        return int(self._version.value)

    def publish(self, model: torch.nn.Module, version: int | None = None) -> int:
        """Copies the model's parameters in and bumps (or sets) the version."""
        with torch.no_grad():
            vector = parameters_to_vector(model.parameters()).detach().cpu()  # off the GPU before locking
        with self._lock:
            self.flat.copy_(vector)
            self._version.value = self._version.value + 1 if version is None else version
            return int(self._version.value)

    def pull(self, model: torch.nn.Module, have_version: int) -> int:
        """Loads the published weights into `model` if they are newer; returns their version."""
        if self._version.value == have_version:
            return have_version
        with self._lock:
            vector = self.flat.clone()
            version = int(self._version.value)
        with torch.no_grad():
            vector_to_parameters(vector, model.parameters())
        return version
