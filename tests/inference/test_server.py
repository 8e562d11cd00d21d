"""The batched inference server: answers equal the local model's, sampling, request kinds,
weight updates, several client processes, stale answers, dead servers and dead clients.

Servers and clients are spawn processes, as in the local backend; every test stops and
reaps what it started, also when an assertion fails."""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
import torch
import torch.multiprocessing as mp

from herd_testing import peaked, wait_for
from herd.inference import MECHANISMS, InferenceChannels, InferenceClient, InferenceServerGone, run_inference_server
from herd.inference.channels import ANSWER_SEQ, REQUEST_SEQ, SERVER_PID
from herd.inference.server import BatchServer, sample_actions, serve_forever
from herd.models import build_model
from herd.weights import SharedWeights

MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=3, feature_size=None)
CNN = dict(network="nature_cnn", obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=6, feature_size=None)
FEATURES = {"mlp": 64, "nature_cnn": 512}   # the torso sizes (feature_size=None); for_model would probe them
CONTEXT = mp.get_context("spawn")


def observations(kwargs: dict, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kwargs["obs_dtype"] == "uint8":
        return rng.integers(0, 256, (n, *kwargs["obs_shape"]), dtype=np.uint8)
    return rng.standard_normal((n, *kwargs["obs_shape"])).astype(np.float32)


def channels_for(kwargs: dict, num_clients: int, max_rows: int, mechanism: str = "semaphore") -> InferenceChannels:
    return InferenceChannels(num_clients, max_rows, kwargs["obs_shape"], kwargs["obs_dtype"], kwargs["num_actions"],
                             FEATURES[kwargs["network"]], mechanism, CONTEXT)


def local_outputs(kwargs: dict, weights: SharedWeights, obs: np.ndarray, model=None):
    """The same network with the published weights, run here: [n, ...] logits, value, features."""
    model = (model or build_model(**kwargs)).eval()
    weights.pull(model, have_version=-1)
    with torch.no_grad():
        out = model(torch.from_numpy(obs).unsqueeze(0))
    return [t[0].numpy() for t in out]


@dataclass
class Served:
    channels: InferenceChannels
    weights: SharedWeights
    stop: object
    server: object
    kwargs: dict
    reference: torch.nn.Module     # a local model to compute expected outputs with
    children: list = field(default_factory=list)

    def client(self, index: int = 0, **kw) -> InferenceClient:
        return InferenceClient(self.channels, index, stop=self.stop, **kw)

    def spawn(self, target, *args):
        process = CONTEXT.Process(target=target, args=args, daemon=True)
        process.start()
        self.children.append(process)
        return process


def reap(processes, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.1, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(2.0)


@contextmanager
def serving(kwargs: dict = MLP, num_clients: int = 2, max_rows: int = 8, mechanism: str = "semaphore"):
    torch.manual_seed(0)
    channels = channels_for(kwargs, num_clients, max_rows, mechanism)
    model = build_model(**kwargs)
    weights = SharedWeights(model, CONTEXT)
    stop = CONTEXT.Event()
    server = CONTEXT.Process(target=run_inference_server, args=(channels, kwargs, weights, "cpu", stop), daemon=True)
    server.start()
    served = Served(channels, weights, stop, server, kwargs, model)
    try:
        yield served
    finally:
        stop.set()
        reap([server, *served.children])


@pytest.fixture(scope="module")
def shared_mlp_server():
    with serving(MLP, num_clients=3) as served:
        yield served


@pytest.fixture
def mlp_server(shared_mlp_server):
    """One MLP server for the tests that leave it running; they read whatever weights are
    published. The client processes a test starts are reaped after it, pass or fail."""
    yield shared_mlp_server
    reap(shared_mlp_server.children)
    shared_mlp_server.children.clear()


def assert_matches_local(step, kwargs, weights, obs, model=None):
    logits, value, features = local_outputs(kwargs, weights, obs, model)
    np.testing.assert_allclose(step.fields["behaviour_logits"], logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(step.fields["behaviour_value"], value, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(step.fields["features"], features, rtol=1e-5, atol=1e-5)
    assert step.actions.dtype == np.int64 and step.actions.shape == (len(obs),)
    assert ((0 <= step.actions) & (step.actions < kwargs["num_actions"])).all()
    assert step.version == weights.version


def test_act_equals_the_local_model(mlp_server):
    client = mlp_server.client()
    for n, seed in [(5, 1), (8, 2), (1, 3)]:
        obs = observations(MLP, n, seed)
        assert_matches_local(client.act(obs), MLP, mlp_server.weights, obs)


@contextmanager
def serving_in_a_thread(kwargs: dict, mechanism: str, num_clients: int = 2, max_rows: int = 8):
    """The server loop in a thread of this process: the doorbells wake threads as they wake
    processes, and no process start is paid (the process path is tested with the MLP, the
    benchmark runs every mechanism across processes). -> (channels, weights, reference model)"""
    channels = channels_for(kwargs, num_clients, max_rows, mechanism)
    model = build_model(**kwargs)
    weights = SharedWeights(model, CONTEXT)
    stop = threading.Event()
    server = threading.Thread(target=serve_forever, daemon=True,
                              args=(BatchServer(channels, kwargs, weights, torch.device("cpu")), channels, stop, 0.0))
    server.start()
    try:
        yield channels, weights, model
    finally:
        stop.set()
        server.join(5.0)
    assert not server.is_alive()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_every_mechanism_delivers_the_right_answers(mechanism):
    with serving_in_a_thread(MLP, mechanism) as (channels, weights, model):
        clients = [InferenceClient(channels, index) for index in range(2)]
        for n, seed in [(5, 1), (8, 2), (1, 3)]:
            for client in clients:
                obs = observations(MLP, n, seed + 10 * client.index)
                assert_matches_local(client.act(obs), MLP, weights, obs, model)


def test_frames_equal_the_local_model():
    with serving_in_a_thread(CNN, "semaphore", max_rows=6) as (channels, weights, model):
        obs = observations(CNN, 6, seed=4)
        assert_matches_local(InferenceClient(channels, 0).act(obs), CNN, weights, obs, model)


def test_value_requests(mlp_server):
    obs = observations(MLP, 7, seed=5)
    value = mlp_server.client().value(obs)
    assert value.dtype == np.float32 and value.shape == (7,)
    np.testing.assert_allclose(value, local_outputs(MLP, mlp_server.weights, obs)[1], rtol=1e-5, atol=1e-5)


def test_bad_requests_get_one_clear_error(mlp_server):
    client = mlp_server.client()
    with pytest.raises(ValueError, match="at most 8"):
        client.act(observations(MLP, 9, seed=0))
    with pytest.raises(ValueError, match=r"must be \[n, 4\]"):
        client.act(np.zeros((2, 5), np.float32))
    assert client.act(np.zeros((0, 4), np.float32)).actions.shape == (0,)


def test_publish_switches_weights_and_version_at_the_next_request(mlp_server):
    client = mlp_server.client(1)
    obs = observations(MLP, 8, seed=6)
    for action in (2, 0, 1):
        version = mlp_server.weights.publish(peaked(MLP, action))
        step = client.act(obs)
        assert step.version == version
        assert (step.actions == action).all()
        assert_matches_local(step, MLP, mlp_server.weights, obs)
        assert client.refresh() == version


def test_actions_follow_the_policy_and_the_client_seed():
    # Sampling itself: frequencies match softmax(logits) (6-sigma bounds).
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]]).repeat(20000, 1)
    actions = sample_actions(logits, torch.rand(20000, generator=torch.Generator().manual_seed(0)))
    frequency = torch.bincount(actions, minlength=4).double() / 20000
    expected = torch.softmax(logits[0].double(), 0)
    assert (frequency - expected).abs().max() < 6 * (0.25 / 20000) ** 0.5
    # An all-but-impossible action is never drawn, even at u close to 1.
    u = torch.tensor([0.0, 0.5, 0.99999994])
    assert (sample_actions(torch.tensor([[0.0, -200.0]]).repeat(3, 1), u) == 0).all()
    assert (sample_actions(torch.tensor([[-200.0, 0.0, -200.0]]).repeat(3, 1), u) == 1).all()


def test_same_client_seed_gives_the_same_actions(mlp_server):
    mlp_server.weights.publish(build_model(**MLP))  # a spread-out policy: actions vary
    obs = observations(MLP, 8, seed=7)
    runs = [[mlp_server.client(2, seed=seed).act(obs).actions for _ in range(10)] for seed in (11, 11, 12)]
    assert all((a == b).all() for a, b in zip(runs[0], runs[1]))
    assert any((a != b).any() for a, b in zip(runs[0], runs[2]))
    assert len(np.unique(np.concatenate(runs[0]))) > 1


def act_repeatedly(channels, index, stop, seed, calls, results):
    """Client process: acts on its own observations `calls` times and sends back every answer."""
    client = InferenceClient(channels, index, stop=stop, seed=seed)
    obs = observations(MLP, 4 + index, seed=100 + index)
    answers = [client.act(obs) for _ in range(calls)]
    results.put((index, np.stack([a.fields["behaviour_logits"] for a in answers]), np.stack([a.fields["behaviour_value"] for a in answers])))


def test_several_client_processes_get_their_own_answers(mlp_server):
    """Two client processes and this one ask at the same time, each with its own observations."""
    results = CONTEXT.Queue()
    for index in (1, 2):
        mlp_server.spawn(act_repeatedly, mlp_server.channels, index, mlp_server.stop, index, 300, results)
    client, own = mlp_server.client(0), observations(MLP, 4, seed=100)
    mine, answers = [], {}
    deadline = time.monotonic() + 60
    while len(answers) < 2 and time.monotonic() < deadline:
        if len(mine) < 3000:  # keep asking while the children do, so that requests overlap
            mine.append(client.act(own).fields["behaviour_logits"])
        else:
            time.sleep(0.01)
        while not results.empty():
            index, logits, value = results.get()
            answers[index] = (logits, value)
    assert len(answers) == 2, "the client processes did not finish in 60 s"
    answers[0] = (np.stack(mine), None)
    for index, (logits, value) in answers.items():
        obs = observations(MLP, 4 + index, seed=100 + index)
        expected_logits, expected_value, _ = local_outputs(MLP, mlp_server.weights, obs, mlp_server.reference)
        np.testing.assert_allclose(logits, np.broadcast_to(expected_logits, logits.shape), rtol=1e-5, atol=1e-5)
        if value is not None:
            np.testing.assert_allclose(value, np.broadcast_to(expected_value, value.shape), rtol=1e-5, atol=1e-5)


def test_a_stale_answer_is_never_taken():
    """Drives BatchServer by hand, so the interleavings are exact."""
    channels = channels_for(MLP, 1, 8)
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    server = BatchServer(channels, MLP, weights, torch.device("cpu"))
    obs_a, obs_b, obs_c = (observations(MLP, 8, seed) for seed in (8, 9, 10))
    expected_b, expected_c = (local_outputs(MLP, weights, o)[0] for o in (obs_b, obs_c))

    # 1. A client asks, is answered, and dies before reading: its successor must not take that answer.
    dead = InferenceClient(channels, 0)
    dead._write(obs_a)
    dead._publish(8, kind=1)
    server.serve(server.pending())
    successor = InferenceClient(channels, 0, start_timeout=0.3)
    successor._write(obs_b)
    seq = successor._publish(8, kind=1)
    assert seq > dead.seq
    with pytest.raises(InferenceServerGone, match="no inference server started"):
        successor._wait(seq)  # the stale answer is there, but not for this sequence number
    server.serve(server.pending())
    successor._wait(seq)
    np.testing.assert_allclose(successor.outputs["behaviour_logits"][:8], expected_b, rtol=1e-5, atol=1e-5)

    # 2. A client asks and dies before the server looked: its successor's request replaces it.
    dead = InferenceClient(channels, 0)
    dead._write(obs_a)
    dead._publish(8, kind=1)
    successor = InferenceClient(channels, 0)
    successor._write(obs_c)
    seq = successor._publish(8, kind=1)
    server.serve(server.pending())
    assert channels.header[0, ANSWER_SEQ] == channels.header[0, REQUEST_SEQ] == seq
    successor._wait(seq)
    np.testing.assert_allclose(successor.outputs["behaviour_logits"][:8], expected_c, rtol=1e-5, atol=1e-5)


def test_the_server_tallies_the_batches_it_answers():
    """Batches, their rows and requests, the time from launch to answers and from each
    request to its launch and from each answer to its reading, summed in the channels'
    shared header (what InferenceServers logs and summary.json keeps)."""
    channels = channels_for(MLP, 2, 8)
    server = BatchServer(channels, MLP, SharedWeights(build_model(**MLP), CONTEXT), torch.device("cpu"))
    assert channels.tally()["batches"] == 0
    clients, seqs = [], []
    for client, rows in ((0, 8), (1, 3)):
        clients.append(InferenceClient(channels, client))
        clients[-1]._write(observations(MLP, rows, client))
        seqs.append(clients[-1]._publish(rows, kind=1))
    time.sleep(0.05)                                     # the two requests wait 50 ms for their launch
    server.serve(server.pending())                       # both together: 11 rows, 2 requests
    clients[0]._wait(seqs[0])                            # client 0 reads its answer at once
    asking = clients[1]
    asking._write(observations(MLP, 3, 5))
    seq = asking._publish(3, kind=1)
    server.serve(server.pending())                       # client 1 alone: 3 rows
    time.sleep(0.1)
    asking._wait(seq)                                    # its answer read 100 ms after it came
    tally = channels.tally()
    assert (tally["batches"], tally["requests"], tally["mean_rows"], tally["mean_requests"]) == (2, 3, 7.0, 1.5), tally
    assert tally["mean_answer_us"] > 0
    # From publication to launch: at least the 50 ms of the first two requests, over three.
    assert 2 * 50_000 / 3 <= tally["mean_wait_us"] < 60_000_000, tally
    # Two answers read (client 1's first answer never was): at once and after 100 ms.
    assert 50_000 <= tally["mean_taken_us"] < 95_000, tally


def raised_by(call, what: str, deadline: float = 60.0) -> BaseException | None:
    """The exception `call` raises, waited for in a thread: a call still blocked after
    `deadline` s fails the test naming `what` (no stopwatch: a loaded machine may be slow,
    a hung call never returns). Returns None when it returned normally."""
    caught: list = []

    def attempt():
        try:
            call()
            caught.append(None)
        except BaseException as error:  # noqa: BLE001 (handed back to the test)
            caught.append(error)
    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(deadline)
    assert not thread.is_alive(), f"{what} still blocked after {deadline:.0f} s"
    return caught[0]


def test_a_dead_server_makes_act_raise_quickly():
    with serving(MLP) as served:
        client = served.client()
        client.act(observations(MLP, 2, seed=0))
        served.server.kill()  # not reaped: the client sees a zombie
        error = raised_by(lambda: client.act(observations(MLP, 2, seed=0)), "act() after the server was killed")
        assert isinstance(error, InferenceServerGone) and "died" in str(error), error


def test_stop_makes_the_server_exit_and_act_raise():
    with serving(MLP) as served:
        client = served.client()
        client.act(observations(MLP, 2, seed=0))
        served.stop.set()
        served.server.join(5.0)
        assert served.server.exitcode == 0
        error = raised_by(lambda: client.act(observations(MLP, 2, seed=0)), "act() after the server exited")
        assert isinstance(error, InferenceServerGone), error


def act_forever(channels, index, stop, started):
    client = InferenceClient(channels, index, stop=stop)
    obs = observations(MLP, 8, seed=index)
    client.act(obs)
    started.set()
    while True:
        client.act(obs)


def test_serving_goes_on_after_a_client_is_killed(mlp_server):
    started = CONTEXT.Event()
    victim = mlp_server.spawn(act_forever, mlp_server.channels, 0, mlp_server.stop, started)
    assert started.wait(60)
    header = mlp_server.channels.header
    # Killed mid-request: its request published and not yet answered (it asks back to back).
    assert wait_for(lambda: header[0, REQUEST_SEQ] != header[0, ANSWER_SEQ], 60, 0.0005), "no request in flight"
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(5.0)
    obs = observations(MLP, 8, seed=11)
    for index in (1, 0):  # another client, then a successor in the dead one's slot
        step = mlp_server.client(index).act(obs)
        assert_matches_local(step, MLP, mlp_server.weights, obs)


def test_the_server_ignores_sigint(mlp_server):
    os.kill(mlp_server.server.pid, signal.SIGINT)
    obs = observations(MLP, 3, seed=12)
    for _ in range(2):       # Python runs a handler at its next bytecode: by the second answer at the latest
        assert_matches_local(mlp_server.client().act(obs), MLP, mlp_server.weights, obs)
    assert mlp_server.server.is_alive()


def start_server_then_hang(channels, weights, stop):
    """An intermediate parent: starts a server, then waits to be killed."""
    server = CONTEXT.Process(target=run_inference_server, args=(channels, MLP, weights, "cpu", stop), daemon=True)
    server.start()
    server.join()


def test_the_server_exits_when_its_parent_dies():
    channels = channels_for(MLP, 1, 4)
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    stop = CONTEXT.Event()  # never set: only the parent's death can end the server
    # Not a daemon: daemonic processes may not start children.
    parent = CONTEXT.Process(target=start_server_then_hang, args=(channels, weights, stop))
    parent.start()
    server = None
    try:
        InferenceClient(channels, 0, start_timeout=30).act(observations(MLP, 1, seed=0))  # the server is up
        server = psutil.Process(int(channels.server[SERVER_PID]))
        parent.kill()
        parent.join(5.0)
        gone, _ = psutil.wait_procs([server], timeout=15.0)   # it polls its parent; a loaded machine is slow
        assert gone, "the inference server outlived its parent"
    finally:
        parent.kill()
        parent.join(5.0)
        if server is not None and server.is_running():
            server.kill()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kwargs", [MLP, CNN], ids=["mlp", "nature_cnn"])
def test_cuda_server_equals_the_local_cpu_model(kwargs):
    channels = channels_for(kwargs, 2, 8)
    weights = SharedWeights(build_model(**kwargs), CONTEXT)
    stop = CONTEXT.Event()
    server = CONTEXT.Process(target=run_inference_server, args=(channels, kwargs, weights, "cuda", stop), daemon=True)
    server.start()
    try:
        client = InferenceClient(channels, 0, stop=stop)
        for action in (1, 2):
            obs = observations(kwargs, 8, seed=action)
            step = client.act(obs)
            logits, value, features = local_outputs(kwargs, weights, obs)
            # TF32 / cuDNN algorithms differ from the CPU's: loose tolerances.
            np.testing.assert_allclose(step.fields["behaviour_logits"], logits, rtol=1e-2, atol=1e-2)
            np.testing.assert_allclose(step.fields["behaviour_value"], value, rtol=1e-2, atol=1e-2)
            np.testing.assert_allclose(step.fields["features"], features, rtol=1e-2, atol=1e-2)
            version = weights.publish(peaked(kwargs, action))
            step = client.act(obs)
            assert step.version == version and (step.actions == action).all()
    finally:
        stop.set()
        reap([server])


def test_a_server_reports_its_load_also_after_it_exits():
    """The server process writes its CPU time and life into the header (every wake and as it
    exits), so its load is read after it is gone: a share of a core, not None."""
    channels = channels_for(MLP, 1, 4)
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    assert channels.busy() is None                          # nothing reported yet
    stop = CONTEXT.Event()
    process = CONTEXT.Process(target=run_inference_server, args=(channels, MLP, weights, "cpu", stop), daemon=True)
    process.start()
    client = InferenceClient(channels, 0)
    client.act(observations(MLP, 4, 1))
    stop.set()
    process.join(30)
    assert process.exitcode == 0
    busy = channels.busy()
    assert busy is not None and 0.0 < busy < 1.5, busy
