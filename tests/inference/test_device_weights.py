"""The device weight board (herd/device_weights.py): a reader never takes half of one
version, the server takes exactly the published parameters from it, and the local backend
uses it only where the learner and the server share a CUDA device.

The protocol is device-agnostic: these tests run it on CPU tensors (shared memory) with
spawn processes, as CUDA tensors would cross as IPC handles. The tests at the end need CUDA
and are skipped without it."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.utils import parameters_to_vector

from herd_testing import peaked
from herd.device_weights import DeviceWeightBoard, same_cuda_device
from herd.inference import InferenceChannels, InferenceClient, run_inference_server
from herd.learner.publisher import WeightPublisher
from herd.models import build_model
from herd.weights import SharedWeights

CONTEXT = mp.get_context("spawn")
DEADLINE = 120.0            # s: generous, for a busy 2-core machine; never a synchronisation
SIZE = 1_000_000            # floats: a copy takes a fraction of a millisecond, so readers overlap writes
TARGET = 100                # the readers of the race read until this many versions past their first read
MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=3, feature_size=None)
CNN = dict(network="nature_cnn", obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=6, feature_size=None)


def reap(processes) -> None:
    for process in processes:
        process.join(10.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)


# A reader in a race with the writer.

def read_until(board: DeviceWeightBoard, target: int, report, index: int, started) -> None:
    """Reads until it saw a version `target` past the one its first read took (counted from
    there, so that a reader scheduled late still races the writer); report[4 i: 4 i + 4] =
    reads not one whole version (not constant, or not the version returned), versions that
    went back, distinct versions seen, reads turned back by the re-check."""
    out = torch.empty(board.slots.shape[1])
    started.release()
    last, bad, back, seen = -1, 0, 0, set()
    first = None
    while first is None or last < first + target:
        version = board.snapshot_into(out)
        if not bool((out == out[0]).all()) or float(out[0]) != float(version):
            bad += 1
        back += version < last
        last = version
        first = version if first is None else first
        seen.add(version)
    report[4 * index:4 * index + 4] = [bad, back, len(seen), board.retries]


def test_a_reader_process_only_ever_takes_whole_versions_and_never_goes_back():
    """The writer publishes vectors filled with their version as fast as it can while two
    reader processes read. Catches a torn read (a slot overwritten during a read that
    was kept: a vector not constant, or not the version returned), a reader sent back to
    an older version, and a re-check that loops instead of reading the newest slot."""
    board = DeviceWeightBoard(SIZE, "cpu", CONTEXT)
    vector = torch.zeros(SIZE)
    board.publish_vector(vector, 0)
    report = CONTEXT.Array("q", 8, lock=False)
    started = CONTEXT.Semaphore(0)
    readers = [CONTEXT.Process(target=read_until, args=(board, TARGET, report, i, started), daemon=True)
               for i in range(2)]
    for reader in readers:
        reader.start()
    try:
        for _ in readers:
            assert started.acquire(timeout=DEADLINE), "a reader never started"
        version = 0
        while any(reader.is_alive() for reader in readers):
            version += 1
            board.publish_vector(vector.fill_(float(version)), version)   # exact in float32 below 2**24
            assert version < 10_000_000, "the readers never reached the target"
    finally:
        reap(readers)
    assert all(reader.exitcode == 0 for reader in readers)
    for i in range(2):
        bad, back, seen, retries = report[4 * i:4 * i + 4]
        assert bad == 0, f"reader {i} took {bad} reads that were not one whole version"
        assert back == 0, f"reader {i} went back to an older version {back} times"
        assert seen >= 2, "the reader saw no publish: the test raced nothing"


# A reader paused halfway through its copy while the writer laps it.

class PausedHalfway:
    """copy(out, source, stream) in two halves; the first time, between them, it says so
    (halfway) and waits to be resumed: the writer overlaps the copy deterministically."""

    def __init__(self, context):
        self.halfway, self.resume = context.Event(), context.Event()
        self.paused = False

    def __call__(self, out: torch.Tensor, source: torch.Tensor, stream=None) -> None:
        n = out.numel() // 2
        out[:n].copy_(source[:n])
        if not self.paused:
            self.paused = True
            self.halfway.set()
            assert self.resume.wait(DEADLINE), "never resumed"
        out[n:].copy_(source[n:])


def read_paused(board: DeviceWeightBoard, copy: PausedHalfway, recheck: bool, report) -> None:
    """report = [version returned, out's first and last value, retries, version published
    right after the copy]."""
    out = torch.empty(board.slots.shape[1])
    version = board.snapshot_into(out, recheck=recheck, copy=copy)
    report[:] = [version, float(out[0]), float(out[-1]), board.retries, board.version]


def lapped_read(recheck: bool) -> list:
    """A reader copies version 1's slot; halfway through, the writer publishes 2 (the other
    slot) and starts writing 3 into the reader's slot, not yet published (the copy of 3
    still in flight on a GPU); then the reader goes on. -> read_paused's report."""
    board = DeviceWeightBoard(1000, "cpu", CONTEXT)
    board.publish_vector(torch.full((1000,), 1.0), 1)
    copy = PausedHalfway(CONTEXT)
    report = CONTEXT.Array("d", 5, lock=False)
    reader = CONTEXT.Process(target=read_paused, args=(board, copy, recheck, report), daemon=True)
    reader.start()
    try:
        assert copy.halfway.wait(DEADLINE), "the reader never started its copy"
        board.publish_vector(torch.full((1000,), 2.0), 2)
        slot = board.begin(torch.full((1000,), 3.0))
        copy.resume.set()
        reader.join(DEADLINE)
        assert reader.exitcode == 0
        board.finish(slot, 3)
    finally:
        reap([reader])
    return list(report)


def test_a_read_the_writer_overlapped_is_read_again():
    """The deterministic race: the writer overwrites the slot a reader is halfway through.
    Catches a re-check that misses it (the reader would keep half of 1 and half of 3),
    including one that only asks whether v + 2 was published (3 was not yet: see the
    negative control): the read is turned back once and takes version 2 whole."""
    version, first, last, retries, _ = lapped_read(recheck=True)
    assert (version, first, last, retries) == (2, 2.0, 2.0, 1)


def test_negative_control_without_the_recheck_the_read_is_torn():
    """Proves the re-check matters: the same race without it returns version 1 holding
    half of 1 and half of 3. And the rule "retry if v + 2 was published" would have kept
    it too: when the copy ended the newest published version was 2 = v + 1."""
    version, first, last, retries, published = lapped_read(recheck=False)
    assert (version, first, last, retries) == (1, 1.0, 3.0, 0)
    assert published < version + 2


def test_the_writer_never_touches_the_newest_slot_even_with_skipped_versions():
    """The publisher skips versions (7, then 9): slots alternate by write, not by parity.
    Catches slot = version % 2, which would write 9 over 7, the newest, while readers take
    it (they would be turned back, or wait, until 9 is done)."""
    board = DeviceWeightBoard(16, "cpu", CONTEXT)
    out = torch.empty(16)
    assert board.snapshot_into(out) == -1 and board.version == -1      # nothing published yet
    board.publish_vector(torch.full((16,), 7.0), 7)
    newest = board._newest.value
    slot = board.begin(torch.full((16,), 9.0))                         # 9 on its way
    assert slot != newest, "the writer opened the slot readers take the newest version from"
    assert board.snapshot_into(out) == 7 and bool((out == 7.0).all()) and board.retries == 0
    board.finish(slot, 9)
    assert board.snapshot_into(out) == 9 and bool((out == 9.0).all())


# The server's side: exactly the published parameters.

def pull_into_fresh_model(board: DeviceWeightBoard, kwargs: dict, vector: torch.Tensor, version) -> None:
    model = build_model(**kwargs)
    version.value = board.pull(model, have_version=-1)
    vector.copy_(parameters_to_vector(model.parameters()))


def test_a_pull_in_another_process_loads_exactly_the_published_parameters():
    """The learner's publisher writes the board (and the host store) and a fresh model in
    another process pulls it. Catches parameters loaded in the wrong order or offset, a
    publisher that skips the board or writes it a stale copy, and a board that does not
    reach the other process (shared memory not shared)."""
    torch.manual_seed(0)
    model = build_model(**CNN)
    store = SharedWeights(model, CONTEXT)
    board = DeviceWeightBoard.for_model(model, CONTEXT)
    publish = WeightPublisher(model, store.publish_vector, board=board)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    publish(5)
    publish.close()
    expected = parameters_to_vector(model.parameters()).detach()
    assert board.version == store.version == 5
    vector = torch.zeros_like(expected).share_memory_()
    version = CONTEXT.Value("q", -2)
    child = CONTEXT.Process(target=pull_into_fresh_model, args=(board, CNN, vector, version), daemon=True)
    child.start()
    try:
        child.join(DEADLINE)
        assert child.exitcode == 0
    finally:
        reap([child])
    assert version.value == 5
    assert torch.equal(vector, expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_no_host_publish_where_every_reader_takes_the_board(device):
    """With inference servers reading the learner's board, each update's weights go to the
    board only: catches a publisher (or train_local's wiring, host_weight_store) that still
    writes host shared memory nobody reads (on a GPU, a copy off the device per update).
    Actors with their own model, or servers without a board, keep the host store."""
    from herd.backends.local import host_weight_store

    model = build_model(**MLP).to(device)
    store = SharedWeights(model, CONTEXT)
    board = DeviceWeightBoard.for_model(model, CONTEXT)
    servers = object()          # only whether there are servers matters to the wiring
    assert host_weight_store(store, servers, board) is None
    assert host_weight_store(store, None, None) == store.publish_vector
    assert host_weight_store(store, servers, None) == store.publish_vector
    publish = WeightPublisher(model, host_weight_store(store, servers, board), board=board)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    publish(7)
    publish.close()
    assert board.version == 7 and store.version == 0
    if device == "cuda":
        assert publish.host is None          # no pinned buffer: nothing is copied off the device
    out = torch.zeros(board.slots.shape[1], device=device)
    assert board.snapshot_into(out) == 7
    assert torch.equal(out, parameters_to_vector(model.parameters()).detach())
    with pytest.raises(ValueError, match="somewhere to publish"):
        WeightPublisher(model, None, board=None)


def serve_from_board(device: str, kwargs: dict = MLP, tolerance: float = 1e-5) -> None:
    """A server process given the board (no host store) acts with the board's weights."""
    channels = InferenceChannels(2, 8, kwargs["obs_shape"], kwargs["obs_dtype"], kwargs["num_actions"],
                                 {"mlp": 64, "nature_cnn": 512}[kwargs["network"]], "semaphore", CONTEXT)
    learner = build_model(**kwargs).to(device)
    board = DeviceWeightBoard.for_model(learner, CONTEXT)
    board.publish_vector(parameters_to_vector(learner.parameters()).detach(), 3)
    stop = CONTEXT.Event()
    server = CONTEXT.Process(target=run_inference_server, args=(channels, kwargs, board, device, stop), daemon=True)
    server.start()
    try:
        client = InferenceClient(channels, 0, stop=stop)
        rng = np.random.default_rng(0)
        obs = (rng.integers(0, 256, (8, *kwargs["obs_shape"]), dtype=np.uint8) if kwargs["obs_dtype"] == "uint8"
               else rng.standard_normal((8, *kwargs["obs_shape"])).astype(np.float32))
        step = client.act(obs)
        with torch.no_grad():
            out = learner.cpu()(torch.from_numpy(obs).unsqueeze(0))
        assert step.version == 3
        np.testing.assert_allclose(step.fields["behaviour_logits"], out.logits[0].numpy(),
                                   rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(step.fields["behaviour_value"], out.value[0].numpy(),
                                   rtol=tolerance, atol=tolerance)
        for version, action in ((4, 2), (7, 1)):
            target = peaked(kwargs, action).to(device)
            board.publish_vector(parameters_to_vector(target.parameters()).detach(), version)
            step = client.act(obs)
            assert step.version == version and (step.actions == action).all()
    finally:
        stop.set()
        reap([server])


def test_the_server_acts_with_the_boards_weights():
    """A server process handed the board (as the local backend hands it on the learner's
    own GPU) answers with the board's published weights and versions, at the next request
    after each publish. Catches a server that cannot read a board (its refresh or pull
    expecting the host store's API), misses a new version, or reports the wrong one."""
    serve_from_board("cpu")


# The wiring: which path the local backend picks.

@pytest.mark.parametrize("learner, server, same", [
    ("cuda:0", "cuda", True),        # a fresh server process's "cuda" is its cuda:0
    ("cuda", "cuda", True),
    ("cuda:1", "cuda:1", True),
    ("cuda:0", "cuda:1", False),
    ("cuda:1", "cuda", False),
    ("cuda", "cpu", False),
    ("cpu", "cuda", False),
    ("cpu", "cpu", False),
])
def test_the_board_only_where_learner_and_server_share_a_cuda_device(learner, server, same):
    """Catches a board offered to a server on another GPU (its IPC handle would map the
    learner's memory across devices, or fail) or to a CPU server (the host path is the
    one it reads cheaply), and a same-GPU server sent the long way through host memory.
    Device objects only: no CUDA needed to test the choice."""
    chosen, why = same_cuda_device(torch.device(learner), torch.device(server))
    assert chosen is same
    assert why      # the log says why


def test_the_local_backend_logs_the_host_path_for_a_cpu_learner(caplog):
    """device_board, as train_local calls it: a CPU learner gets no board, and the log
    says the servers use host shared memory and why. Catches a board made where no
    same-device server exists."""
    from herd.backends.local import device_board
    with caplog.at_level(logging.INFO, logger="herd"):
        for server in ("cpu", "cuda"):
            assert device_board(build_model(**MLP), server, 0, CONTEXT) is None
    lines = [r.getMessage() for r in caplog.records if "inference servers take" in r.getMessage()]
    assert len(lines) == 2 and all("host shared memory" in line and "not on a CUDA device" in line
                                   for line in lines)


# CUDA only: skipped on machines without a GPU.

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@CUDA
def test_cuda_publisher_copies_into_the_board_device_to_device():
    """On a CUDA learner the publisher's side stream fills the board's free slot beside the
    pinned host copy, and its thread publishes both. Catches a slot published before its
    copy completed (stale or partial weights) and host and board disagreeing."""
    model = build_model(**CNN).cuda()
    store = SharedWeights(model, CONTEXT)
    board = DeviceWeightBoard.for_model(model, CONTEXT)
    assert board.device.type == "cuda"
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        publish = WeightPublisher(model, store.publish_vector, board=board)
        publish(version)
        publish.close()     # waits for the copy in flight and its publish
        out = torch.empty(board.slots.shape[1], device="cuda")
        assert board.snapshot_into(out) == version == store.version
        expected = parameters_to_vector(model.parameters()).detach()
        assert torch.equal(out, expected) and torch.equal(store.flat, expected.cpu())


@CUDA
def test_cuda_server_takes_the_board_on_the_same_device():
    """A CUDA server process handed a CUDA board (an IPC handle) acts with its weights and
    versions. Catches the device path still reading host memory, the staged copy or its
    stream ordering losing a publish, and IPC handles that do not open."""
    serve_from_board("cuda", tolerance=1e-2)     # TF32 / cuDNN differ from the CPU
