"""SharedWeights: a pull never mixes two publishes, and a reader killed mid-pull cannot
stall the learner (the defect of a shared lock: a SIGKILLed actor left it taken), nor keep
a fresh reader from a whole publish."""
import multiprocessing
import os
import signal
import threading

import numpy as np
import pytest
import torch

from herd_testing import wait_for
from herd.weights import PublisherGone, SharedWeights

SIZE = 2_000_000   # floats: big enough that a copy takes milliseconds, so readers overlap publishes


def uniform_model(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(SIZE // 2, 2, bias=False)
    torch.nn.init.constant_(model.weight, value)
    return model


def read_many(weights: SharedWeights, count: int, torn, started) -> None:
    """Pulls `count` snapshots; counts those that are not one publish's constant."""
    started.release()
    for _ in range(count):
        vector, version = weights.snapshot()
        if not bool((vector == vector[0]).all()) or (version > 0 and float(vector[0]) != float(version)):
            torn.value += 1


def read_forever(weights: SharedWeights, pulls) -> None:
    while True:
        weights.snapshot()
        pulls.value += 1


def read_once(weights: SharedWeights, seen) -> None:
    """seen: the version pulled when every weight is that publish's value (1.0), else -1."""
    vector, version = weights.snapshot()
    seen.value = version if bool((vector == 1.0).all()) else -1


def test_pulls_are_never_torn_while_publishing():
    context = multiprocessing.get_context("spawn")
    models = [uniform_model(float(v)) for v in (1, 2)]
    weights = SharedWeights(models[0], context)
    torn = context.Value("i", 0)
    started = context.Semaphore(0)
    readers = [context.Process(target=read_many, args=(weights, 60, torn, started)) for _ in range(2)]
    for reader in readers:
        reader.start()
    # Publishing starts once both readers run: a busy publisher would only slow their start-up.
    for _ in readers:
        assert started.acquire(timeout=60), "a reader never started"
    version = 0
    while any(reader.is_alive() for reader in readers):
        version += 1
        model = models[version % 2]
        torch.nn.init.constant_(model.weight, float(version))   # the version is the value: checkable
        weights.publish(model, version=version)
    for reader in readers:
        reader.join()
        assert reader.exitcode == 0
    assert version > 10, "the readers finished before the publishes overlapped them"
    assert torn.value == 0


def test_a_reader_killed_mid_pull_does_not_block_publish():
    context = multiprocessing.get_context("spawn")
    model = uniform_model(1.0)
    weights = SharedWeights(model, context)
    pulls = context.Value("i", 0)
    reader = context.Process(target=read_forever, args=(weights, pulls))
    reader.start()
    # Killed once it is pulling back to back (copying most of the time), not at a fixed delay.
    assert wait_for(lambda: pulls.value >= 20, 60), "the reader never started pulling"
    os.kill(reader.pid, signal.SIGKILL)
    reader.join()
    published = threading.Event()
    thread = threading.Thread(target=lambda: (weights.publish(model), published.set()), daemon=True)
    thread.start()
    assert published.wait(10.0), "publish is stuck behind a dead reader"
    vector, version = weights.snapshot()
    assert version == 1 and bool((vector == 1.0).all())
    # A reader started after the kill (a replacement actor) pulls that publish, whole.
    seen = context.Value("q", -2)
    fresh = context.Process(target=read_once, args=(weights, seen))
    fresh.start()
    fresh.join(60)
    assert fresh.exitcode == 0 and seen.value == 1, (fresh.exitcode, seen.value)


def publish_and_die(weights: SharedWeights, inside: str) -> None:
    """Killed (kill -9) inside a write: a publish's copy, or a CPU learner's optimizer step
    on adopted parameters (writing()). Either way the sequence stays odd."""
    if inside == "step":
        with weights.writing():
            os.kill(os.getpid(), signal.SIGKILL)
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    torch.Tensor.copy_ = killed         # this process only: it exists for this
    weights.publish(uniform_model(2.0))


@pytest.mark.parametrize("inside", ["copy", "step"])
def test_a_reader_gives_up_at_once_on_a_publisher_killed_mid_write(inside):
    """Catches a reader spinning on (an orphaned actor burning a core, an evaluator that
    outlives its killed learner) after the learner died inside a write and left the
    sequence odd: the reader asks whether the writer lives, and well before the deadline
    for a writer that hangs (PUBLISH_DEADLINE_S, 30 s) it raises PublisherGone."""
    context = multiprocessing.get_context("spawn")
    weights = SharedWeights(uniform_model(1.0), context)
    publisher = context.Process(target=publish_and_die, args=(weights, inside))
    publisher.start()
    publisher.join(60)
    assert publisher.exitcode == -signal.SIGKILL
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(catch(weights.snapshot)), daemon=True)
    thread.start()
    thread.join(5.0)
    assert outcome and isinstance(outcome[0], PublisherGone), outcome   # not still spinning
    assert f"(pid {publisher.pid}) died inside a publish" in str(outcome[0])


def test_a_reader_gives_up_on_a_live_publisher_stuck_mid_write(monkeypatch):
    """A writer that lives but never finishes its write (a hang) is not reported gone: the
    reader waits PUBLISH_DEADLINE_S and ends with an error saying so."""
    import herd.weights
    monkeypatch.setattr(herd.weights, "PUBLISH_DEADLINE_S", 1.0)
    weights = SharedWeights(uniform_model(1.0), multiprocessing.get_context("spawn"))
    with weights.writing():             # this process: the writer, alive
        outcome = catch(weights.snapshot)
    assert type(outcome) is RuntimeError and "stopped inside a publish" in str(outcome), outcome


def catch(function):
    try:
        return function()
    except Exception as err:
        return err


def test_the_publisher_writes_the_weights_of_each_version_it_is_given():
    """The learner publishes through herd/learner/publisher.py (on a CPU learner in place,
    on a GPU from a pinned copy in a thread): the store holds exactly the model's current
    parameters under the version given. Catches a publisher that copies the parameters in
    the wrong order, misses one, or writes a stale copy."""
    import torch

    from herd.learner.publisher import WeightPublisher
    from herd.models import build_model
    from herd.weights import SharedWeights

    torch.manual_seed(0)
    model = build_model("mlp", (4,), "float32", 2, 8, hidden_sizes=(16,))
    store = SharedWeights(model)
    publish = WeightPublisher(model, store.publish_vector)
    for version in (3, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        publish(version)
        twin = build_model("mlp", (4,), "float32", 2, 8, hidden_sizes=(16,))
        assert store.pull(twin, have_version=0) == version
        for a, b in zip(model.parameters(), twin.parameters()):
            assert torch.equal(a, b)
    publish.close()


def test_a_cpu_learner_publishes_its_parameters_straight_into_shared_memory(monkeypatch):
    """One copy of each weight per publish, by numpy in the publishing thread: catches a
    publisher that joins the parameters into one vector first (aten::cat, a second copy of
    every weight, the largest host cost per update of a CPU learner's loop:
    benchmarks/learner_loop.py), and one that copies with torch, whose intra-op threads wait
    for each other when the actors keep the other cores busy (herd/weights.py)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from herd.learner.publisher import WeightPublisher
    from herd.models import build_model
    from herd.weights import SharedWeights

    model = build_model("mlp", (4,), "float32", 2, 8, hidden_sizes=(16,))
    store = SharedWeights(model)
    publish = WeightPublisher(model, store.publish_vector)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    copied, copyto = [], np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, src, **kw: (copied.append(src.size), copyto(dst, src, **kw)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        publish(5)
    ops = {event.key: event.count for event in prof.key_averages()}
    assert not {"aten::cat", "aten::copy_", "aten::_foreach_copy_"} & set(ops), sorted(ops)
    assert copied == [p.numel() for p in model.parameters()]         # each weight once, whole
    assert torch.equal(store.flat, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    publish.close()


def write_in_halves(params: list[torch.Tensor], value: float, guard) -> None:
    """An in-place write of every weight in two halves with a pause between (as an
    optimizer step that a reader's copy overlaps), inside guard()."""
    flat = params[0]
    half = flat.shape[0] // 2
    with guard(), torch.no_grad():
        flat[:half].fill_(value)
        threading.Event().wait(0.005)
        flat[half:].fill_(value)


def read_until(weights: SharedWeights, stop, torn, reads) -> None:
    """Snapshots until stop is set; counts those that are not one write's constant."""
    while not stop.is_set():
        vector, _ = weights.snapshot()
        reads.value += 1
        if not bool((vector == vector[0]).all()):
            torn.value += 1


def torn_reads_of_adopted_writes(guarded: bool) -> tuple[int, int]:
    import contextlib
    context = multiprocessing.get_context("spawn")
    model = uniform_model(0.0)
    weights = SharedWeights(model, context)
    assert weights.adopt(model)
    stop, torn, reads = context.Event(), context.Value("i", 0), context.Value("i", 0)
    reader = context.Process(target=read_until, args=(weights, stop, torn, reads))
    reader.start()
    assert wait_for(lambda: reads.value >= 5, 60), "the reader never started"
    params = [p.view(-1) for p in model.parameters()]
    for step in range(1, 80):
        write_in_halves(params, float(step), weights.writing if guarded else contextlib.nullcontext)
    stop.set()
    reader.join(60)
    assert reader.exitcode == 0
    return torn.value, reads.value


def test_adopted_parameters_written_in_place_are_never_read_torn():
    """A CPU learner's optimizer writes its weights where the actors read them (adopted):
    inside writing() no reader keeps a copy that mixes two steps; without it (the negative
    control) readers do see half-written weights."""
    torn, reads = torn_reads_of_adopted_writes(guarded=True)
    assert torn == 0 and reads > 5
    torn, reads = torn_reads_of_adopted_writes(guarded=False)
    assert torn > 0, reads


def test_an_adopted_model_is_published_without_a_copy(monkeypatch):
    """adopt() makes the parameters views of the shared vector with their values kept; a
    publish then copies nothing (neither numpy nor torch) and only moves the version, and a
    reader pulls the weights as the learner last wrote them. A model of another kind
    (float64 parameters) is not adopted and keeps its own memory."""
    from torch.profiler import ProfilerActivity, profile

    from herd.learner.publisher import WeightPublisher
    from herd.models import build_model

    torch.manual_seed(0)
    model = build_model("mlp", (4,), "float32", 2, 8, hidden_sizes=(16,))
    before = [p.detach().clone() for p in model.parameters()]
    store = SharedWeights(model)
    assert store.adopt(model)
    start, end = store.flat.data_ptr(), store.flat.data_ptr() + store.flat.numel() * 4
    assert all(start <= p.data_ptr() < end for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    publish = WeightPublisher(model, store.publish_adopted)
    with store.writing(), torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0).add_(1.0)
    copied = []
    monkeypatch.setattr(np, "copyto", lambda *args, **kw: copied.append(1))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        publish(7)
    ops = {event.key for event in prof.key_averages()}
    assert not copied and not {"aten::cat", "aten::copy_", "aten::_foreach_copy_"} & ops, sorted(ops)
    twin = build_model("mlp", (4,), "float32", 2, 8, hidden_sizes=(16,))
    assert store.pull(twin, have_version=0) == 7
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    publish.close()

    other = torch.nn.Linear(3, 2).double()
    other_store = SharedWeights(other)
    own = other.weight.data_ptr()
    assert not other_store.adopt(other) and not other_store.adopted
    assert other.weight.data_ptr() == own
    try:
        other_store.publish_adopted(None, 1)
    except RuntimeError as err:
        assert "no parameters were adopted" in str(err)
    else:
        raise AssertionError("publish_adopted without adopted parameters must refuse")
