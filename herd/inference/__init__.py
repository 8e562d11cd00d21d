"""Batched inference server: actors send observations through shared memory to one process
that runs the policy for all of them (on the GPU where there is one), the Sample Factory /
SEED design.

Public API (everything else is internal):

    channels = InferenceChannels.for_model(model_kwargs, num_clients, max_rows, mechanism="semaphore")
        # or InferenceChannels(num_clients, max_rows, obs_shape, obs_dtype, num_actions, feature_size, ...)
        # Build in the main process before starting any process; pass to children as an argument.

    Process(target=run_inference_server,
            args=(channels, model_kwargs, weights, device, stop),
            kwargs=dict(torch_threads=1, seed=0, options=ServerOptions(...)))
        # weights: herd.weights.SharedWeights, or on the learner's own CUDA device its
        # herd.device_weights.DeviceWeightBoard; device: "cpu" or "cuda[:i]"; stop: an Event.
        # options: batch wait and min clients, weights interval, bf16, channels-last, CUDA graphs.
        # Exits when `stop` is set or its parent dies; ignores SIGINT. A new server started
        # on the same channels answers the requests a dead one left pending.

    policy = InferenceClient(channels, index, stop=None, seed=0, restart_timeout=0.0, record=None)
        policy.act(obs [n, *obs_shape], env_ids [n]=None, reset [n]=None) -> PolicyStep   # n <= max_rows
        policy.submit(obs, env_ids, reset) -> Pending; policy.collect(pending) -> PolicyStep   # act, split
        policy.value(obs [n, *obs_shape], env_ids [n]=None) -> value [n] float32
        # env_ids / reset matter with an LSTM core: the client keeps each env's state
        policy.refresh() -> version the server acts with now
        policy.close()
        # implements herd.interfaces.ActorPolicy; raises InferenceServerGone within
        # about poll_interval (0.1 s) once the server died or exited or `stop` is set (after
        # restart_timeout s without a new server where the backend restarts servers).

Several servers: herd/backends/inference_servers.py (actor i -> server i mod S, routing.py).
The server's path inside each actor instead (--actor_inference=in_actor): in_actor.py.

Protocol and its guarantees: see channels.py (shared memory, sequence numbers),
doorbells.py (wake-ups), client.py (sampling, dead-server detection), server.py (batching).
A restarted actor builds a new InferenceClient with the same index: it skips every
sequence number its predecessor used, so it never takes an answer meant for it.
"""
from herd.inference.channels import InferenceChannels
from herd.inference.client import InferenceClient, InferenceServerGone
from herd.inference.doorbells import MECHANISMS
from herd.inference.forward import ServerOptions
from herd.inference.server import run_inference_server

__all__ = ["InferenceChannels", "InferenceClient", "InferenceServerGone", "MECHANISMS", "ServerOptions",
           "run_inference_server"]
