"""Ape-X (Horgan et al. 2018): distributed prioritized experience replay with n-step
double Q-learning on a dueling network (see herd/algos/base.py for what a builder
supplies).

Actors. Actor i of N acts epsilon-greedily with epsilon_i = eps^(1 + alpha * i / (N - 1))
(eps 0.4, alpha 7: actor 0 explores most, actor N-1 least; a single actor uses eps). Each
step records Q(s_t, a_t) and max_a Q(s_t, a) from the same forward pass; when a rollout is
complete the actor values its bootstrap observation obs[T] once more and computes every
step's initial priority |n-step target - Q(s_t, a_t)| with its own network
(herd/ops/returns.py: trajectory_priorities). The last n-1 steps of a trajectory bootstrap
from obs[T] after T - t steps instead of n: the trajectory is all the actor holds, and the
learner's replay cuts its windows in exactly the same place.

Learner. The prioritized replay (herd/replay/transitions.py) samples transitions; the loss
(herd/losses/dqn.py) is the importance-weighted Huber loss of the n-step double-Q target
with a target network synced every --target_update_period updates."""
from __future__ import annotations

from typing import Sequence

import torch

from herd.algos.base import describe_optimization as optimizer_and_schedule
from herd.algos.base import one_step_per_batch
from herd.losses.dqn import ApexLoss
from herd.ops.returns import trajectory_priorities
from herd.trajectory import Field


def actor_epsilon(actor_id: int, num_actors: int, epsilon: float, alpha: float) -> float:
    """Ape-X's per-actor exploration: eps^(1 + alpha * i / (N - 1))."""
    if num_actors <= 1:
        return epsilon
    return epsilon ** (1.0 + alpha * actor_id / (num_actors - 1))


class Apex:
    name = "apex"
    metric_names = ("loss", "td_error", "q_mean", "mean_weight")
    replay_types = ("prioritized",)
    inference_server = False        # actors need their own network for the initial priorities
    capturable_loss = False         # the target network syncs on a host-side count of calls
    reuse = staticmethod(one_step_per_batch)
    model_options = {"head": "dueling_q"}
    action_kinds = ("discrete",)    # Q-learning over an enumerable action set

    @staticmethod
    def step_fields(num_actions: int, feature_size: int, action_distribution: str = "categorical"
                    ) -> dict[str, Field]:
        if action_distribution != "categorical":
            raise ValueError("Ape-X acts in discrete action spaces only")
        return {
            "q_taken": Field((), "float32", float("nan")),     # [T] Q(s_t, a_t) of the acting network
            "q_max": Field((), "float32", float("nan")),       # [T] max_a Q(s_t, a)
            "priority": Field((), "float32", float("nan")),    # [T] initial priority, set when the rollout ends
        }

    @staticmethod
    def read_fields(replay_types: Sequence[str], action_distribution: str = "categorical") -> tuple[str, ...]:
        """All three: the initial priorities come from q_taken and q_max, the prioritized
        replay reads the priority."""
        return ("q_taken", "q_max", "priority")

    @staticmethod
    def act(out, generator: torch.Generator, epsilon: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Epsilon-greedy on the Q values (out.logits over [1, n, A])."""
        q = out.logits[0]                                                       # [n, A]
        n, num_actions = q.shape
        actions = q.argmax(dim=-1)
        if epsilon > 0:
            explore = torch.rand(n, generator=generator) < epsilon
            random = torch.randint(num_actions, (n,), generator=generator)
            actions = torch.where(explore, random, actions)
        q_taken = q.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return actions, {"q_taken": q_taken, "q_max": q.max(dim=-1).values}

    @staticmethod
    def actor_options(cfg) -> dict:
        """What every actor needs from the config (it travels in the ActorSpec)."""
        return {"epsilon": cfg.train.apex_epsilon, "alpha": cfg.train.apex_alpha, "gamma": cfg.train.gamma,
                "n_step": cfg.train.n_step}

    @staticmethod
    def act_kwargs(actor_id: int, num_actors: int, options: dict) -> dict:
        return {"epsilon": actor_epsilon(actor_id, num_actors, options["epsilon"], options["alpha"])}

    @staticmethod
    def test_act_kwargs(cfg) -> dict:
        """herd test plays greedily unless --apex_test_epsilon says otherwise."""
        return {"epsilon": cfg.test.apex_test_epsilon}

    @staticmethod
    def least_exploring_actor(num_actors: int) -> int:
        return num_actors - 1

    @staticmethod
    def finish_rollout(views: dict, model: torch.nn.Module, options: dict) -> None:
        """Fills the slot's priority field [T, E] from the actor's own Q estimates."""
        T = views["q_taken"].shape[0]
        with torch.no_grad():
            bootstrap_q = model(torch.from_numpy(views["obs"][T:T + 1])).value[0]          # [E] max_a Q(obs[T])
        fields = {name: torch.from_numpy(views[name]) for name in ("q_taken", "q_max", "reward", "done",
                                                                     "trunc_value")}
        priorities = trajectory_priorities(fields["q_taken"], fields["q_max"], bootstrap_q, fields["reward"],
                                           fields["done"], fields["trunc_value"], options["gamma"],
                                           options["n_step"])
        views["priority"][:] = priorities.numpy()

    @staticmethod
    def build_loss(cfg, model: torch.nn.Module) -> ApexLoss:
        return ApexLoss(model, gamma=cfg.train.gamma, target_update_period=cfg.train.target_update_period)

    @staticmethod
    def describe_optimization(cfg) -> dict:
        t = cfg.train
        return {**optimizer_and_schedule(cfg), "n_step": t.n_step, "target_update_period": t.target_update_period,
                "epsilon": f"{t.apex_epsilon:g}^(1 + {t.apex_alpha:g} i / (N - 1))"}


APEX = Apex()
