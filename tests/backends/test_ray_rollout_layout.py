"""A Ray actor's rollout leaves as C-contiguous arrays (herd/backends/ray_actors.py: its
TrajectorySlots, slot first), which Ray serializes out of band without copying them; a run
of positions of a store (capacity second) would be strided in time and copied by the
pickling first. The actor runs here in
this process (its class, not a Ray actor), its weights handed over as an array."""
from __future__ import annotations

import pickle
import signal

from torch.nn.utils import parameters_to_vector

import herd.backends.ray_actors as ray_actors
from herd.models import build_model
from herd.plan import prepare
from herd.training import actor_spec


def test_a_rollout_leaves_contiguous_and_pickles_out_of_band(monkeypatch):
    plan = prepare({"env": "CartPole-v1", "envs_per_worker": 4, "r_f_steps": 8, "seed": 3})
    spec = actor_spec(plan)
    vector = parameters_to_vector(build_model(**plan.model_kwargs).parameters()).detach().numpy()
    monkeypatch.setattr(ray_actors.ray, "get", lambda ref: ref)          # the "ref" is the vector itself
    # The worker ignores SIGINT, as a Ray actor should; not this test process (its later
    # children would inherit the ignoring).
    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(ray_actors.signal, "signal", lambda signum, handler: None)
    worker = ray_actors.RolloutWorker(0, spec, plan.layout, slots=3, version=0, refs=[vector])
    assert signal.getsignal(signal.SIGINT) == before
    for _ in range(4):                                                   # every slot, one twice
        rollout, arrays = worker.next_rollout()
        assert arrays["obs"].shape[:2] == (9, 4) and (arrays["action"] >= 0).all()
        for name, array in arrays.items():
            assert array.flags.c_contiguous, name
        # Out of band: the frames' bytes are not inside the pickle stream (no copy into it).
        buffers = []
        stream = pickle.dumps(arrays["obs"], protocol=5, buffer_callback=buffers.append)
        assert len(buffers) == 1 and len(stream) < arrays["obs"].nbytes


def test_a_strided_slot_would_be_pickled_in_band():
    """Negative control: the same field as 4 positions of a store of 12 (strided in time)."""
    from herd.store import TrajectoryStore
    plan = prepare({"env": "CartPole-v1", "envs_per_worker": 4, "r_f_steps": 8})
    obs = TrajectoryStore(plan.layout, 12).positions(4, 4)["obs"]
    assert not obs.flags.c_contiguous
    buffers = []
    stream = pickle.dumps(obs, protocol=5, buffer_callback=buffers.append)
    assert buffers == [] and len(stream) > obs.nbytes
