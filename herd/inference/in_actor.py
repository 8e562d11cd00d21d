"""The inference server's batched path inside each actor's own process
(--actor_inference=in_actor): no server process and no round trip to one.

The actor builds channels of its own (one client per lane), a BatchServer on --device
over them and an inline doorbell (doorbells.py): its InferenceClient writes a request as
it would for a server, the ring launches that batch in the actor's thread (on a GPU the
forward pass runs while a double-buffered actor steps its other half), and the wait
finishes it. So the actor acts exactly as a served one, with the same uniforms, the same
sampling, the same weights path (host shared memory, or the learner's device board on
its GPU), the same CUDA graphs and, with --inference_records, the same recording into
the learner's device mirror; what it saves is the two wake-ups of every request.

This is EnvPool's and Sebulba's shape when the actors are few and each steps many games
with ale_vector's threads (--worker_count 2 --envs_per_worker 64 --env_threads 8
--env_batch_size 32): a GPU then acts for a large batch per request, with a CUDA context
per actor process instead of one per server. Whether it beats actors served by servers is
measured on a GPU box (benchmarks/throughput.py's on-policy-server-in-actor configurations)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from herd.device_weights import DeviceWeightBoard
from herd.inference.channels import RUNNING, SERVER_PID, SERVER_STATE, InferenceChannels
from herd.inference.forward import ServerOptions
from herd.inference.records import StepRecords, recorded_by
from herd.inference.routing import InferenceRoute
from herd.inference.server import BatchServer
from herd.weights import SharedWeights


@dataclass(frozen=True)
class InActorInference:
    """What an actor needs to act through its own BatchServer (picklable: handed to each
    actor process, which builds the rest in start())."""
    model_kwargs: dict
    weights: SharedWeights | DeviceWeightBoard
    device: str
    options: ServerOptions
    lanes: int = 1                      # two with --actor_double_buffer
    rows: int = 1                       # the most observations a lane sends at once
    features: bool = True               # the channels carry feature vectors (a replay reads them)
    records: StepRecords | None = None  # where the steps are recorded (None: the actor writes them)

    def route(self, actor_id: int) -> "InActorInference":
        """The same for every actor: each runs its own server (ActorPool asks each actor's route)."""
        return self

    def start(self) -> InferenceRoute:
        """In the actor's process: its channels and BatchServer; the route its clients take."""
        channels = InferenceChannels.for_model(self.model_kwargs, self.lanes, self.rows, mechanism="inline",
                                               with_features=self.features, with_places=self.records is not None)
        server = BatchServer(channels, self.model_kwargs, self.weights, torch.device(self.device), self.options,
                             self.records)
        channels.doorbell.serve_with(server)
        info = channels.server.numpy()
        info[SERVER_PID], info[SERVER_STATE] = os.getpid(), RUNNING
        return InferenceRoute.alone(channels, self.lanes, restart_timeout=0.0,
                                    recorded=recorded_by(self.records))
