"""Ape-X's pieces: the actors' epsilon schedule and epsilon-greedy act, the actor's initial
priorities written into a finished slot, the loss (double-DQN target, importance weights,
target-network sync and its saved state) and the transition batches of its replay."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from herd.algos import ALGORITHMS, trajectory_layout
from herd.algos.apex import APEX, actor_epsilon
from herd.losses.dqn import ApexLoss
from herd.models import ModelOutput, build_model
from herd.ops.returns import trajectory_priorities
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters

GAMMA = 0.99


def test_apex_is_registered():
    assert ALGORITHMS["apex"] is APEX


def test_epsilon_schedule_of_the_paper():
    eps = [actor_epsilon(i, 8, 0.4, 7.0) for i in range(8)]
    assert eps == pytest.approx([0.4 ** (1 + 7 * i / 7) for i in range(8)])
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert all(a > b for a, b in zip(eps, eps[1:]))               # actor N-1 explores least
    assert actor_epsilon(0, 1, 0.4, 7.0) == 0.4                   # a single actor: eps itself
    assert APEX.act_kwargs(1, 3, {"epsilon": 0.5, "alpha": 2.0}) == {"epsilon": pytest.approx(0.5 ** 2)}
    assert APEX.least_exploring_actor(4) == 3


def q_output(q: torch.Tensor) -> ModelOutput:
    """A ModelOutput over [1, n] with Q values q [n, A]."""
    return ModelOutput(q[None], q.max(-1).values[None], torch.zeros(1, q.shape[0], 1))


def test_act_is_greedy_at_epsilon_0_and_explores_at_the_given_rate():
    q = torch.tensor([[0.0, 2.0, 1.0]]).repeat(20000, 1)
    generator = torch.Generator().manual_seed(0)
    actions, fields = APEX.act(q_output(q), generator, epsilon=0.0)
    assert actions.eq(1).all() and fields["q_taken"].eq(2.0).all() and fields["q_max"].eq(2.0).all()
    actions, fields = APEX.act(q_output(q), generator, epsilon=0.3)
    # A non-greedy action happens with probability 0.3 * 2/3 = 0.2; 20,000 draws have a
    # standard deviation of 0.0028 around it, so 0.015 is over 5 sigma.
    assert abs(actions.ne(1).float().mean().item() - 0.2) < 0.015
    assert torch.equal(fields["q_taken"], q.gather(1, actions[:, None]).squeeze(1))


def test_finish_rollout_writes_the_actors_priorities():
    torch.manual_seed(0)
    model = build_model("mlp", (3,), "float32", 2, None, head="dueling_q").eval()
    T, E = 5, 2
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(T + 1, E, 3)).astype(np.float32)
    with torch.no_grad():
        q = model(torch.from_numpy(obs)).logits                                   # [T+1, E, A]
    actions = rng.integers(0, 2, size=(T, E))
    views = {"obs": obs, "action": actions, "reward": rng.normal(size=(T, E)).astype(np.float32),
             "done": rng.random((T, E)) < 0.3, "trunc_value": np.zeros((T, E), np.float32),
             "q_taken": q[:T].gather(-1, torch.from_numpy(actions)[..., None]).squeeze(-1).numpy(),
             "q_max": q[:T].max(-1).values.numpy(), "priority": np.full((T, E), np.nan, np.float32)}
    APEX.finish_rollout(views, model, {"gamma": GAMMA, "n_step": 3})
    expected = trajectory_priorities(*(torch.from_numpy(views[k]) for k in ("q_taken", "q_max")),
                                     q[T].max(-1).values, torch.from_numpy(views["reward"]),
                                     torch.from_numpy(views["done"]), torch.from_numpy(views["trunc_value"]), GAMMA, 3)
    assert np.allclose(views["priority"], expected.numpy()) and np.all(views["priority"] >= 0)


# ------------------------------------------------------------------------------ the loss

class TableQ(torch.nn.Module):
    """Q(s, a) = table[s, a] for integer observations s: the double-Q target by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def forward(self, obs):
        q = self.table[obs.long().squeeze(-1)]                                    # [T, B, A]
        return ModelOutput(q, q.max(-1).values, q)


def transition(state, action, next_state, rewards, dones, valid, weight):
    return dict(obs=[[state], [next_state]], action=[action], reward=rewards, done=dones, trunc_value=[0.0] * 3,
                valid=valid, weight=[weight])


def test_loss_uses_the_double_q_target_and_the_importance_weights():
    online = TableQ([[0.0, 1.0], [5.0, 3.0], [2.0, 4.0]])
    loss_fn = ApexLoss(online, gamma=0.5, target_update_period=1000)
    loss_fn.target.table.data = torch.tensor([[0.0, 0.0], [10.0, 20.0], [30.0, 40.0]])
    columns = [transition(0, 1, 1, [1.0, 1.0, 1.0], [False] * 3, [True] * 3, 1.0),   # bootstraps from s=1
               transition(2, 0, 0, [2.0, 0.0, 0.0], [True, False, False], [True] * 3, 0.5),  # terminal
               transition(1, 1, 2, [1.0, 0.0, 0.0], [False] * 3, [True, False, False], 0.25)]  # cut at T
    batch = {k: torch.tensor([c[k] for c in columns]).movedim(0, 1) for k in columns[0]}
    out = online(batch["obs"])
    loss, metrics = loss_fn(batch, out)
    # Slow transcription: the online net picks argmax_a Q(s', a), the target net values it.
    targets = [1 + 0.5 + 0.25 + 0.125 * 10.0,     # s'=1: online argmax 0 -> target 10 (plain max would be 20)
               2.0,                               # terminal after one step
               1 + 0.5 * 40.0]                    # one valid step, s'=2: online argmax 1 -> target 40
    q_taken = [1.0, 2.0, 3.0]
    td = [t - q for t, q in zip(targets, q_taken)]
    huber = [0.5 * d * d if abs(d) <= 1 else abs(d) - 0.5 for d in td]
    assert loss.item() == pytest.approx(np.mean([w * h for w, h in zip([1.0, 0.5, 0.25], huber)]))
    assert metrics["priorities"].tolist() == pytest.approx([abs(d) for d in td])
    loss.backward()
    assert loss_fn.target.table.grad is None                                       # no gradient into the target


def test_target_network_syncs_every_period_and_its_state_round_trips():
    model = TableQ([[1.0, 2.0]])
    loss_fn = ApexLoss(model, gamma=0.9, target_update_period=3)
    batch = {"obs": torch.zeros(2, 1, 1), "action": torch.zeros(1, 1, dtype=torch.long),
             "reward": torch.zeros(3, 1), "done": torch.zeros(3, 1, dtype=torch.bool), "trunc_value": torch.zeros(3, 1),
             "valid": torch.ones(3, 1, dtype=torch.bool), "weight": torch.ones(1, 1)}
    for call in range(1, 7):
        model.table.data += 1.0
        loss_fn(batch, model(batch["obs"]))
        synced = torch.equal(loss_fn.target.table, model.table)
        assert synced == (call % 3 == 0), call
    twin = ApexLoss(TableQ([[0.0, 0.0]]), gamma=0.9, target_update_period=3)
    twin.load_state_dict(copy.deepcopy(loss_fn.state_dict()))
    assert twin.calls == 6 and torch.equal(twin.target.table, loss_fn.target.table)


# ------------------------------------------------------------------ the transition replay

T = 4
LAYOUT = trajectory_layout(APEX, T, (2,), "float32", 2, 8)


def trajectory(tag: int, done_at: int | None = None) -> dict:
    data = {name: np.zeros(shape, dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
    data["obs"][:] = tag * 100 + np.arange(T + 1)[:, None]          # obs[t] = (100 tag + t, same)
    data["reward"][:] = tag * 10 + np.arange(T)
    data["action"][:] = np.arange(T) % 2
    if done_at is not None:
        data["done"][done_at] = True
    data["priority"][:] = np.arange(1, T + 1)
    return data


@pytest.mark.parametrize("compress", [False, True])
def test_transition_batches_read_windows_and_bootstrap_observations(compress):
    spec = parse_replay_parameters('[{"type": "prioritized", "capacity": 3, "sample_ratio": 1, "alpha": 1.0}]')[0]
    replay = build_replay(spec, LAYOUT, 8, 1, compress=compress, n_step=3)
    for tag in range(3):
        replay.add(trajectory(tag, done_at=1 if tag == 1 else None), version=tag)
    data, versions, keys, probabilities = replay.sample(64, np.random.default_rng(0))
    positions, steps = np.divmod(keys.positions, T)
    assert data["obs"].shape == (2, 64, 2) and data["reward"].shape == (3, 64) and data["weight"].shape == (1, 64)
    for b, (p, t) in enumerate(zip(positions, steps)):
        assert data["obs"][0, b, 0] == 100 * p + t and data["obs"][1, b, 0] == 100 * p + min(t + 3, T)
        assert data["action"][0, b] == t % 2 and versions[b] == p
        for i in range(3):
            valid = t + i < T
            assert data["valid"][i, b] == valid
            assert data["reward"][i, b] == (10 * p + t + i if valid else 0)
            assert data["done"][i, b] == (valid and p == 1 and t + i == 1)
    # Priorities 1..T per trajectory with alpha 1: step t is drawn with probability (t+1)/30.
    assert np.allclose(probabilities, (steps + 1) / 30.0)
    assert float(data["weight"].max()) == pytest.approx(1.0) and bool((data["weight"] > 0).all())


def test_an_update_after_the_trajectory_was_evicted_is_dropped():
    spec = parse_replay_parameters('[{"type": "prioritized", "capacity": 2, "sample_ratio": 1}]')[0]
    replay = build_replay(spec, LAYOUT, 4, 1, n_step=2)
    replay.add(trajectory(0), 0)
    replay.add(trajectory(1), 1)
    _, _, keys, _ = replay.sample(8, np.random.default_rng(1))
    replay.add(trajectory(2), 2)                                     # evicts position 0, the oldest
    applied = replay.update(keys, np.full(8, 50.0))
    in_position_1 = int(np.count_nonzero(keys.positions // T == 1))
    assert applied == in_position_1 and replay.stale_updates == 8 - in_position_1
    tree = replay.sampler.priorities[: 2 * T].numpy()
    assert np.allclose(tree[:T], (np.arange(1, T + 1) + 1e-6) ** 0.6)          # the newcomer keeps its own
    updated = np.unique(keys.positions[keys.positions // T == 1])
    assert np.allclose(tree[updated], (50.0 + 1e-6) ** 0.6)


def test_mixer_paces_transition_batches_by_the_replay_ratio():
    spec = parse_replay_parameters('[{"type": "prioritized", "capacity": 10, "sample_ratio": 1}]')[0]
    replay = build_replay(spec, LAYOUT, 8, 1, n_step=3)
    mixer = ReplayMixer([replay], [8], fill_in_factor=0.1, seed=0, replay_ratio=2.0)
    assert mixer.fill_targets == [8]                 # 10 trajectories x 4 transitions x 0.1 -> 4, at least a batch
    mixer.add(trajectory(0), 0)
    assert not mixer.ready()                         # 4 transitions stored, a batch needs 8
    mixer.add(trajectory(1), 0)
    batches = 0
    while mixer.ready():
        mixer.sample()
        batches += 1
    assert batches == 2                              # 8 new transitions x ratio 2 / batch 8
    assert json.dumps(mixer.state_dict()["credit"]) == "0"
