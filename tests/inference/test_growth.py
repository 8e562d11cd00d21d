"""Servers from their measured load (herd/backends/inference_servers.py): an actor moved to
another server between requests keeps its answers, and a supervisor that sees a busy server
starts another (a real process) and hands it half of that server's actors."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import herd.backends.inference_servers as inference_servers
from herd.backends.inference_servers import InferenceServers, should_grow, window_loads
from herd.inference import ServerOptions
from herd.inference.routing import RoutedClient, RouteTable
from herd.inference.server import serve_forever
from herd.models import build_model
from herd.weights import SharedWeights
from server_testing import CountingServer, request_obs

MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=3, feature_size=None)
LSTM = dict(MLP, lstm_size=8)
CONTEXT = mp.get_context("spawn")


def served_steps(moves: dict, lanes: int) -> tuple[list, list]:
    """Actor 0 of 2 (an LSTM policy, `lanes` lanes taking turns, as a double-buffered actor's)
    asks 12 times at two server threads, moved to server `moves[k]` before request k. Returns
    its answers (logits and the states it acted from) and each server's answered clients."""
    torch.manual_seed(0)
    weights = SharedWeights(build_model(**LSTM), CONTEXT)
    servers = InferenceServers(LSTM, 2, 2, rows=3, weights=weights, device="cpu", stop=None, context=CONTEXT,
                               options=ServerOptions(), lanes=lanes)
    stop, answered = threading.Event(), [[], []]
    threads = [threading.Thread(target=serve_forever, daemon=True, args=(
        CountingServer(servers.channels[s], LSTM, weights, torch.device("cpu"), answered=answered[s]),
        servers.channels[s], stop, 0.0)) for s in range(2)]
    for thread in threads:
        thread.start()
    route = servers.route(0)
    rng = np.random.default_rng(5)
    first = RoutedClient(route, 0, rng=rng)
    clients = [first, *(RoutedClient(route, 1, rng=rng, states=first.states) for _ in range(lanes - 1))]
    steps = []
    try:
        in_flight = [None] * lanes
        for k in range(12):
            if k in moves:
                servers.table.move([0], moves[k])
            lane = k % lanes
            if in_flight[lane] is not None:
                steps.append(clients[lane].collect(in_flight[lane]))
            ids = np.arange(3) + 3 * lane                    # each lane its own environments
            in_flight[lane] = clients[lane].submit(request_obs(0, k), ids, np.full(3, k < lanes))
        steps.extend(clients[lane].collect(request) for lane, request in enumerate(in_flight))
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    return steps, answered


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_moved_actor_gets_the_answers_it_would_have_got(lanes):
    """Moved to server 1 before request 4 and back before request 9: the same logits and
    LSTM states, step for step, as the actor that stayed (the clients share one set of
    states and one generator), and each server answered it exactly while it was routed
    there. Catches a client that keeps asking its first server, and states kept per server
    (the moved actor would restart its LSTM from zeros)."""
    stayed, answered_stayed = served_steps({}, lanes)
    moved, answered_moved = served_steps({4: 1, 9: 0}, lanes)
    assert len(stayed) == len(moved) == 12
    for a, b in zip(stayed, moved):
        np.testing.assert_array_equal(a.actions, b.actions)
        for name in a.fields:
            np.testing.assert_allclose(a.fields[name], b.fields[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert len(answered_stayed[0]) == 12 and answered_stayed[1] == []
    # Requests 4-8 went to server 1: five requests, from the lanes that asked them.
    assert sorted(client for client, _ in answered_moved[1]) == sorted(k % lanes for k in range(4, 9))
    assert len(answered_moved[0]) == 7


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_a_busy_server_gets_another_that_takes_half_its_actors(monkeypatch, device):
    """Real server processes: 4 actors (threads) at one server; with any load counting as
    busy, the supervisor starts a second server process, waits until it serves, then moves
    actors 1 and 3 to it. Every answer stays right throughout and the new server answers
    the moved actors. Catches a move before the new server serves (the moved actors would
    wait for its start), a new server given nobody, and answers lost in the move. On CUDA
    the servers run the device path (page-locked channels, one copy each way)."""
    monkeypatch.setattr(inference_servers, "LOAD_WINDOW", 0.3)
    model = build_model(**MLP)
    weights = SharedWeights(model, CONTEXT)
    stop = CONTEXT.Event()
    servers = InferenceServers(MLP, 4, 1, rows=3, weights=weights, device=device, stop=stop, context=CONTEXT,
                               options=ServerOptions(), most=2, grow_at=0.0, idle_cores=0.0)
    running_at_move, move = [], RouteTable.move

    def watched_move(table, actors, server: int) -> None:
        running_at_move.append(servers.channels[server].running())
        move(table, actors, server)

    monkeypatch.setattr(RouteTable, "move", watched_move)
    servers.start()
    done, errors, asked = threading.Event(), [], [0] * 4

    def actor(i: int) -> None:
        client = RoutedClient(servers.route(i), seed=i)
        try:
            k = 0
            while not done.is_set():
                step = client.act(request_obs(i, k))
                with torch.no_grad():
                    expected = model(torch.from_numpy(request_obs(i, k)).unsqueeze(0)).logits[0].numpy()
                np.testing.assert_allclose(step.fields["behaviour_logits"], expected, rtol=1e-4, atol=1e-4)
                k += 1
                asked[i] = k
        except Exception as err:        # reported below, with the actor
            errors.append((i, err))

    threads = [threading.Thread(target=actor, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (servers.grown and "actors" in servers.grown[-1]):
            servers.check_health()
            time.sleep(0.05)
        moved_at = list(asked)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(a > b for a, b in zip(asked, moved_at)) and not errors:
            time.sleep(0.05)                    # until every actor was answered again after the move
        done.set()
        for thread in threads:
            thread.join(30)
    finally:
        servers.stop()
    assert not errors, errors
    assert servers.count == 2 and len(servers.grown) == 1, servers.grown
    assert servers.grown[0]["server"] == 1 and servers.grown[0]["from"] == 0 and servers.grown[0]["actors"] == [1, 3]
    assert [servers.table.server_of(a) for a in range(4)] == [0, 1, 0, 1]
    assert running_at_move == [True]                 # moved once the new server served, not as it started
    assert all(after > before for after, before in zip(asked, moved_at)), (moved_at, asked)   # everyone went on
    tallies = servers.tallies()
    assert len(tallies) == 2 and tallies[1]["batches"] > 0, tallies
    assert len(servers.busy()) == 2


def test_the_rule_for_adding_a_server():
    """Above the load, with a core idle, room for another server and two actors to split:
    catches each condition left out."""
    assert should_grow(0.7, 2.0, 0.6, 1.0, count=1, most=4, actors=8)
    assert not should_grow(0.5, 2.0, 0.6, 1.0, count=1, most=4, actors=8)     # not busy enough
    assert not should_grow(0.7, 0.5, 0.6, 1.0, count=1, most=4, actors=8)     # every core busy
    assert not should_grow(0.7, 2.0, 0.6, 1.0, count=4, most=4, actors=8)     # no room
    assert not should_grow(0.7, 2.0, 0.6, 1.0, count=1, most=4, actors=1)     # one actor: nothing to split
    assert not should_grow(None, 2.0, 0.6, 1.0, count=1, most=4, actors=8)    # no reading yet
    # A window's load: the CPU time over the life between readings; none where life stood still.
    assert window_loads([(0, 0), (10, 100), (5, 50)], [(50, 100), (10, 100), (3, 30)]) == [0.5, None, None]
