"""Versioned policy weights in shared memory: the learner publishes, actors pull.

One flat float32 tensor holds every parameter. A sequence lock (one writer, many readers)
keeps a pull from mixing two versions: the learner makes the sequence odd, copies in, makes
it even; a reader copies out and keeps the copy only if the sequence was even and unchanged
around it, else copies again. Readers hold nothing, so an actor killed mid-pull (kill -9, a
crashed env) cannot leave the learner's next publish waiting forever, as a shared lock
could.

The check relies on each side's stores and loads reaching memory in program order, which
x86-64 guarantees. On a weakly ordered CPU a pull could, rarely, mix two consecutive
versions: harmless to the learning maths, because every trajectory records the behaviour
policy's own outputs (logits, Q values) and the losses correct against those.

A CPU learner's own parameters can live in the shared vector (`adopt`): the optimizer then
writes the weights where the actors read them, inside `writing()` (the sequence odd while
it writes), and a publish only moves the version: no copy per update.

The one writer can die too (kill -9 inside its few-millisecond copy), leaving the sequence
odd for good: a reader that sees the same odd sequence for PUBLISH_DEADLINE_S gives up with
an error instead of spinning on as an orphan."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.multiprocessing as mp
from torch.nn.utils import parameters_to_vector, vector_to_parameters

PUBLISH_DEADLINE_S = 30.0   # a publish is one memcpy (milliseconds): this long odd means its writer died


def copy_parts(flat: torch.Tensor, parts: torch.Tensor | Sequence[torch.Tensor], non_blocking: bool = False,
               views: list[torch.Tensor] | None = None) -> None:
    """flat [P] <- parts: a flat vector [P], or tensors whose elements, laid end to end in
    order, make the P (a model's parameters: one copy each, straight into flat, where
    joining them first would copy every weight twice). views: flat_views(flat, parts),
    when the caller keeps them from one copy to the next."""
    if isinstance(parts, torch.Tensor):
        flat.copy_(parts, non_blocking=non_blocking)
        return
    torch._foreach_copy_(flat_views(flat, parts) if views is None else views, list(parts), non_blocking=non_blocking)


def flat_views(flat: torch.Tensor, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of flat [P], one per part and of its shape, laid end to end."""
    return [view.view(part.shape) for view, part in zip(flat.split([part.numel() for part in parts]), parts)]


class SharedWeights:
    def __init__(self, model: torch.nn.Module, context=None):
        context = context or mp.get_context("spawn")
        self.flat = parameters_to_vector(model.parameters()).detach().cpu().clone().share_memory_()
        self._version = context.Value("q", 0, lock=False)
        self._sequence = context.Value("q", 0, lock=False)   # odd while a publish is copying in
        self.views: tuple[tuple, list[torch.Tensor]] = ((), [])  # (the parts' shapes, flat's views for them)
        self.host_views: tuple[tuple, list[np.ndarray]] = ((), [])   # the same as numpy arrays
        self.adopted = False        # the learner's parameters are views of flat (adopt)

    def adopt(self, model: torch.nn.Module) -> bool:
        """Makes the model's parameters views of the shared vector, in the order and shapes
        readers load (their values kept), where every parameter is a float32 tensor
        contiguous in host memory (a CPU learner's): its optimizer then updates the weights
        in place, inside writing(), and publish_adopted() only moves the version. False,
        with the model unchanged, for any other model (a GPU learner's weights are copied
        off the device)."""
        params = list(model.parameters())
        if not all(p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous() for p in params):
            return False
        if sum(p.numel() for p in params) != self.flat.numel():
            raise ValueError(f"the model has {sum(p.numel() for p in params)} weights; this store holds "
                             f"{self.flat.numel()}")
        with torch.no_grad():
            for param, view in zip(params, flat_views(self.flat, params)):
                view.copy_(param)
                param.data = view
        self.adopted = True
        return True

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Around every in-place write of adopted parameters (the learner's optimizer step):
        a reader whose copy overlaps it copies again."""
        self._sequence.value += 1
        try:
            yield
        finally:
            self._sequence.value += 1

    def publish_adopted(self, parts, version: int) -> int:
        """publish_vector() for adopted parameters: they are already here, written under
        writing(); only the version moves. `parts` (the publisher's view of them) is not
        read."""
        if not self.adopted:
            raise RuntimeError("publish_adopted: no parameters were adopted; publish_vector copies them in")
        self._version.value = version
        return version

    @property
    def version(self) -> int:
        return int(self._version.value)

    def publish(self, model: torch.nn.Module, version: int | None = None) -> int:
        """Copies the model's parameters in and bumps (or sets) the version. One process
        publishes into a given SharedWeights (the learner, or the primary of several).
        Adopted parameters are not copied onto themselves: the version moves."""
        if self.adopted:
            return self.publish_adopted(None, self.version + 1 if version is None else version)
        with torch.no_grad():
            vector = parameters_to_vector(model.parameters()).detach().cpu()  # off the GPU first
        return self.publish_vector(vector, version)

    def publish_vector(self, vector: torch.Tensor | Sequence[torch.Tensor] | Sequence[np.ndarray],
                       version: int | None = None) -> int:
        """publish() from parameters already on the host: the flat vector [P]
        (herd/learner/publisher.py copies a GPU's off the device without blocking the
        learner), or a CPU learner's parameters themselves, copied in with no joined copy
        between (copy_parts). Given as numpy arrays (a CPU learner's publisher), they are
        copied by numpy in this thread: torch with several threads (an fp32 CPU learner has one
        per core) splits each large copy over them, and with the actors busy on the other
        cores they wait for one another (the Nature CNN's 7.8 MB: 3.2 ms against 1.8 ms on 2
        busy cores; 1.9 ms with one torch thread)."""
        self._sequence.value += 1
        if isinstance(vector, torch.Tensor):
            copy_parts(self.flat, vector)
        elif isinstance(vector[0], np.ndarray):
            for view, part in zip(self.host_views_for(vector), vector):
                np.copyto(view, part)
        else:
            copy_parts(self.flat, vector, views=self.views_for(vector))
        self._version.value = self._version.value + 1 if version is None else version
        self._sequence.value += 1
        return int(self._version.value)

    def views_for(self, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """flat's views for these parts, made once: a learner publishes the same parameters every update."""
        shapes = tuple(part.shape for part in parts)
        if shapes != self.views[0]:
            self.views = (shapes, flat_views(self.flat, parts))
        return self.views[1]

    def __getstate__(self) -> dict:
        """A child process gets the shared memory, not the cached numpy views (copies once pickled)."""
        return {**self.__dict__, "host_views": ((), [])}

    def host_views_for(self, parts: Sequence[np.ndarray]) -> list[np.ndarray]:
        """views_for() as numpy arrays, made once."""
        shapes = tuple(part.shape for part in parts)
        if shapes != self.host_views[0]:
            self.host_views = (shapes, [view.numpy() for view in flat_views(self.flat, [torch.from_numpy(part)
                                                                                      for part in parts])])
        return self.host_views[1]

    def pull(self, model: torch.nn.Module, have_version: int) -> int:
        """Loads the published weights into `model` if they are newer; returns their version."""
        if self._version.value == have_version:
            return have_version
        vector, version = self.snapshot()
        with torch.no_grad():
            vector_to_parameters(vector, model.parameters())
        return version

    def snapshot(self) -> tuple[torch.Tensor, int]:
        """(a copy of the flat weights, their version), never half of one publish."""
        stuck, since = None, 0.0        # an odd sequence seen, and since when
        while True:
            before = self._sequence.value
            if before % 2 == 0:
                vector = self.flat.clone()
                version = int(self._version.value)
                if self._sequence.value == before:
                    return vector, version
            elif before != stuck:
                stuck, since = before, time.monotonic()
            elif time.monotonic() - since > PUBLISH_DEADLINE_S:
                raise RuntimeError(f"the weights' publisher stopped inside a publish (no progress for "
                                   f"{PUBLISH_DEADLINE_S:g} s): it died or hangs")
            time.sleep(0)   # a publish is copying in (a memcpy): let it finish
