"""Several inference servers: which server serves which actor, every request answered
exactly once and in order per client, and a client that waits through a server's restart."""
from __future__ import annotations

import threading
import time
from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from herd.backends.inference_servers import InferenceServers
from herd.inference import InferenceClient, InferenceServerGone, ServerOptions, run_inference_server
from herd.inference.channels import REQUEST_SEQ
from herd.inference.routing import actors_of, route
from herd.inference.server import BatchServer, serve_forever
from herd.models import build_model
from herd.weights import SharedWeights

MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=3, feature_size=None)
CONTEXT = mp.get_context("spawn")


def test_actor_i_goes_to_server_i_mod_s_and_every_client_slot_is_used_once():
    """Catches two actors sharing a client slot (their answers would be swapped or lost) or
    a slot beyond a server's channels."""
    for workers in range(1, 12):
        for servers in range(1, workers + 1):
            seen = defaultdict(set)
            for actor in range(workers):
                server, place = route(actor, servers)
                assert server == actor % servers
                assert place not in seen[server]
                seen[server].add(place)
            for server in range(servers):
                assert seen[server] == set(range(len(actors_of(server, servers, workers))))


class CountingServer(BatchServer):
    """Records every (client, request number) it answers, and each batch's clients.
    pipelined=True runs serve_forever's CUDA schedule on the CPU: batch k+1 launched before
    batch k is answered (the in-flight clients must not be served twice)."""

    def __init__(self, *args, answered: list, pipelined: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.answered, self.batches, self.pipelined_here = answered, [], pipelined

    @property
    def pipelined(self) -> bool:
        return self.pipelined_here

    def launch(self, clients):
        self.batches.append(sorted(clients.tolist()))
        return super().launch(clients)

    def finish(self, launched) -> None:
        self.answered.extend(zip(launched.clients.tolist(), launched.seqs.tolist()))
        super().finish(launched)


def run_actors(actor, workers: int) -> None:
    """actor(i) for i < workers, each in a thread, all at once; returns when they are done."""
    threads = [threading.Thread(target=actor, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)


def request_obs(actor: int, k: int) -> np.ndarray:
    """Observations that name their actor and request: an answer for another request differs."""
    return np.full((3, 4), actor + 0.01 * k, dtype=np.float32) + np.arange(3, dtype=np.float32)[:, None]


@pytest.mark.parametrize("lanes, pipelined", [(1, False), (2, False), (1, True)])
def test_every_request_is_answered_once_in_order_by_its_own_server(lanes, pipelined):
    """5 actors (threads) over 2 servers (threads, the doorbells wake threads as processes),
    each actor asking 40 times with observations that name the request. Catches an answer
    given to the wrong client or request, twice, or out of order, and a server answering
    another server's actors."""
    workers, count, calls = 5, 2, 40
    model = build_model(**MLP)
    weights = SharedWeights(model, CONTEXT)
    servers = InferenceServers(MLP, workers, count, rows=3, weights=weights, device="cpu", stop=None,
                               context=CONTEXT, options=ServerOptions(), lanes=lanes)
    stop = threading.Event()
    answered = [[] for _ in range(count)]
    threads = [threading.Thread(target=serve_forever, daemon=True, args=(
        CountingServer(servers.channels[s], MLP, weights, torch.device("cpu"), answered=answered[s],
                       pipelined=pipelined),
        servers.channels[s], stop, 0.0)) for s in range(count)]
    for thread in threads:
        thread.start()
    results, errors = {}, []

    def actor(i: int) -> None:
        try:
            r = servers.route(i)
            clients = [InferenceClient(r.channels, r.client + lane, seed=i) for lane in range(r.lanes)]
            results[i] = [clients[k % r.lanes].act(request_obs(i, k)).fields["behaviour_logits"] for k in range(calls)]
        except Exception as err:     # reported below, with the actor
            errors.append((i, err))

    try:
        run_actors(actor, workers)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert not errors, errors
    with torch.no_grad():
        for i in range(workers):
            expected = [model(torch.from_numpy(request_obs(i, k)).unsqueeze(0)).logits[0].numpy() for k in range(calls)]
            np.testing.assert_allclose(np.stack(results[i]), np.stack(expected), rtol=1e-5, atol=1e-5)
    for s in range(count):
        per_client = defaultdict(list)
        for client, seq in answered[s]:
            per_client[client].append(seq)
        slots = lanes * len(actors_of(s, count, workers))
        assert sorted(per_client) == list(range(slots))              # only its own actors' clients
        for client, seqs in per_client.items():
            assert seqs == list(range(1, len(seqs) + 1)), (s, client, seqs)   # once each, in order
        assert sum(len(v) for v in per_client.values()) == calls * len(actors_of(s, count, workers))
        assert (servers.channels[s].header[:, REQUEST_SEQ].numpy() == [len(per_client[c]) for c in range(slots)]).all()


class OrderServer(CountingServer):
    """A pipelined server whose batches are home as soon as launched (done() is True, as a
    CUDA batch whose event already fired): logs each launch and finish in order."""

    def __init__(self, *args, log: list, **kwargs):
        super().__init__(*args, answered=[], pipelined=True, **kwargs)
        self.log = log

    def launch(self, clients):
        launched = super().launch(clients)
        self.log.append(("launch", id(launched)))
        return launched

    def finish(self, launched) -> None:
        self.log.append(("finish", id(launched)))
        super().finish(launched)


def test_a_batch_whose_outputs_are_home_is_answered_before_the_next_is_launched():
    """3 actors asking 30 times each at one pipelined server: every batch is answered before
    the server launches another. Catches the schedule that launches batch k+1 (gathering
    its rows, starting its pass) while batch k's answer already waits in host memory."""
    workers, calls = 3, 30
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    servers = InferenceServers(MLP, workers, 1, rows=3, weights=weights, device="cpu", stop=None, context=CONTEXT,
                               options=ServerOptions())
    stop, log = threading.Event(), []
    server = OrderServer(servers.channels[0], MLP, weights, torch.device("cpu"), log=log)
    thread = threading.Thread(target=serve_forever, args=(server, servers.channels[0], stop, 0.0), daemon=True)
    thread.start()

    def actor(i: int) -> None:
        r = servers.route(i)
        client = InferenceClient(r.channels, r.client, seed=i)
        for k in range(calls):
            client.act(request_obs(i, k))

    try:
        run_actors(actor, workers)
    finally:
        stop.set()
        thread.join(5)
    kinds = [kind for kind, _ in log]
    assert kinds.count("finish") == kinds.count("launch") >= calls
    assert kinds == ["launch", "finish"] * (len(kinds) // 2), kinds[:20]
    assert all(log[i][1] == log[i + 1][1] for i in range(0, len(log), 2))     # each finish is of its own launch


@pytest.mark.parametrize("min_clients, together", [(3, True), (1, False)])
def test_the_server_waits_for_min_clients_within_the_batch_wait(min_clients, together):
    """Client 0 asks, then clients 1 and 2 ask. With a 20 s batch wait and min_clients=3
    one batch holds all three; with min_clients=1 client 0 is answered alone long before
    the wait is over. Catches knobs that are not wired (always one, or never waiting)."""
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    servers = InferenceServers(MLP, 4, 1, rows=3, weights=weights, device="cpu", stop=None, context=CONTEXT,
                               options=ServerOptions())
    channels, stop = servers.channels[0], threading.Event()
    server = CountingServer(channels, MLP, weights, torch.device("cpu"), answered=[])
    thread = threading.Thread(target=serve_forever, args=(server, channels, stop, 20.0, min_clients), daemon=True)
    thread.start()
    try:
        clients = [InferenceClient(channels, i) for i in range(3)]
        first, started = clients[0].submit(request_obs(0, 0)), time.monotonic()
        if together:
            time.sleep(0.3)     # a gap the server must wait through
        else:
            clients[0].collect(first)
            assert time.monotonic() - started < 10, "client 0 waited for the batch wait (20 s)"
        later = [c.submit(request_obs(i, 0)) for i, c in enumerate(clients[1:], start=1)]
        if together:
            clients[0].collect(first)
        for client, request in zip(clients[1:], later):
            client.collect(request)
    finally:
        stop.set()
        thread.join(25)
    if together:
        assert server.batches == [[0, 1, 2]]
    else:
        assert server.batches[0] == [0] and sum(map(len, server.batches)) == 3


def start_server(channels, weights, stop):
    process = CONTEXT.Process(target=run_inference_server, args=(channels, MLP, weights, "cpu", stop), daemon=True)
    process.start()
    return process


def test_a_client_waits_for_a_restarted_server_and_gets_its_answer():
    """The server is killed with a request of the client pending; a new server on the same
    channels answers it. Catches a client that gives up on a supervised server (the run
    ended) and a replacement that misses requests left pending."""
    model = build_model(**MLP)
    weights = SharedWeights(model, CONTEXT)
    servers = InferenceServers(MLP, 1, 1, rows=3, weights=weights, device="cpu", stop=None, context=CONTEXT,
                               options=ServerOptions())
    channels, stop = servers.channels[0], CONTEXT.Event()
    first = start_server(channels, weights, stop)
    processes = [first]
    try:
        client = InferenceClient(channels, 0, stop=stop, restart_timeout=60, poll_interval=0.05)
        client.act(request_obs(0, 0))                      # the first server is up
        first.kill()
        first.join(5)
        request = client.submit(request_obs(0, 1))          # pending, with no server
        replacement = threading.Timer(0.5, lambda: processes.append(start_server(channels, weights, stop)))
        replacement.start()
        step = client.collect(request)
        with torch.no_grad():
            expected = model(torch.from_numpy(request_obs(0, 1)).unsqueeze(0)).logits[0].numpy()
        np.testing.assert_allclose(step.fields["behaviour_logits"], expected, rtol=1e-5, atol=1e-5)
        replacement.join()
    finally:
        stop.set()
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()


def test_a_client_gives_up_when_no_replacement_comes():
    """Catches a client that waits forever for a server that will never be restarted."""
    weights = SharedWeights(build_model(**MLP), CONTEXT)
    servers = InferenceServers(MLP, 1, 1, rows=3, weights=weights, device="cpu", stop=None, context=CONTEXT,
                               options=ServerOptions())
    channels, stop = servers.channels[0], CONTEXT.Event()
    server = start_server(channels, weights, stop)
    try:
        client = InferenceClient(channels, 0, stop=stop, restart_timeout=0.5, poll_interval=0.05)
        client.act(request_obs(0, 0))
        server.kill()
        server.join(5)
        started = time.monotonic()
        with pytest.raises(InferenceServerGone, match="no new one started within"):
            client.act(request_obs(0, 1))
        assert time.monotonic() - started < 30          # it gave up (0.5 s asked; a loaded machine is slow)
    finally:
        stop.set()
        server.join(5)
