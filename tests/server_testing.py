"""Inference servers that record what they answer, and requests that name themselves: for
the tests of several servers (tests/inference/test_routing.py, test_growth.py)."""
from __future__ import annotations

import numpy as np

from herd.inference.server import BatchServer


class CountingServer(BatchServer):
    """Records every (client, request number) it answers, and each batch's clients.
    pipelined=True runs serve_forever's CUDA schedule on the CPU: batch k+1 launched before
    batch k is answered (the in-flight clients must not be served twice)."""

    def __init__(self, *args, answered: list, pipelined: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.answered, self.batches, self.pipelined_here = answered, [], pipelined

    @property
    def pipelined(self) -> bool:
        return self.pipelined_here

    def launch(self, clients):
        self.batches.append(sorted(clients.tolist()))
        return super().launch(clients)

    def finish(self, launched) -> None:
        self.answered.extend(zip(launched.clients.tolist(), launched.seqs.tolist()))
        super().finish(launched)



def request_obs(actor: int, k: int) -> np.ndarray:
    """Observations that name their actor and request: an answer for another request differs."""
    return np.full((3, 4), actor + 0.01 * k, dtype=np.float32) + np.arange(3, dtype=np.float32)[:, None]
