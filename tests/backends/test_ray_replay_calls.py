"""The learner's calls to the replay server (herd/backends/ray_replay.py RemoteBatches)
against real Ray actors on a one-node local Ray (loopback): a server that does not answer
a state or load call within CALL_TIMEOUT, or that died, ends the run with one line
(ReplayLost), instead of leaving the learner waiting forever."""
import threading

import pytest
import torch

from herd.errors import ReplayLost

ray = pytest.importorskip("ray")


class Server:
    """Stands in for ReplayServer: answers state calls at once, or never (`hung`)."""

    def __init__(self, hung: bool):
        self.hung, self.never = hung, threading.Event()

    def ready(self) -> bool:
        return True

    def state_dict(self):
        if self.hung:
            self.never.wait(600)
        return {"replays": []}, 0

    def load_state_dict(self, state, fresh):
        if self.hung:
            self.never.wait(600)


def remote_batches(hung: bool):
    from herd.backends.ray_replay import RemoteBatches
    server = ray.remote(max_concurrency=4)(Server).options(num_cpus=0).remote(hung)
    # Started before the clock of any call runs: a worker process takes seconds to start here.
    assert ray.get(server.ready.remote(), timeout=120)
    return RemoteBatches(server, {"pid": 1234, "node": "0123456789abcdef"}, torch.device("cpu"), in_flight=1,
                         max_writes=1), server


def test_a_state_call_the_server_does_not_answer_ends_in_one_line(local_ray, monkeypatch):
    """Catches a state or load call made without a deadline: a hung server (a stuck
    thread, a node that stopped answering) would freeze the run at its next save."""
    from herd.backends import ray_replay
    monkeypatch.setattr(ray_replay, "CALL_TIMEOUT", 1.0)
    answering, _ = remote_batches(hung=False)
    assert answering.replay_state() == {"replays": []}               # a live server answers in time
    batches, _ = remote_batches(hung=True)
    with pytest.raises(ReplayLost, match=r"^the replay server did not answer within 1 s: the run stops"):
        batches.replay_state()
    with pytest.raises(ReplayLost, match=r"did not answer within 1 s"):
        batches.load_replay_state({"replays": []})


def is_dead(server) -> bool:
    try:
        ray.get(server.ready.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        pass
    return False


def test_a_dead_server_ends_the_call_in_one_line(local_ray):
    """Catches a dead server's Ray error (many lines of Ray's account) reaching the user
    instead of one line naming the server."""
    from herd_testing import wait_for        # here: Ray's workers import this module without tests/ on their path
    batches, server = remote_batches(hung=False)
    ray.kill(server)
    # ray.kill only asks: a call sent at once may still be answered (CI saw one that was).
    # Wait for the death itself, then make the call.
    assert wait_for(lambda: is_dead(server), 60), "the killed server still answers after 60 s"
    with pytest.raises(ReplayLost, match=r"the replay server \(pid 1234 on node 0123456789ab\) died"):
        batches.replay_state()
