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
from herd.inference.routing import InferenceRoute, RoutedClient, RouteTable
from herd.inference.server import serve_forever
from herd.models import build_model
from herd.weights import SharedWeights
from server_testing import CountingServer, request_obs

MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=3, feature_size=None)
CONTEXT = mp.get_context("spawn")


def test_actor_i_goes_to_server_i_mod_s_and_every_client_slot_is_used_once():
    """Catches two actors (or lanes) sharing a client slot (their answers would be swapped
    or lost), a slot beyond a server's channels, and a move that takes other actors along."""
    for workers in range(1, 12):
        for servers in range(1, workers + 1):
            table = RouteTable(workers, servers, lanes=2)
            assert [table.server_of(a) for a in range(workers)] == [a % servers for a in range(workers)]
            for server in range(servers):
                assert table.actors_of(server).tolist() == list(range(server, workers, servers))
                assert table.clients_of(server) == 2 * len(range(server, workers, servers))
            slots = [InferenceRoute((None,) * servers, table, a, 2).client + lane for a in range(workers)
                     for lane in range(2)]
            assert sorted(slots) == list(range(2 * workers))
    table = RouteTable(6, 2)
    table.move(table.actors_of(0)[1::2], 1)                      # actors 0, 2, 4: 2 moves
    assert [table.server_of(a) for a in range(6)] == [0, 1, 1, 1, 0, 1]


def run_actors(actor, workers: int) -> None:
    """actor(i) for i < workers, each in a thread, all at once; returns when they are done."""
    threads = [threading.Thread(target=actor, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)


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
            clients = [RoutedClient(r, lane, seed=i) for lane in range(r.lanes)]
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
        own = [a * lanes + lane for a in range(s, workers, count) for lane in range(lanes)]
        assert sorted(per_client) == own                              # only its own actors' clients
        for client, seqs in per_client.items():
            assert seqs == list(range(1, len(seqs) + 1)), (s, client, seqs)   # once each, in order
        assert sum(len(v) for v in per_client.values()) == calls * len(range(s, workers, count))
        asked = servers.channels[s].header[:, REQUEST_SEQ].numpy()
        assert (asked == [len(per_client[c]) for c in range(lanes * workers)]).all()


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
        client = RoutedClient(servers.route(i), seed=i)
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
