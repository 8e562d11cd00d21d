"""Replay storage through a checkpoint: empty (a stop before the first rollout reached the
replay) and partly filled, with and without compressed observations."""
import numpy as np
import pytest

from herd.checkpoint import load_checkpoint, save_checkpoint
from herd.store import TrajectoryStore
from herd.algos.impala import impala_layout

LAYOUT = impala_layout(unroll_length=3, obs_shape=(2, 6, 6), obs_dtype="uint8", num_actions=3, feature_size=4)


def trajectory(rng):
    return {name: rng.integers(0, 100, size=shape).astype(dtype) for name, (shape, dtype) in LAYOUT.fields().items()}


@pytest.mark.parametrize("source_compressed", [False, True])
@pytest.mark.parametrize("target_compressed", [False, True])
@pytest.mark.parametrize("filled", [0, 2])
def test_state_survives_a_checkpoint(tmp_path, filled, source_compressed, target_compressed):
    rng = np.random.default_rng(filled)
    source = TrajectoryStore(LAYOUT, capacity=4, compress_obs=source_compressed)
    written = [trajectory(rng) for _ in range(filled)]
    for position, traj in enumerate(written):
        source.write(position, traj, version=10 + position)

    save_checkpoint({"replay": source.state_dict(filled)}, tmp_path, update=1)
    state, _ = load_checkpoint(tmp_path)
    target = TrajectoryStore(LAYOUT, capacity=4, compress_obs=target_compressed)
    target.load_state_dict(state["replay"])

    assert state["replay"]["packed_offsets"].shape == (filled, LAYOUT.unroll_length + 2)
    np.testing.assert_array_equal(target.version[:filled], 10 + np.arange(filled))
    assert (target.version[filled:] == -1).all()           # nothing invented beyond what was stored
    if filled:
        batch = target.read(np.arange(filled))
        for name in LAYOUT.fields():
            for position, traj in enumerate(written):
                np.testing.assert_array_equal(batch[name][:, position], traj[name], err_msg=name)


@pytest.mark.parametrize("saved_on_device", [False, True])
@pytest.mark.parametrize("filled", [0, 3])
def test_device_storage_keeps_the_checkpoint_format(tmp_path, saved_on_device, filled):
    """Replays in device memory (herd/store.py, here with CPU tensors) save
    the host storage's format and load it: a checkpoint from a GPU learner resumes on a CPU
    one and the other way round. Catches a device storage that saves its own format or
    loses a field, a position or a version."""
    import torch
    from herd.store import TrajectoryStore

    rng = np.random.default_rng(filled + 10)
    written = [trajectory(rng) for _ in range(filled)]

    def make(device_side: bool):
        return (TrajectoryStore(LAYOUT, 4, torch.device("cpu")) if device_side
                else TrajectoryStore(LAYOUT, capacity=4, compress_obs=True))

    source = make(saved_on_device)
    for position, traj in enumerate(written):
        source.write(position, traj, version=5 + position)
    save_checkpoint({"replay": source.state_dict(filled)}, tmp_path, update=1)
    state, _ = load_checkpoint(tmp_path)
    target = make(not saved_on_device)
    target.load_state_dict(state["replay"])
    np.testing.assert_array_equal(target.version[:filled], 5 + np.arange(filled))
    assert (target.version[filled:] == -1).all()
    if filled:
        batch = target.read(np.array([2, 0]))
        for name in LAYOUT.fields():
            for column, position in enumerate((2, 0)):
                got = batch[name][:, column]
                got = got.numpy() if isinstance(got, torch.Tensor) else got
                np.testing.assert_array_equal(got, written[position][name], err_msg=name)


CUSTOM = {"type": "custom", "dist_function": "ln_norm", "sample_strategy": "elite_sampling",
          "insert_strategy": "elite_insertion", "elite_batch_size": 3, "lambda_batch_multiplier": 2}
PRIORITIZED = {"type": "prioritized", "alpha": 0.8, "beta": 0.3, "beta_annealing_steps": 10}


def built(entry: dict, on_device: bool):
    import json

    import torch
    from herd.models import build_model
    from herd.replay.registry import build_replay
    from herd.replay.spec import parse_replay_parameters

    spec = parse_replay_parameters(json.dumps([{**entry, "capacity": 4, "sample_ratio": 1}]))[0]
    replay = build_replay(spec, LAYOUT, 2, 1, n_step=2, seed=1, storage_device=torch.device("cpu") if on_device else None)
    torch.manual_seed(0)
    replay.attach_model(build_model("auto", (2, 6, 6), "uint8", 3, 4, hidden_sizes=(8,)), "cpu")
    return replay


@pytest.mark.parametrize("entry", [CUSTOM, PRIORITIZED], ids=["custom", "prioritized"])
def test_custom_and_prioritized_replays_move_between_device_and_host_storage(tmp_path, entry):
    """A custom (elite) and a prioritized replay saved from device storage (priorities in
    device memory) load into host storage, and that one's checkpoint back into device
    storage: the checkpoint format is the host one, and every reload samples what the
    original samples (the same items, data and, for prioritized, probabilities). Catches a
    device sampler or storage that saves its own format, or loses a priority, a counter,
    a generation or a stored field on the way."""
    import torch

    def host(value):
        return value.numpy() if isinstance(value, torch.Tensor) else value

    rng = np.random.default_rng(4)
    source = built(entry, on_device=True)
    for tag in range(6):                                        # 6 into 4: evictions (elite insertion, ring)
        source.add(trajectory(rng), version=tag)
    _, _, keys, _ = source.sample(3, np.random.default_rng(0))
    source.update(keys, torch.tensor([0.2, 5.0, 40.0]))       # device values: priorities move apart
    save_checkpoint({"replay": source.state_dict()}, tmp_path / "from_device", update=1)
    state, _ = load_checkpoint(tmp_path / "from_device")
    assert set(state["replay"]["sampler"]) == set(built(entry, on_device=False).sampler.state_dict())
    on_host = built(entry, on_device=False)
    on_host.load_state_dict(state["replay"])
    save_checkpoint({"replay": on_host.state_dict()}, tmp_path / "from_host", update=1)
    back = built(entry, on_device=True)
    back.load_state_dict(load_checkpoint(tmp_path / "from_host")[0]["replay"])

    expected = source.sample(3, np.random.default_rng(9))
    for replay in (on_host, back):
        got = replay.sample(3, np.random.default_rng(9))
        assert got[2].positions.tolist() == expected[2].positions.tolist()
        assert got[2].generations.tolist() == expected[2].generations.tolist()
        assert got[1].tolist() == expected[1].tolist()                          # policy versions
        np.testing.assert_allclose(got[3], expected[3], rtol=1e-12)             # probabilities
        for name, value in expected[0].items():
            np.testing.assert_allclose(host(got[0][name]), host(value), rtol=1e-6, err_msg=name)
