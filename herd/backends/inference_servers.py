"""The local backend's batched inference servers: S server processes on one device, actor
i served by server i mod S at first, each restarted when it dies while its actors wait; with
--inference_servers unset, more servers as their measured load asks for them.

    actor 0, S, 2S, ... --shared memory--> server 0 --+
    actor 1, S+1, ...   --shared memory--> server 1 --+-- pull SharedWeights between batches
    ...                                                (or, on the learner's own GPU, its
                                                       DeviceWeightBoard: herd/device_weights.py)

Every server's channels have a client slot for each actor (routing.py), and a shared route
table says which server an actor asks. Growing: every LOAD_WINDOW s the supervisor reads each
server's CPU time and life (written by the server into its header) and takes their ratio
over the window; where the busiest server is above `grow_at` of a core and fewer than `most`
run, it starts another, and once that one serves (its header says so) moves every second
actor of the busy server to it. Actors move between requests (routing.RoutedClient), so no
request is lost or answered twice. The count never shrinks: an idle server only sleeps.

A server keeps no state of its own that a request needs (channels.py): a replacement
started on the same channels answers the requests its predecessor left pending, so the
actors only wait (their clients poll for a new server for up to routing.RESTART_WAIT s)
and go on. With --inference_records the servers also write the rows they act on into the
trajectories (herd/inference/records.py: the actors' slots on a CPU, a mirror of them on
the learner's GPU). Restarts are counted in summary.json (inference_server_restarts) and bounded by
--max_actor_restarts, like actors'."""
from __future__ import annotations

import logging
import time

import psutil

from herd.errors import ActorFailure
from herd.inference import InferenceChannels, ServerOptions, run_inference_server
from herd.inference.records import StepRecords, recorded_by
from herd.inference.routing import InferenceRoute, RouteTable
from herd.stopping import sigint_blocked

log = logging.getLogger("herd")

LOAD_WINDOW = 5.0       # s: the window a server's load is measured over before a server is added
# A server busier than this share of a core (with --inference_servers unset) gets another
# beside it. Its actors wait in its queue: at a load of 0.6 a request waits, on average, 1.5
# times as long as its own batch takes before that batch starts (an M/M/1 queue's rho / (1 - rho)).
GROW_AT = 0.6


class InferenceServers:
    """Starts, watches, restarts, adds and stops the servers for `worker_count` actors."""

    def __init__(self, model_kwargs: dict, worker_count: int, count: int, rows: int, weights, device: str, stop,
                 context, options: ServerOptions, lanes: int = 1, features: bool = True, torch_threads: int = 1,
                 seed: int = 0, max_restarts: int = 20, registry: dict | None = None,
                 records: StepRecords | None = None, doorbell: str = "semaphore", most: int | None = None,
                 grow_at: float | None = None, idle_cores: float = 1.0):
        """count: the servers started at first; most: the most the run may start (count if
        None); grow_at: the load (share of a core over LOAD_WINDOW s) of a server above
        which another is added (None: the count is fixed), where the machine's cores were
        at least `idle_cores` idle over that window (a server on busy cores only takes
        them from the actors)."""
        most = count if most is None else most
        if not 1 <= count <= most <= worker_count:
            raise ValueError(f"{count} inference servers (at most {most}) for {worker_count} actors: give each "
                             f"server an actor")
        self.model_kwargs, self.worker_count, self.count, self.lanes = model_kwargs, worker_count, count, lanes
        self.weights, self.device, self.stop_event, self.context = weights, device, stop, context
        self.options, self.torch_threads, self.seed = options, torch_threads, seed
        self.max_restarts, self.restarts = max_restarts, 0
        self.registry = registry if registry is not None else {}
        self.records = records       # where the servers record the steps they act on (None: the actors write them)
        self.most, self.grow_at, self.idle_cores = most, grow_at, idle_cores
        self.table = RouteTable(worker_count, count, lanes)
        # rows: the most observations one client (lane) sends at once; every server has a
        # client slot for each lane of each actor, so that actors can move between them.
        self.channels = [InferenceChannels.for_model(model_kwargs, lanes * worker_count, rows, mechanism=doorbell,
                                                     context=context, with_features=features,
                                                     with_places=records is not None)
                         for _ in range(most)]
        self.processes: list = [None] * most
        self.joining: tuple[int, int] | None = None     # (a started server not yet given actors, the busy one)
        self.window: tuple | None = None                # (its start, each server's usage, the cores' idle s)
        self.grown: list[dict] = []                     # each server added: when, why, for which actors
        self.started_at = time.monotonic()             # the seconds of `grown` count from here

    def route(self, actor_id: int) -> InferenceRoute:
        return InferenceRoute(tuple(self.channels), self.table, actor_id, self.lanes,
                              recorded=recorded_by(self.records))

    def start(self) -> None:
        for server in range(self.count):
            self.start_server(server)
        growth = (f"; more as their load asks, up to {self.most} (a server above {self.grow_at:g} of a core over "
                  f"{LOAD_WINDOW:g} s, with {self.idle_cores:g} core idle)"
                  if self.grow_at is not None and self.most > self.count else "")
        log.info("%d inference server%s on %s (pids %s) for %d actors: actor i served by server i mod %d%s%s%s",
                 self.count, "s" if self.count > 1 else "", self.device,
                 ", ".join(str(p.pid) for p in self.processes[:self.count]), self.worker_count, self.count,
                 ", double-buffered actors" if self.lanes == 2 else "",
                 ", requests and answers polled (spin)" if self.channels[0].mechanism == "spin" else "", growth)

    def start_server(self, server: int) -> None:
        process = self.context.Process(
            target=run_inference_server, name=f"herd-inference-{server}", daemon=True,
            args=(self.channels[server], self.model_kwargs, self.weights, self.device, self.stop_event),
            kwargs=dict(torch_threads=self.torch_threads, seed=self.seed + 100 * server + self.restarts,
                        options=self.options, records=self.records, table=self.table, index=server))
        with sigint_blocked():   # Ctrl+C reaches the group: the child must never see it
            process.start()
        self.processes[server] = process
        self.registry["inference" if self.most == 1 else f"inference-{server}"] = process.pid

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
            self.window = None                  # a replacement reports its own life: measure afresh
        if self.grow_at is not None:
            self.grow_if_loaded(time.monotonic())

    def grow_if_loaded(self, now: float) -> None:
        """Every LOAD_WINDOW s: adds a server beside the busiest one where its load over the
        window is above grow_at; hands it half of that server's actors once it serves."""
        if self.joining is not None:
            new, busy = self.joining
            if self.channels[new].running():
                moved = self.table.actors_of(busy)[1::2]
                self.table.move(moved, new)
                self.grown[-1]["actors"] = moved.tolist()
                log.info("inference server %d serves actors %s (from server %d)", new,
                         ", ".join(map(str, moved)), busy)
                self.joining, self.window = None, None
            return
        usage = [channels.usage() for channels in self.channels[:self.count]]
        idle = psutil.cpu_times().idle          # seconds, summed over the cores
        if self.window is None or any(not channels.running() for channels in self.channels[:self.count]):
            self.window = (now, usage, idle)    # from here, once every server serves
            return
        started, before, idle_before = self.window
        if now - started < LOAD_WINDOW:
            return
        self.window = (now, usage, idle)
        loads = window_loads(before, usage)
        busy = max(range(self.count), key=lambda s: loads[s] if loads[s] is not None else -1.0)
        idle_cores = (idle - idle_before) / (now - started)
        if not should_grow(loads[busy], idle_cores, self.grow_at, self.idle_cores, self.count, self.most,
                           len(self.table.actors_of(busy))):
            return
        new = self.count
        self.start_server(new)
        self.count += 1
        self.joining = (new, busy)
        self.grown.append({"server": new, "from": busy, "load": round(loads[busy], 3),
                           "idle_cores": round(idle_cores, 2), "after_s": round(now - self.started_at, 1)})
        log.info("inference server %d was %.2f of a core busy over the last %.0f s (above %g; %.1f cores idle): "
                 "starting server %d (pid %d) for half of its actors (%d of at most %d servers)", busy, loads[busy],
                 now - started, self.grow_at, idle_cores, new, self.processes[new].pid, self.count, self.most)

    def busy(self) -> list:
        """Each server's CPU time as a share of its life so far (1.0: a core busy all the
        time; start-up included), as the server last reported it (InferenceChannels.busy:
        also once it has exited; None before it reported): the measured load that says
        whether this machine needs more servers (a server near 1.0 is what its actors wait
        on) or fewer."""
        return [channels.busy() for channels in self.channels[:self.count]]

    def tallies(self) -> list[dict]:
        """Each server's answered batches so far (InferenceChannels.tally): with busy(), what
        limits the actors' round trip (a server near a core, or batches slow to answer)."""
        return [channels.tally() for channels in self.channels[:self.count]]

    def stop(self, timeout: float = 5.0) -> None:
        log.info("inference servers busy %s of a core each over their lives (near 1.0: the actors wait on them; "
                 "--inference_servers fixes how many)", ", ".join(map(str, self.busy())))
        for server, tally in enumerate(self.tallies()):
            log.info("inference server %d: %d batches, each %.1f rows from %.2f requests, launched %.0f us after "
                     "a request, answered %.0f us after its launch, the answer read %.0f us later (mean)", server,
                     tally["batches"], tally["mean_rows"], tally["mean_requests"], tally["mean_wait_us"],
                     tally["mean_answer_us"], tally["mean_taken_us"])
        self.stop_event.set()
        for process in self.processes:
            if process is None:
                continue
            process.join(timeout)
            if process.is_alive():
                process.terminate()
                process.join(2.0)


def window_loads(before: list, after: list) -> list:
    """Each server's CPU time over its life between two readings of InferenceChannels.usage
    (None where its life did not advance: not reported yet, or a replacement started)."""
    return [(cpu - cpu0) / (life - life0) if life > life0 else None
            for (cpu0, life0), (cpu, life) in zip(before, after)]


def should_grow(load: float | None, idle_cores: float, grow_at: float, min_idle: float, count: int, most: int,
                actors: int) -> bool:
    """Whether to add a server beside the busiest one, whose `load` over the last window
    was that share of a core: above grow_at, with at least `min_idle` cores idle over the
    window, fewer than `most` servers, and two actors of its to split."""
    return load is not None and load > grow_at and idle_cores >= min_idle and count < most and actors >= 2
