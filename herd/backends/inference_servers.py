"""The local backend's batched inference servers: S server processes on one device, actor
i served by server i mod S (as client i // S of that server's channels), each restarted
when it dies while its actors wait.

    actor 0, S, 2S, ... --shared memory--> server 0 --+
    actor 1, S+1, ...   --shared memory--> server 1 --+-- pull SharedWeights between batches
    ...                                                (or, on the learner's own GPU, its
                                                       DeviceWeightBoard: herd/device_weights.py)

A server keeps no state of its own that a request needs (channels.py): a replacement
started on the same channels answers the requests its predecessor left pending, so the
actors only wait (their clients poll for a new server for up to routing.RESTART_WAIT s)
and go on. With --inference_records the servers also write the rows they act on into the
trajectories (herd/inference/records.py: the actors' slots on a CPU, a mirror of them on
the learner's GPU). Restarts are counted in summary.json (inference_server_restarts) and bounded by
--max_actor_restarts, like actors'."""
from __future__ import annotations

import logging

from herd.errors import ActorFailure
from herd.inference import InferenceChannels, ServerOptions, run_inference_server
from herd.inference.records import StepRecords
from herd.inference.routing import InferenceRoute, actors_of, route
from herd.stopping import sigint_blocked

log = logging.getLogger("herd")

class InferenceServers:
    """Starts, watches, restarts and stops the servers for `worker_count` actors."""

    def __init__(self, model_kwargs: dict, worker_count: int, count: int, rows: int, weights, device: str, stop,
                 context, options: ServerOptions, lanes: int = 1, features: bool = True, torch_threads: int = 1,
                 seed: int = 0, max_restarts: int = 20, registry: dict | None = None,
                 records: StepRecords | None = None, doorbell: str = "semaphore"):
        if not 1 <= count <= worker_count:
            raise ValueError(f"{count} inference servers for {worker_count} actors: give each server an actor")
        self.model_kwargs, self.worker_count, self.count, self.lanes = model_kwargs, worker_count, count, lanes
        self.weights, self.device, self.stop_event, self.context = weights, device, stop, context
        self.options, self.torch_threads, self.seed = options, torch_threads, seed
        self.max_restarts, self.restarts = max_restarts, 0
        self.registry = registry if registry is not None else {}
        self.records = records       # where the servers record the steps they act on (None: the actors write them)
        # rows: the most observations one client (lane) sends at once
        self.channels = [InferenceChannels.for_model(model_kwargs, lanes * len(actors_of(s, count, worker_count)),
                                                     rows, mechanism=doorbell, context=context, with_features=features,
                                                     with_places=records is not None)
                         for s in range(count)]
        self.processes: list = [None] * count

    def route(self, actor_id: int) -> InferenceRoute:
        server, place = route(actor_id, self.count)
        recorded = tuple(self.records.tensors) if self.records is not None else ()
        return InferenceRoute(self.channels[server], place * self.lanes, self.lanes, recorded=recorded)

    def start(self) -> None:
        for server in range(self.count):
            self.start_server(server)
        log.info("%d inference server%s on %s (pids %s) for %d actors: actor i served by server i mod %d%s%s",
                 self.count, "s" if self.count > 1 else "", self.device,
                 ", ".join(str(p.pid) for p in self.processes), self.worker_count, self.count,
                 ", double-buffered actors" if self.lanes == 2 else "",
                 ", requests and answers polled (spin)" if self.channels[0].mechanism == "spin" else "")

    def start_server(self, server: int) -> None:
        process = self.context.Process(
            target=run_inference_server, name=f"herd-inference-{server}", daemon=True,
            args=(self.channels[server], self.model_kwargs, self.weights, self.device, self.stop_event),
            kwargs=dict(torch_threads=self.torch_threads, seed=self.seed + 100 * server + self.restarts,
                        options=self.options, records=self.records))
        with sigint_blocked():   # Ctrl+C reaches the group: the child must never see it
            process.start()
        self.processes[server] = process
        self.registry["inference" if self.count == 1 else f"inference-{server}"] = process.pid

    def check_health(self) -> None:
        """Restarts every dead server on its channels; its actors, waiting, then go on."""
        for server, process in enumerate(self.processes):
            if process is None or process.is_alive():
                continue
            process.join(1.0)
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise ActorFailure(f"the inference servers died {self.restarts} times (more than "
                                   f"--max_actor_restarts={self.max_restarts}); the last one, server {server}, with "
                                   f"exit code {process.exitcode}; see the log")
            log.warning("inference server %d died (exit code %s): restarting it; its actors wait", server,
                        process.exitcode)
            self.start_server(server)

    def busy(self) -> list:
        """Each server's CPU time as a share of its life so far (1.0: a core busy all the
        time; start-up included), as the server last reported it (InferenceChannels.busy:
        also once it has exited; None before it reported): the measured load that says
        whether this machine needs more servers (a server near 1.0 is what its actors wait
        on) or fewer."""
        return [channels.busy() for channels in self.channels]

    def tallies(self) -> list[dict]:
        """Each server's answered batches so far (InferenceChannels.tally): with busy(), what
        limits the actors' round trip (a server near a core, or batches slow to answer)."""
        return [channels.tally() for channels in self.channels]

    def stop(self, timeout: float = 5.0) -> None:
        log.info("inference servers busy %s of a core each over their lives (near 1.0: the actors wait on them; "
                 "--inference_servers sets how many)", ", ".join(map(str, self.busy())))
        for server, tally in enumerate(self.tallies()):
            log.info("inference server %d: %d batches, each %.1f rows from %.2f requests, answered %.0f us after "
                     "its launch (mean)", server, tally["batches"], tally["mean_rows"], tally["mean_requests"],
                     tally["mean_answer_us"])
        self.stop_event.set()
        for process in self.processes:
            if process is None:
                continue
            process.join(timeout)
            if process.is_alive():
                process.terminate()
                process.join(2.0)
