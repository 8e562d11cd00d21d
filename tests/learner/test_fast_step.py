"""The learner's update without host reads (docs/learner-speed.md), checked against the
step with host reads it replaced (benchmarks/reference_step.py).

Host reads are counted by benchmarks/op_counts.py: the Tensor methods through which a
device value reaches Python (float(), int(), bool(), .item(), .tolist(), .numpy()) and
the ops whose output shape depends on data (aten::nonzero, from a boolean-mask
selection). On a CPU they cost nothing, but they are the calls that stall a GPU, so the
count made here holds there."""
from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from herd.checkpoint import load_checkpoint
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.step_metrics import MetricSums
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model

# The old step and the op counter live beside the benchmark that compares the two steps.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from op_counts import count  # noqa: E402
from reference_step import ReferenceLearner, reference_impala_loss, reference_optimizer, reference_scheduler  # noqa: E402

T, A, OBS = 6, 4, (5,)
LOSS_NAMES = ("loss", "pg_loss", "value_loss", "entropy", "policy_cloning_loss", "value_cloning_loss",
              "kl_mask_fraction", "mean_rho")


def batches(n: int, B: int = 4, replayed: int = 0, seed: int = 0) -> list[dict]:
    """n batches [T(+1), B, ...]; the last `replayed` columns marked replayed (they carry
    stale behaviour logits, so CLEAR's terms and LASER's mask have work to do)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append({"obs": torch.randn(T + 1, B, *OBS, generator=g), "action": torch.randint(0, A, (T, B), generator=g),
                    "reward": torch.randn(T, B, generator=g), "done": torch.rand(T, B, generator=g) < 0.15,
                    "trunc_value": torch.zeros(T, B), "behaviour_logits": torch.randn(T, B, A, generator=g),
                    "behaviour_value": torch.randn(T, B, generator=g),
                    "replayed": torch.arange(B) >= B - replayed})
    return out


def model(seed: int = 0):
    torch.manual_seed(seed)
    return build_model("mlp", OBS, "float32", A, 8, hidden_sizes=(32,))


def fast(weights: ImpalaLossWeights, optimizer: str = "rmsprop", lr: float = 3e-3, lr_end: float = 1e-4) -> Learner:
    m = model()
    opt = build_optimizer(optimizer, m.parameters(), lr, 0.01)
    return Learner(m, opt, build_scheduler(opt, lr, lr_end, 40), functools.partial(impala_loss, weights=weights), 1.0,
                   metric_names=LOSS_NAMES)


def reference(weights: ImpalaLossWeights, optimizer: str = "rmsprop", lr: float = 3e-3,
              lr_end: float = 1e-4) -> ReferenceLearner:
    m = model()
    opt = reference_optimizer(optimizer, m.parameters(), lr, 0.01)
    return ReferenceLearner(m, opt, reference_scheduler(opt, lr, lr_end, 40),
                            functools.partial(reference_impala_loss, weights=weights), 1.0)


def host_reads(fn) -> int:
    return count(fn).host_reads


def train(learner, data, read_every: int = 0) -> None:
    """Updates on each batch; the learner sums their metrics, read every read_every updates."""
    for i, batch in enumerate(data, 1):
        learner.step(batch)
        if read_every and i % read_every == 0:
            learner.metric_sums.read()


WITH_REPLAY = ImpalaLossWeights(use_policy_cloning=True, use_value_cloning=True, use_kl_mask=True,
                                kl_div_threshold=0.5)


@pytest.mark.parametrize("weights,replayed", [(ImpalaLossWeights(), 0), (WITH_REPLAY, 2)],
                         ids=["on-policy", "replayed-columns-laser"])
def test_steady_state_updates_make_no_host_read(weights, replayed):
    """20 updates after a warm-up: not one host read, LASER and CLEAR on or off. Catches
    any float(), bool() or .item() of a device value, or a boolean-mask selection, that
    creeps back into the loss, the clipping, the skip decision or the optimizer."""
    learner = fast(weights)
    data = batches(22, replayed=replayed)
    train(learner, data[:2])                            # the optimizer's state is created here
    assert host_reads(lambda: train(learner, data[2:])) == 0


def test_metrics_are_read_once_per_logging_interval():
    """Over 20 updates with a log interval of 10: exactly 2 host reads, the intervals'."""
    learner = fast(WITH_REPLAY)
    data = batches(22, replayed=2)
    train(learner, data[:2])
    learner.metric_sums.read()
    assert host_reads(lambda: train(learner, data[2:], read_every=10)) == 2


def test_the_host_read_count_sees_a_single_item():
    """Negative control: the same 20 updates with one .item() in the loss are counted (20
    reads), so the zero above cannot come from a counter that sees nothing; and a
    boolean-mask selection (the old CLEAR terms) is counted too."""
    weights = ImpalaLossWeights()

    def loss_with_a_read(batch, out):
        loss, metrics = impala_loss(batch, out, weights)
        metrics["loss"].item()
        return loss, metrics

    m = model()
    opt = build_optimizer("rmsprop", m.parameters(), 1e-3, 0.01)
    learner = Learner(m, opt, build_scheduler(opt, 1e-3, 1e-4, 40), loss_with_a_read, 1.0)
    data = batches(22)
    train(learner, data[:2])
    assert host_reads(lambda: train(learner, data[2:])) == 20
    replayed = data[0]["replayed"]
    assert host_reads(lambda: data[0]["reward"][:, replayed]) == 1


def test_the_update_sums_its_own_metrics():
    """Each update adds its metrics to the learner's sums inside the update (so a CUDA
    graph of the update captures the sums too): the interval's means are the means of the
    metrics the updates returned, one count per update."""
    learner = fast(WITH_REPLAY)
    returned = []
    for batch in batches(6, replayed=2):
        metrics = learner.step(batch).metrics
        returned.append({name: float(metrics[name]) for name in (*LOSS_NAMES, "grad_norm", "lr")})
    assert learner.metric_sums.updates == 6
    means, skipped, _ = learner.metric_sums.read()
    assert skipped == 0
    for name in (*LOSS_NAMES, "grad_norm", "lr"):
        assert means[name] == pytest.approx(sum(r[name] for r in returned) / 6, rel=1e-6), name


def test_the_interval_means_are_the_means_of_the_updates():
    """train.csv gets the interval's means, not the last update's values."""
    sums = MetricSums(("loss",), torch.device("cpu"))
    for value, skipped in ((1.0, 0.0), (2.0, 0.0), (float("nan"), 1.0), (6.0, 0.0)):
        sums.add({"loss": torch.tensor(value), "skipped": torch.tensor(skipped)})
    means, skipped, longest = sums.read()
    assert means["loss"] == pytest.approx(3.0) and skipped == 1 and longest == 1
    for _ in range(3):
        sums.add({"loss": torch.tensor(float("inf")), "skipped": torch.tensor(1.0)})
    assert sums.latest_skip_run() == 3
    means, skipped, longest = sums.read()
    assert means["loss"] != means["loss"] and skipped == 3 and longest == 3       # NaN: no finite value


@pytest.mark.parametrize("optimizer,weights,replayed", [
    ("rmsprop", ImpalaLossWeights(), 0), ("rmsprop", WITH_REPLAY, 2),
    ("rmsprop", ImpalaLossWeights(use_kl_mask=True, kl_div_threshold=0.5), 0),
    ("rmsprop", ImpalaLossWeights(use_policy_cloning=True), 3), ("adam", WITH_REPLAY, 2)],
    ids=["plain", "clear-laser-replayed", "laser-only", "cloning-replayed", "adam-clear-laser-replayed"])
def test_fifty_updates_give_the_parameters_of_the_old_step(optimizer, weights, replayed):
    """fp32, 50 updates on the same batches from the same weights: the fast step (closed-form
    V-trace, torch.where cloning terms, guarded foreach optimizer, device learning rate)
    and the old one (herd 9aa5e12) agree within 1e-5 relative + 1e-6 absolute (float32
    rounding of a different order of operations, compounded over 50 updates)."""
    data = batches(50, replayed=replayed, seed=7)
    new, old = fast(weights, optimizer), reference(weights, optimizer)
    train(new, data)
    train(old, data)
    moved = 0.0
    for (name, a), b in zip(new.model.state_dict().items(), old.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, float((a - model().state_dict()[name]).abs().max()))
    assert moved > 1e-2                     # the updates did something
    assert float(new.scheduler.lr) == pytest.approx(old.optimizer.param_groups[0]["lr"], rel=1e-6)


class CallRecorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_the_optimizers_run_foreach_kernels():
    """The optimizers' arithmetic is called as foreach ops (one kernel for all parameters
    on a GPU), or for Adam on a CPU as aten's fused kernel, not as a Python loop of per-parameter addcdiv/addcmul/lerp as torch's
    single-tensor path runs. (Recorded at the Python level: on a CPU, aten itself runs a
    foreach op tensor by tensor, and the square roots are taken tensor by tensor into
    their buffers, herd/learner/optim.py _square_roots.)"""
    for name, foreach in (("rmsprop", {"_foreach_addcmul_", "_foreach_addcdiv_", "_foreach_div_"}),
                          ("adam", {"_foreach_mul_", "_foreach_add_", "_foreach_addcmul_", "_foreach_addcdiv_"}),
                          ("adam-fused", {"_fused_adam_"})):
        learner = fast(ImpalaLossWeights(), name.removesuffix("-fused"))
        if name.startswith("adam"):
            learner.optimizer.fused_on_cpu = name.endswith("-fused")   # else the foreach path, a GPU's
        data = batches(2)
        learner.step(data[0])
        with CallRecorder() as calls:
            learner.step(data[1])
        assert foreach <= calls.names, (name, sorted(calls.names))
        assert not calls.names & {"addcmul_", "addcdiv_", "lerp_", "addcmul", "addcdiv"}, name


@pytest.mark.parametrize("name", ["rmsprop", "adam"])
def test_the_optimizers_device_path_reads_nothing_on_the_host(name):
    """The foreach path (a GPU's) reads no tensor on the host (a device sync, and a CUDA
    graph capture of the update fails on it): a foreach op handed a 0-dim tensor where it
    takes a number reads it so (benchmarks/op_counts.py counts those reads too)."""
    learner = fast(ImpalaLossWeights(), name)
    if name == "adam":
        learner.optimizer.fused_on_cpu = False
    data = batches(2)
    learner.step(data[0])
    assert count(lambda: learner.step(data[1])).host_reads == 0


def test_a_checkpoint_written_before_the_device_step_resumes_its_optimizer_and_schedule():
    """tests/learner/data/ckpt_before_device_step.pt was written by herd 9aa5e12 (torch's
    RMSprop and LambdaLR; CartPole, 32 updates). Its optimizer and schedule load into the
    guarded optimizer and device schedule, and the next update equals the old step's next
    update from the same state. Catches a state format that no longer matches torch's."""
    state, _ = load_checkpoint(Path(__file__).parent / "data" / "ckpt_before_device_step.pt")
    config = state["config"]
    build = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2,
                 feature_size=config["feature_out_layer_size"], hidden_sizes=tuple(config["hidden_sizes"]))
    learners = []
    for make_opt, make_sched, cls, loss in ((build_optimizer, build_scheduler, Learner, impala_loss),
                                            (reference_optimizer, reference_scheduler, ReferenceLearner,
                                             reference_impala_loss)):
        m = build_model(**build)
        m.load_state_dict(state["model"])
        opt = make_opt(config["optimizer"], m.parameters(), config["lr"], config["rmsprop_eps"])
        sched = make_sched(opt, config["lr"], config["lr_end_value"], config["lr_scheduler_steps"])
        opt.load_state_dict(copy.deepcopy(state["optimizer"]))   # loading shares the tensors: one copy each
        sched.load_state_dict(state["scheduler"])
        learners.append(cls(m, opt, sched, functools.partial(loss, weights=ImpalaLossWeights(gamma=config["gamma"])),
                            config["gradient_clip_by_norm_threshold"]))
    new, old = learners
    assert new.scheduler.last_epoch == 32 and config["optimizer"] == "adam"
    assert float(new.scheduler.lr) == pytest.approx(old.optimizer.param_groups[0]["lr"], rel=1e-6)
    g = torch.Generator().manual_seed(0)
    B = 4
    batch = {"obs": torch.randn(T + 1, B, 4, generator=g), "action": torch.randint(0, 2, (T, B), generator=g),
             "reward": torch.ones(T, B), "done": torch.zeros(T, B, dtype=torch.bool), "trunc_value": torch.zeros(T, B),
             "behaviour_logits": torch.randn(T, B, 2, generator=g), "behaviour_value": torch.randn(T, B, generator=g),
             "replayed": torch.zeros(B, dtype=torch.bool)}
    new.step(batch)
    old.step(batch)
    for a, b in zip(new.model.parameters(), old.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert new.scheduler.last_epoch == 33


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_the_optimizer_state_goes_to_torch_and_back(optimizer):
    """herd's learner and the reference (torch's optimizers) train 5 updates alike, then
    swap optimizer states: torch's loads into herd's optimizer and herd's into torch's,
    and the next 5 updates still agree. Catches a state_dict that drops an entry, renames
    a hyperparameter or numbers the parameters differently (the moving averages would
    restart). A constant learning rate: herd's schedule is a device tensor, and a torch
    optimizer reads its rate from the param group."""
    data = batches(10, seed=3)
    new = fast(ImpalaLossWeights(), optimizer, lr_end=3e-3)
    old = reference(ImpalaLossWeights(), optimizer, lr_end=3e-3)
    train(new, data[:5])
    train(old, data[:5])
    herd_state, torch_state = copy.deepcopy(new.optimizer.state_dict()), copy.deepcopy(old.optimizer.state_dict())
    new.optimizer.load_state_dict(torch_state)
    old.optimizer.load_state_dict(herd_state)
    train(new, data[5:])
    train(old, data[5:])
    for a, b in zip(new.model.parameters(), old.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert set(herd_state["state"]) == set(torch_state["state"]) and len(herd_state["state"]) >= 8


def test_building_and_stepping_the_learner_does_not_import_torch_dynamo():
    """Importing torch._dynamo costs about as long as importing torch (2 s under load on 2
    cores), and every run's first update waited for it while torch.optim's methods
    imported it. Catches an optimizer (or anything on a CartPole learner's path) that
    brings it back."""
    code = ("import sys, functools, torch\n"
            "from herd.learner.learner import Learner, build_optimizer, build_scheduler\n"
            "from herd.losses.impala import ImpalaLossWeights, impala_loss\n"
            "from herd.models import build_model\n"
            "m = build_model('mlp', (5,), 'float32', 4, 8, hidden_sizes=(32,))\n"
            "for name in ('rmsprop', 'adam'):\n"
            "    opt = build_optimizer(name, m.parameters(), 1e-3, 0.01)\n"
            "    learner = Learner(m, opt, build_scheduler(opt, 1e-3, 1e-4, 40),\n"
            "                      functools.partial(impala_loss, weights=ImpalaLossWeights()), 1.0)\n"
            "    T, B = 6, 4\n"
            "    batch = {'obs': torch.randn(T + 1, B, 5), 'action': torch.randint(0, 4, (T, B)),\n"
            "             'reward': torch.randn(T, B), 'done': torch.zeros(T, B, dtype=torch.bool),\n"
            "             'trunc_value': torch.zeros(T, B), 'behaviour_logits': torch.randn(T, B, 4),\n"
            "             'behaviour_value': torch.randn(T, B), 'replayed': torch.zeros(B, dtype=torch.bool)}\n"
            "    learner.step(batch)\n"
            "    opt.load_state_dict(opt.state_dict())\n"
            "print('torch._dynamo' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
