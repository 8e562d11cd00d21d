"""Errors that several layers raise, in one leaf module (it imports nothing of herd), so
that moving code between layers never opens an import loop.

A `UserError` is bad input: the CLI prints its message as one line and exits 2, before
anything is written. The others end a run that had started."""
from __future__ import annotations


class UserError(ValueError):
    """Bad input a user can fix; the message is one line that says what and how."""


class ConfigError(UserError):
    """A bad option or option value."""


class EnvError(UserError):
    """An environment herd cannot run, or bad preprocessing options."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used (missing, corrupt, from another env or network)."""


class ActorFailure(RuntimeError):
    """Actors (or the inference server that serves them) keep dying: the run cannot go on."""


class TrainingDiverged(RuntimeError):
    """Too many non-finite losses in a row."""


class PublishFailed(RuntimeError):
    """The learner's weights could not be handed to the actors (the publisher thread or the
    store it writes raised): going on would leave the actors acting on frozen weights."""


class SaveFailed(RuntimeError):
    """A checkpoint could not be written (a full disk, a vanished folder); the previous one is kept."""


class LearnerFailure(RuntimeError):
    """With several learners: one died or stopped answering, so the others cannot go on."""


class ReplayLost(RuntimeError):
    """The replay server (the Ray backend's --replay_server) died or stopped answering:
    the run cannot go on, and the replay it held cannot be saved."""
