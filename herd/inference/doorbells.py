"""Doorbells: how a client tells the server "a request is waiting" and how the server tells
a client "your answer is ready".

A doorbell is only a wake-up. What is waiting, and for whom an answer is, lives in the
shared header (sequence numbers, see channels.py), so a lost, late or extra ring can cost
time but never give a wrong answer: every waiter re-reads the header after waking.

Four mechanisms, compared by benchmarks/inference_server.py:

    semaphore  one POSIX semaphore the server waits on, one per client (the default:
               the lowest round trip measured, about half the pipe's for the MLP, and
               nothing is ever held, so a client killed at any instant (kill -9) cannot
               block the server or the other clients).
    pipe       one pipe every client writes a byte to (writes under PIPE_BUF are atomic, so
               a killed writer leaves no half message), one pipe per client for answers.
    queue      multiprocessing.Queue both ways. Its writers share a lock (taken by a feeder
               thread), so a client killed while holding it would block every other client:
               measured for comparison, not recommended.
    spin       no kernel object: both sides poll the header, yielding the CPU between polls.
               Lowest latency when cores are free; burns a core per waiting process.

Every `wait_*` returns after at most `timeout` seconds, rung or not, so callers can check
for a stop request or a dead peer.

One more, not a choice of --inference_doorbell: `inline`, where the server is no other
process but a BatchServer in the client's own (herd/inference/in_actor.py): ringing
launches the request's batch in the ringing thread, waiting for the answer finishes it.
"""
from __future__ import annotations

import queue
import time
from collections import deque
from typing import Callable

import numpy as np

MECHANISMS = ("semaphore", "pipe", "queue", "spin")

Ready = Callable[[], bool]  # true once the awaited thing is in the header (used by "spin" only)


class SemaphoreDoorbell:
    def __init__(self, num_clients: int, context):
        self.server = context.Semaphore(0)
        self.clients = [context.Semaphore(0) for _ in range(num_clients)]

    def ring_server(self, client: int) -> None:
        self.server.release()

    def wait_server(self, ready: Ready, timeout: float) -> None:
        if self.server.acquire(timeout=timeout):
            # One scan of the header serves every ring so far: absorb the others, so they do
            # not each cost an empty scan. A ring after this is kept for the next wait.
            while self.server.acquire(False):
                pass

    def ring_client(self, client: int) -> None:
        self.clients[client].release()

    def wait_client(self, client: int, ready: Ready, timeout: float) -> None:
        self.clients[client].acquire(timeout=timeout)

    def forget_client(self, client: int) -> None:
        """Drops rings meant for a dead predecessor with the same index."""
        while self.clients[client].acquire(False):
            pass


class PipeDoorbell:
    def __init__(self, num_clients: int, context):
        self.server_rx, self.server_tx = context.Pipe(duplex=False)
        pairs = [context.Pipe(duplex=False) for _ in range(num_clients)]
        self.client_rx = [rx for rx, _ in pairs]
        self.client_tx = [tx for _, tx in pairs]

    def ring_server(self, client: int) -> None:
        self.server_tx.send_bytes(b"r")

    def wait_server(self, ready: Ready, timeout: float) -> None:
        if self.server_rx.poll(timeout):
            while self.server_rx.poll():
                self.server_rx.recv_bytes()

    def ring_client(self, client: int) -> None:
        self.client_tx[client].send_bytes(b"a")

    def wait_client(self, client: int, ready: Ready, timeout: float) -> None:
        rx = self.client_rx[client]
        if rx.poll(timeout):
            rx.recv_bytes()

    def forget_client(self, client: int) -> None:
        while self.client_rx[client].poll():
            self.client_rx[client].recv_bytes()


class QueueDoorbell:
    def __init__(self, num_clients: int, context):
        self.server = context.Queue()
        self.clients = [context.Queue() for _ in range(num_clients)]

    def ring_server(self, client: int) -> None:
        self.server.put(client)

    def wait_server(self, ready: Ready, timeout: float) -> None:
        try:
            self.server.get(timeout=timeout)
            while True:
                self.server.get_nowait()
        except queue.Empty:
            pass

    def ring_client(self, client: int) -> None:
        self.clients[client].put(None)

    def wait_client(self, client: int, ready: Ready, timeout: float) -> None:
        try:
            self.clients[client].get(timeout=timeout)
        except queue.Empty:
            pass

    def forget_client(self, client: int) -> None:
        try:
            while True:
                self.clients[client].get_nowait()
        except queue.Empty:
            pass


class SpinDoorbell:
    def __init__(self, num_clients: int, context):
        pass

    def ring_server(self, client: int) -> None:
        pass

    ring_client = ring_server

    @staticmethod
    def wait_server(ready: Ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0)  # sched_yield: give the core to whoever has work, come straight back

    def wait_client(self, client: int, ready: Ready, timeout: float) -> None:
        self.wait_server(ready, timeout)

    def forget_client(self, client: int) -> None:
        pass


class InlineDoorbell:
    """The server is a BatchServer in the clients' own process (serve_with): a ring pulls
    newer weights and launches the ringing client's batch (on a GPU it runs while the
    caller goes on: a double-buffered actor steps its other half); a wait finishes the
    batches launched so far, in order, until the waiter's answer is in."""

    def __init__(self, num_clients: int, context):
        self.server = None
        self.launched = deque()

    def serve_with(self, server) -> None:
        self.server = server

    def ring_server(self, client: int) -> None:
        self.server.refresh_weights()
        self.launched.append(self.server.launch(np.array([client])))

    def wait_server(self, ready: Ready, timeout: float) -> None:
        raise RuntimeError("an inline doorbell's server runs in its clients' thread: nothing waits for rings")

    def ring_client(self, client: int) -> None:
        pass            # the answer is in the header: the client reads it as its wait returns

    def wait_client(self, client: int, ready: Ready, timeout: float) -> None:
        while self.launched and not ready():
            self.server.finish(self.launched.popleft())

    def forget_client(self, client: int) -> None:
        pass


def make_doorbell(mechanism: str, num_clients: int, context):
    kinds = {"semaphore": SemaphoreDoorbell, "pipe": PipeDoorbell, "queue": QueueDoorbell, "spin": SpinDoorbell,
             "inline": InlineDoorbell}
    if mechanism not in kinds:
        raise ValueError(f"unknown inference signalling mechanism '{mechanism}' (use one of {', '.join(MECHANISMS)})")
    return kinds[mechanism](num_clients, context)
