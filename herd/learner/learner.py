"""The learner step: batch -> model -> the algorithm's loss -> clipped gradient ->
optimizer and learning-rate step. Publishing weights and pacing live in the backend.

An update makes no host read (docs/learner-speed.md): the loss's metrics stay on the device,
summed by the update itself into the learner's MetricSums (herd/learner/step_metrics.py),
whether the update is applied is a device flag
(a non-finite loss, gradient norm or resulting weight skips it, changing no weight and no
optimizer or schedule state: herd/learner/optim.py), and the learning rate is a device
tensor. So on a GPU the whole update can be captured once as a CUDA graph and replayed
(`capture`), one launch instead of hundreds; on a CPU the same code runs eagerly."""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, ContextManager, NamedTuple

import numpy as np
import torch

from herd.learner.reuse import Reuse, take_columns
from herd.learner.step_metrics import MetricSums
from herd.learner.optim import build_optimizer, build_scheduler  # noqa: F401  (re-exported: callers build both here)
from herd.losses.base import as_loss
from herd.models import ModelOutput
from herd.models.core import core_input_from_batch
from herd.store import Gather

log = logging.getLogger("herd")

# The metrics the learner adds to the loss's own (train.csv, TensorBoard).
LEARNER_METRICS = ("grad_norm", "lr")
# Eager updates before a capture: the optimizer's state, cudnn's algorithm choice and the
# allocator settle first (PyTorch's whole-network capture recipe warms up on a side stream).
CAPTURE_WARMUP = 3


def to_tensors(batch: dict[str, np.ndarray], replayed: np.ndarray, device: torch.device,
               pin: bool = False) -> dict[str, torch.Tensor]:
    """numpy batch (field -> [time, B, ...]) to torch on the learner device; with `pin`,
    through pinned memory with a non-blocking copy (GPU learners). Fields already in
    device tensors (replays in device memory) stay where they are; host tensors (a host
    replay's transition batches) travel as numpy arrays do. The observations of a batch the
    on-policy queue lent (herd/replay/mixer.py) are a view strided in time: on a CPU they
    stay one, read in place by the model (herd/models/base.py frames_of). A batch a device
    store lent (herd/store.py Gather) stays to be gathered by the step, the replayed flags
    beside it."""
    if isinstance(batch, Gather):
        return batch.with_columns(replayed=torch.from_numpy(replayed).to(device, non_blocking=pin))
    arrays = {**batch, "replayed": replayed}
    tensors = {}
    for name, array in arrays.items():
        if isinstance(array, torch.Tensor) and array.device.type != "cpu":
            tensors[name] = array.to(device, non_blocking=True)
            continue
        if isinstance(array, torch.Tensor):
            tensor = array
        elif name == "obs" and not pin:
            tensor = torch.from_numpy(array)      # a view stays one: the model reads strided frames in place
        else:
            tensor = torch.from_numpy(np.ascontiguousarray(array))
        if pin:
            tensor = tensor.pin_memory()
        tensors[name] = tensor.to(device, non_blocking=pin)
    return tensors


class StepResult(NamedTuple):
    """What one update gives the session, all on the device (nothing read on the host)."""
    metrics: dict[str, torch.Tensor]        # 0-dim: the loss's, grad_norm, lr (the next update's), skipped
    priorities: torch.Tensor | None = None  # [B] new priorities for the replays (Ape-X's TD errors), or None
    stopped: bool = False                   # several learners: the group stopped, this update was not applied

    @classmethod
    def of(cls, metrics: dict) -> "StepResult":
        """From the update's metrics, where the loss put its priorities and the group sync
        its stop."""
        metrics = dict(metrics)
        return cls(metrics, metrics.pop("priorities", None), bool(metrics.pop("stopped", False)))


class Learner:
    def __init__(self, model: torch.nn.Module, optimizer, scheduler, loss_fn, grad_clip_norm: float,
                 precision: str = "fp32", compile_model: bool = False, grad_sync=None, capture: bool = False,
                 reuse: Reuse | None = None, metric_names: tuple[str, ...] = ()):
        """loss_fn(batch, out) -> (scalar loss, metrics): the algorithm's (herd/algos), a
        herd.losses.base.Loss or a plain function (wrapped);
        metrics are detached 0-dim tensors, and "priorities" [B] a tensor for the replays.
        optimizer, scheduler: herd/learner/optim.py's (a guarded step and a device
        learning rate). precision "bf16": the forward pass runs under bfloat16 autocast
        (the backward follows it); parameters, optimizer state and the loss stay float32.
        compile_model: the training forward pass goes through torch.compile (compiled at
        the first update; `model` itself stays a plain module, so checkpoints, weight
        publishing and elite scoring see the usual parameter names).
        grad_sync(): with several learners, averages the gradients in place across them
        (herd.learner.distributed.GroupSync.exchange); False means the learners stopped
        and this update must not be applied. None: one learner.
        capture: on a CUDA device, capture the whole update as one CUDA graph after
        CAPTURE_WARMUP eager updates (one learner, fixed batch shapes); if capturing
        fails the learner goes on eagerly and says so in the log.
        metric_names: the loss's metrics that each update adds, with LEARNER_METRICS, to
        self.metric_sums, on the device and inside the captured graph; the session reads
        the sums once per log interval."""
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"unknown learner precision '{precision}' (use fp32 or bf16)")
        self.model = model
        self.bf16 = precision == "bf16"
        self.device = next(model.parameters()).device
        self.device_type = self.device.type
        self.forward = torch.compile(model) if compile_model else model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = as_loss(loss_fn)
        self.grad_clip_norm = grad_clip_norm
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.grad_sync = grad_sync
        self.capture = capture and self.device_type == "cuda" and grad_sync is None
        self.graph = None           # torch.cuda.CUDAGraph once captured
        self.static_batch: dict[str, torch.Tensor] | None = None
        self.static_metrics: dict[str, torch.Tensor] | None = None
        self.eager_updates = 0
        self.reuse = reuse
        self.metric_sums = MetricSums((*metric_names, *LEARNER_METRICS), self.device)
        # What every in-place write of the parameters runs inside: nothing, unless readers
        # in other processes share them (write_weights_within).
        self.weight_writes: Callable[[], ContextManager] = contextlib.nullcontext

    def write_weights_within(self, writing: Callable[[], ContextManager]) -> None:
        """The parameters are shared with readers in other processes (a CPU learner's, in
        herd/weights.py SharedWeights, adopted): every optimizer step runs inside
        writing(), so that a reader copies again when a step overlapped its copy."""
        self.weight_writes = writing

    def run_model(self, obs: torch.Tensor, core=None):
        """The training forward pass; a torch.compile that fails (no C compiler, an
        unsupported op) falls back to the plain model once, with a warning. core: the
        batch's CoreInput for a recurrent model (herd/models/core.py), else None."""
        args = (obs,) if core is None else (obs, core)
        if self.forward is self.model:
            return self.model(*args)
        try:
            return self.forward(*args)
        except Exception as err:  # torch._dynamo / inductor raise many types
            log.warning("torch.compile failed (%s: %s): the learner runs uncompiled", type(err).__name__,
                        str(err).splitlines()[0][:200] if str(err) else "")
            self.forward = self.model
            return self.model(*args)

    def step(self, batch: dict[str, torch.Tensor] | Gather) -> StepResult:
        """One update. batch["obs"] is [T+1, B, ...] (or a Gather, read by the step).
        Returns its StepResult, no host read: the metrics as 0-dim device tensors
        (skipped is 1.0 when the update was not applied: a non-finite loss, gradient or
        resulting weight), the priorities where the loss gives them, and whether a group
        of learners stopped. On a captured step the tensors are the graph's outputs: read
        them before the next step overwrites them (the update has already added them to
        self.metric_sums)."""
        if self.reuse is None:
            return self.counted(StepResult.of(self.step_once(batch)))
        self.loss_fn.begin_batch()          # host side: the target's first sync, outside any graph
        metrics = self.step_once(batch)
        self.loss_fn.end_batch()            # host side: the periodic target sync
        return self.counted(StepResult.of(metrics))

    def counted(self, result: StepResult) -> StepResult:
        """The host's part of the metric sums for an update that ran (update() summed its
        metrics on the device)."""
        if not result.stopped:
            self.metric_sums.counted()
        return result

    def step_once(self, batch: dict[str, torch.Tensor] | Gather) -> dict:
        """One update, replayed from the captured graph where there is one. A batch still
        to be gathered (herd/store.py Gather) is gathered straight into the graph's static
        inputs; eager, into tensors of its own."""
        if self.graph is not None:
            if isinstance(batch, Gather):
                batch.into(self.static_batch)
            else:
                for name, tensor in self.static_batch.items():
                    tensor.copy_(batch[name], non_blocking=True)
            self.graph.replay()
            return self.static_metrics
        if isinstance(batch, Gather):
            batch = batch.read()
        if self.capture and self.eager_updates >= CAPTURE_WARMUP:
            captured = self.capture_update(batch)
            if captured is not None:
                return captured
        self.eager_updates += 1
        return self.update(batch)

    def update(self, batch: dict[str, torch.Tensor]) -> dict:
        """The update itself, the same code eager and captured: one gradient step on the
        batch, or with reuse a stored batch's passes of minibatch steps; the learning-rate
        schedule steps once either way."""
        if not self.model.training:
            self.model.train()          # once: walking the modules every update costs a tiny model 7 %
        if self.reuse is None:
            metrics, applied = self.gradient_step(batch)
        else:
            metrics, applied = self.reused_steps(batch)
        if "stopped" in metrics:
            return metrics                  # several learners: the group stopped, nothing applied
        self.scheduler.step(applied)
        metrics.update(lr=self.scheduler.lr.detach().clone(), skipped=(~applied).float())
        self.metric_sums.accumulate(metrics)
        return metrics

    def reused_steps(self, batch: dict[str, torch.Tensor]) -> tuple[dict, torch.Tensor]:
        """reuse.passes x reuse.minibatches gradient steps on one stored batch [T+1, B]:
        the metrics are their means; applied is True when at least one step was applied
        (a stored batch whose every step was skipped changed nothing)."""
        stored = self.loss_fn.prepare(batch)                              # + [T, B] targets, no grad
        B = batch["reward"].shape[1]
        size = self.reuse.minibatch_size(B)
        sums: dict[str, torch.Tensor] = {}
        applied_any = torch.zeros((), dtype=torch.bool, device=self.device)
        for order in self.reuse.column_orders(B, self.device):              # [B] per pass
            for start in range(0, B, size):
                metrics, applied = self.gradient_step(take_columns(stored, order[start:start + size]))
                if "stopped" in metrics:
                    return metrics, applied
                applied_any |= applied
                for name, value in metrics.items():
                    sums[name] = value if name not in sums else sums[name] + value
        return {name: total / self.reuse.steps for name, total in sums.items()}, applied_any

    def gradient_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict, torch.Tensor]:
        """Forward, loss, backward, clipping and the guarded optimizer step on one batch or
        minibatch. Returns (the loss's metrics and grad_norm, applied: a device bool)."""
        # autocast's weight-cast cache must be off under capture (it would hold tensors
        # from the capturing pass); eager, the cache changes nothing within one forward.
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False):
            # A recurrent model unrolls from each column's stored start state, reset after
            # every done flag (None for a feed-forward model).
            out = self.run_model(batch["obs"], core_input_from_batch(batch))   # logits [T+1, B, A]
        # The loss in float32; the features are left as they are (only elite scoring reads
        # them, from its own forward pass).
        out = out._replace(logits=out.logits.float(), value=out.value.float()) if isinstance(out, ModelOutput) else out
        loss, metrics = self.loss_fn(batch, out)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        loss_finite = torch.isfinite(loss.detach())
        if self.grad_sync is not None:
            # The others average our gradients into theirs: a non-finite loss must make
            # every learner skip this update, so its gradients are poisoned with NaN
            # (adding 0 where the loss is finite); the average is then NaN everywhere.
            grads = [p.grad for p in self.trainable if p.grad is not None]
            torch._foreach_add_(grads, torch.where(loss_finite, 0.0, float("nan")))
            if not self.grad_sync():
                self.optimizer.zero_grad(set_to_none=True)
                return {**metrics, "stopped": True}, loss_finite
        max_norm = self.grad_clip_norm if self.grad_clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, max_norm, foreach=True)
        ok = loss_finite & torch.isfinite(grad_norm)
        with self.weight_writes():
            applied = self.optimizer.step(ok, self.scheduler.lr)  # also False if a weight would overflow
        metrics["grad_norm"] = grad_norm.detach()
        return metrics, applied

    def capture_update(self, batch: dict[str, torch.Tensor]) -> dict | None:
        """Captures update() as one CUDA graph over static copies of this batch, replays it
        for this batch, and keeps it for the next ones; None (and eager from then on) if
        the capture fails: a loss with host-side logic, a shape that moves."""
        self.capture = False
        random_state = None
        try:
            self.static_batch = {name: tensor.clone() for name, tensor in batch.items()}
            # This batch's real update runs eagerly on a side stream (PyTorch's capture
            # recipe warms up there); the capture below records kernels without running them.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                metrics = self.update(self.static_batch)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            # A capture that fails midway leaves the device's random generator mid-capture,
            # and every later draw (the reuse shuffles) raises: its state is put back below.
            generator = torch.cuda.default_generators[torch.cuda.current_device()]
            random_state = generator.clone_state()
            # thread_local: the batch threads go on copying fresh trajectories to the device
            # (pageable copies, events) while this thread captures; in the default global
            # mode CUDA refuses those calls in every thread and the run fails (Pong on an
            # H200, tests/learner/test_capture_cuda.py).
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.static_metrics = self.update(self.static_batch)
            self.graph = graph
            steps = ("" if self.reuse is None else
                     f", {self.reuse.passes} passes x {self.reuse.minibatches} minibatch steps with the target "
                     "network's pass and the shuffles")
            log.info("learner: the whole update (forward, losses, backward, clipping, optimizer%s) is captured as "
                     "one CUDA graph", steps)
        except Exception as err:   # capture raises many types (host syncs, unsupported ops)
            if random_state is not None:
                generator.graphsafe_set_state(random_state)
            self.graph, self.static_batch, self.static_metrics = None, None, None
            log.warning("learner: CUDA graph capture failed (%s: %s): updates run eagerly", type(err).__name__,
                        str(err).splitlines()[0][:200] if str(err) else "")
            return None
        return metrics
