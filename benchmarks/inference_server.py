"""The inference server against actors running the model themselves, per signalling mechanism.

For each network (CartPole MLP on [4] float32, Nature CNN on Pong's [4, 84, 84] uint8) and
each configuration (a doorbell mechanism, optionally a batch wait with a minimum of
clients, and one or several servers: client i served by server i mod S, as the local
backend routes actors), `clients` client processes each call act() on `rows`
observations back to back for `seconds`:

    round trip   act() call to answer, as the client sees it (median and 90th percentile, µs)
    obs/s        observations answered per second, all clients together
    local obs/s  the same clients running the same model themselves (1 torch thread each,
                 forward + torch.multinomial, as herd/actors/actor.py does today)

and, as a configuration of its own, the clients running the server's batched path
themselves ("in the client": --actor_inference=in_actor, herd/inference/in_actor.py), whose
round trip is what the path costs without a server. Network `constant` (no network to
compute: herd/models/constant.py) leaves only that cost.

Client processes are started once and reused; a server is started per configuration.
On a machine with few, shared cores the numbers are indicative only: the server, the
clients and everyone else's work compete for the same cores.
Usage: python benchmarks/inference_server.py [--seconds 1.0] [--rounds 2] [--rows 4] [--clients 1,2,4,8]
       [--mechanisms semaphore,pipe,queue,spin] [--batch_wait_us 50,200] [--min_clients 0] [--servers 2]
       [--networks mlp,nature_cnn,constant] [--device cpu] [--record_as inference_server]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.multiprocessing as mp

from common import print_table, record

NETWORKS = {
    "mlp": dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2, feature_size=None),
    "nature_cnn": dict(network="nature_cnn", obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=6,
                       feature_size=None),
    "constant": dict(network="constant", obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=6, feature_size=None),
}


def observations(kwargs: dict, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kwargs["obs_dtype"] == "uint8":
        return rng.integers(0, 256, (rows, *kwargs["obs_shape"]), dtype=np.uint8)
    return rng.standard_normal((rows, *kwargs["obs_shape"])).astype(np.float32)


def timed_loop(step, seconds: float) -> np.ndarray:
    """Calls step() for `seconds` after a short warm-up; returns each call's duration (s)."""
    for _ in range(5):
        step()
    durations, deadline = [], time.perf_counter() + seconds
    while (now := time.perf_counter()) < deadline:
        step()
        durations.append(time.perf_counter() - now)
    return np.asarray(durations)


def bench_client(index: int, channels: dict, weights: dict, device: str, commands, results) -> None:
    """Client process: runs the commands main sends until None."""
    from herd.inference import InferenceClient, ServerOptions
    from herd.inference.in_actor import InActorInference
    from herd.models import build_model
    torch.set_num_threads(1)
    local_models, own = {}, {}
    while (command := commands.recv()) is not None:
        kind, network, key, rows, seconds = command
        obs = observations(NETWORKS[network], rows, seed=index)
        if kind == "local":
            model = local_models.setdefault(network, build_model(**NETWORKS[network]).eval())
            batch = torch.from_numpy(obs).unsqueeze(0)                                  # [1, rows, ...]

            def step():
                with torch.no_grad():
                    logits = model(batch).logits[0]
                    torch.multinomial(torch.softmax(logits, -1), 1)
        elif kind == "in_actor":
            if (network, rows) not in own:
                route = InActorInference(NETWORKS[network], weights[network], device, ServerOptions(),
                                         rows=rows).start()
                own[network, rows] = InferenceClient(route.channels[0], 0, seed=index)
            client = own[network, rows]
            step = lambda: client.act(obs)  # noqa: E731
        else:
            servers = channels[key]                      # client i: server i mod S, place i // S
            client = InferenceClient(servers[index % len(servers)], index // len(servers), seed=index)
            step = lambda: client.act(obs)  # noqa: E731
        results.send(timed_loop(step, seconds))


def run_phase(pipes, clients: int, command: tuple) -> tuple[float, float, float]:
    """-> (median round trip µs, p90 round trip µs, observations/s) with `clients` clients."""
    for commands, _ in pipes[:clients]:
        commands.send(command)
    durations = [results.recv() for _, results in pipes[:clients]]
    rows = command[3]
    rate = sum(len(d) * rows / d.sum() for d in durations)   # each client's own rate, added
    everything = np.concatenate(durations) * 1e6
    return float(np.median(everything)), float(np.percentile(everything, 90)), rate


def serve_and_measure(context, pipes, channels: dict, key: tuple, weights, args, counts) -> dict:
    """Starts the servers on channels[key] (key: round, network, (mechanism, batch wait µs,
    servers)), measures every client count, stops them. -> {clients: (median µs, p90 µs, obs/s)}"""
    from herd.inference import ServerOptions, run_inference_server
    _, network, (_, wait, _) = key
    stop = context.Event()
    options = ServerOptions(batch_wait_us=wait, min_clients=args.min_clients)
    servers = [context.Process(target=run_inference_server, daemon=True,
                               args=(ch, NETWORKS[network], weights, args.device, stop),
                               kwargs=dict(torch_threads=args.server_threads, options=options))
               for ch in channels[key]]
    for server in servers:
        server.start()
    try:
        return {k: run_phase(pipes, k, ("server", network, key, args.rows, args.seconds)) for k in counts
                if k >= len(servers)}
    finally:
        stop.set()
        for server in servers:
            server.join(5.0)
            if server.is_alive():
                server.kill()


def start_clients(context, count: int, channels: dict, weights: dict, device: str) -> tuple[list, list]:
    pipes, processes = [], []
    for index in range(count):
        command_rx, command_tx = context.Pipe(duplex=False)
        result_rx, result_tx = context.Pipe(duplex=False)
        processes.append(context.Process(target=bench_client, daemon=True,
                                         args=(index, channels, weights, device, command_rx, result_tx)))
        processes[-1].start()
        pipes.append((command_tx, result_rx))
    return pipes, processes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="the sweep is repeated; medians are shown")
    parser.add_argument("--rows", type=int, default=4, help="observations per request (one actor's envs)")
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--mechanisms", default="semaphore,pipe,queue,spin")
    parser.add_argument("--batch_wait_us", default="50,200", help="extra semaphore configurations, comma-separated")
    parser.add_argument("--networks", default="mlp,nature_cnn")
    parser.add_argument("--min_clients", type=int, default=0,
                        help="with a batch wait: serve once this many clients asked (0: all of a server's)")
    parser.add_argument("--servers", default="2", help="extra semaphore configurations with this many servers")
    parser.add_argument("--record_as", default="inference_server", help="benchmarks/results/<name>.json")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--server_threads", type=int, default=1)
    args = parser.parse_args()
    from herd.inference import InferenceChannels
    from herd.models import build_model
    from herd.weights import SharedWeights

    context = mp.get_context("spawn")
    counts = [int(c) for c in args.clients.split(",")]
    networks = args.networks.split(",")
    configs = [(m, 0.0, 1) for m in args.mechanisms.split(",") if m]
    configs += [("semaphore", float(w), 1) for w in args.batch_wait_us.split(",") if w and float(w) > 0]
    configs += [("semaphore", 0.0, int(s)) for s in args.servers.split(",") if s and int(s) > 1]
    # Clients raise once a server has exited: one set of channels per server, configuration
    # and round, all made before the client processes start.
    channels = {(r, n, c): [InferenceChannels.for_model(NETWORKS[n], len(range(s, max(counts), c[2])), args.rows,
                                                        c[0], context) for s in range(c[2])]
                for r in range(args.rounds) for n in networks for c in configs}
    weights = {n: SharedWeights(build_model(**NETWORKS[n]), context) for n in networks}
    pipes, processes = start_clients(context, max(counts), channels, weights, args.device)
    samples = {}   # (network, configuration, clients) -> [(median µs, p90 µs, obs/s) per round]
    try:
        for r in range(args.rounds):
            for network in networks:
                for k in counts:
                    samples.setdefault((network, "local", k), []).append(
                        run_phase(pipes, k, ("local", network, None, args.rows, args.seconds)))
                    samples.setdefault((network, "in_actor", k), []).append(
                        run_phase(pipes, k, ("in_actor", network, None, args.rows, args.seconds)))
                for config in configs:
                    measured = serve_and_measure(context, pipes, channels, (r, network, config), weights[network],
                                                 args, counts)
                    for k, result in measured.items():
                        samples.setdefault((network, config, k), []).append(result)
            print(f"round {r + 1} of {args.rounds} done", flush=True)
    finally:
        for commands, _ in pipes:
            commands.send(None)
        for process in processes:
            process.join(5.0)
            if process.is_alive():
                process.kill()
    report(samples, args)


def report(samples: dict, args) -> None:
    table, records = [], []
    for (network, config, k), results in samples.items():
        median, p90, rate = (float(np.median(column)) for column in zip(*results))
        local = float(np.median([r[2] for r in samples[network, "local", k]]))
        name = {"local": "local (no server)", "in_actor": "in the client (no server)"}.get(config) or \
            (f"{config[2]} servers" if config[2] > 1 else "server") + f" {config[0]}" + \
            (f" wait {config[1]:.0f}us" + (f" min {args.min_clients}" if args.min_clients else "") if config[1] else "")
        table.append([network, name, k, f"{median:,.0f}", f"{p90:,.0f}", f"{rate:,.0f}",
                      "" if config == "local" else f"{local:,.0f}"])
        records.append(dict(network=network, config=name, clients=k, rt_median_us=median, rt_p90_us=p90,
                            obs_per_s=rate, local_obs_per_s=local, per_round=results))
    print_table(["network", "configuration", "clients", "round trip µs (median)", "p90 µs", "obs/s",
                 "local obs/s"], table)
    print(f"\n{args.rows} observations per request, medians of {args.rounds} rounds of {args.seconds} s; "
          "indicative only: shared CPU cores.")
    record(args.record_as, {"args": vars(args), "results": records})


if __name__ == "__main__":
    main()
