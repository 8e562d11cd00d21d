"""Sizes checked from the config before anything is built or allocated: one observation, the
network's parameters (counted on torch's meta device, which allocates nothing), the
replays with the batches prepared ahead and the writer queue against the memory available
now (on a GPU learner, the replays against the GPU's free memory: they live there), the
trajectory slots against free /dev/shm, and thread and timeout options against the
machine. Each check raises ConfigError with one line.

Why: checked only after the env and model are built, a size too large ends in an
allocator traceback (--hidden_sizes=100000,100000 asks for 40 GB, --lstm_size=1000000 for
16 TB), or holds memory for seconds before a misleading message (--frames_stacked=100000,
--frame_scale_resolution=50000,50000)."""
from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any

import psutil
import torch

from herd.devices import learner_device
from herd.errors import ConfigError
from herd.models import build_model
from herd.validation import transition_items

if TYPE_CHECKING:
    from herd.config import Config
    from herd.trajectory import TrajectoryLayout

# One preprocessed observation (all stacked frames): Atari's is 28 KB (84x84x4), the full
# 210x160 RGB frames stacked 4 deep 400 KB; 64 MiB leaves room for any real use.
MAX_OBSERVATION_BYTES = 64 * 2**20
# Copies of the parameters in the learner: weights, gradients, two optimizer moments (Adam;
# RMSprop keeps one and momentum), plus a target network or the published copy.
LEARNER_COPIES = 5
# Threads of one kind past this many per core only time-share the cores; far past it a
# process runs out of threads or memory at start.
THREADS_PER_CORE = 4
MIN_THREAD_BOUND = 8
# A week: the learners' collective timeout goes to torch.distributed as a timedelta, and
# 1e300 seconds overflowed it (and is no timeout a user means).
MAX_LEARNER_TIMEOUT_S = 7 * 24 * 3600.0
# Share of the available memory a run may plan to use: the rest is for Python, torch,
# the environments and everything else on the machine.
MEMORY_SHARE = 0.8
SHM = "/dev/shm"


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def check_thread_options(cfg: Config) -> None:
    """Thread counts bounded by the machine's cores, and --learner_timeout by a week."""
    bound = max(MIN_THREAD_BOUND, THREADS_PER_CORE * (os.cpu_count() or 1))
    for name, value in (("learner_thread_count", cfg.train.learner_thread_count),
                        ("caching_threads", cfg.replay.caching_threads),
                        ("env_threads", cfg.parallel.env_threads)):
        if value is not None and value > bound:
            raise ConfigError(f"--{name}={value} is more threads than this machine can use (at most {bound}: "
                              f"{THREADS_PER_CORE} per core, {os.cpu_count() or 1} cores)")
    if cfg.parallel.learner_timeout > MAX_LEARNER_TIMEOUT_S:
        raise ConfigError(f"--learner_timeout={cfg.parallel.learner_timeout:g} s is longer than a week "
                          f"({MAX_LEARNER_TIMEOUT_S:g} s), the most allowed")


def check_observation_size(cfg: Config) -> None:
    """One preprocessed observation, from the options alone (before any env is made)."""
    e = cfg.env
    if len(e.frame_scale_resolution) != 2 or e.frames_stacked < 1:
        return                                  # validate() says what is wrong with them
    height, width = e.frame_scale_resolution
    channels = 1 if e.grayscaling_frames else 3
    nbytes = height * width * channels * e.frames_stacked     # uint8 frames [stack * C, H, W]
    if nbytes > MAX_OBSERVATION_BYTES:
        raise ConfigError(f"--frame_scale_resolution={height},{width} with --frames_stacked={e.frames_stacked} "
                          f"makes observations of {nbytes / 2**20:,.0f} MiB each (at most "
                          f"{MAX_OBSERVATION_BYTES // 2**20} MiB): lower them (Atari's are 84,84 and 4)")


def parameter_bytes(model_kwargs: dict[str, Any]) -> int:
    """Bytes of the parameters and buffers build_model(**model_kwargs) would make, counted
    on the meta device: shapes only, no memory, no initialisation."""
    with torch.device("meta"):
        model = build_model(**model_kwargs)
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def check_model_size(cfg: Config, model_kwargs: dict[str, Any], actor_copies: int) -> None:
    """The network's copies (the learner's LEARNER_COPIES and one per actor) must fit in
    the memory available."""
    try:
        nbytes = parameter_bytes(model_kwargs)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    needed = nbytes * (LEARNER_COPIES + actor_copies)
    available = psutil.virtual_memory().available
    if needed > MEMORY_SHARE * available:
        n = cfg.network
        shape = f"--hidden_sizes={','.join(map(str, n.hidden_sizes))}" + (
            f" and --lstm_size={n.lstm_size}" if n.use_lstm else "")
        raise ConfigError(f"the network ({shape}) has {nbytes / 2**30:,.2f} GiB of parameters, and its "
                          f"{LEARNER_COPIES + actor_copies} copies (learner and actors) need {gib(needed)} but "
                          f"{gib(available)} of memory is available: make it smaller")


def memory_needs(cfg: Config, layout: TrajectoryLayout) -> dict[str, int]:
    """Bytes of what a training run holds: {part: bytes}."""
    p, r = cfg.parallel, cfg.replay
    trajectory = layout.nbytes()
    # Ape-X's batches are transitions, r_f_steps to a trajectory; other batches trajectories.
    item = trajectory // cfg.train.r_f_steps if transition_items(cfg.replays) else trajectory
    batch = cfg.train.batch_size * item
    return {
        "replays": sum(spec.capacity for spec in cfg.replays if not spec.on_policy) * trajectory,
        # Batches prepared ahead: the ready ones plus those the threads are preparing.
        "prefetched batches": (r.cache_output_buffer_size + r.caching_threads * r.cache_sample_size) * batch
        if cfg.replay.caching else 0,
        # Rollouts waiting for the replay writer, each envs_per_worker trajectories.
        "writer queue": r.replay_writer_queue_size * p.envs_per_worker * trajectory,
        # The actors' trajectory slots (shared memory) and a copy each on the learner side.
        "trajectory slots": 2 * p.worker_count * p.shared_queue_size * p.envs_per_worker * trajectory,
    }


def cuda_free_bytes(device: torch.device) -> int:
    """The GPU's free memory now (this makes the learner's CUDA context: it needs one anyway)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def replays_in_device_memory(cfg: Config) -> torch.device | None:
    """The GPU whose memory the replays will occupy, or None when they stay on the host: a
    CUDA learner keeps every replay in its memory (herd/training.py build_mixer), except
    behind the Ray replay server (a host process)."""
    device = learner_device(cfg.general.device)
    return device if device.type == "cuda" and not cfg.parallel.replay_server else None


def check_memory(cfg: Config, layout: TrajectoryLayout, device_free=cuda_free_bytes) -> None:
    """Impossible sizes: what the run holds against the memory available now, and the
    trajectory slots against the free space of /dev/shm (where they are made). On a GPU
    learner the replays are counted against the GPU's free memory (uncompressed: device
    storage never packs frames), the rest against the host's. device_free(device) -> bytes."""
    needs = memory_needs(cfg, layout)
    device = replays_in_device_memory(cfg)
    if device is not None and torch.cuda.is_available():
        on_device = needs.pop("replays")
        free = device_free(device)
        if on_device > MEMORY_SHARE * free:
            raise ConfigError(f"the replays need {gib(on_device)} of GPU memory (a GPU learner keeps them there, "
                              f"frames unpacked) but {device} has {gib(free)} free: lower the replay capacities, "
                              "or use --device=cpu")
    needed = sum(needs.values())
    available = psutil.virtual_memory().available
    if needed > MEMORY_SHARE * available:
        parts = ", ".join(f"{name} {gib(nbytes)}" for name, nbytes in needs.items() if nbytes)
        raise ConfigError(f"this run needs {gib(needed)} ({parts}) but {gib(available)} of memory is available: "
                          "lower the replay capacities, envs_per_worker, r_f_steps or the queue sizes")
    slots = needs["trajectory slots"] // 2
    if cfg.parallel.multiprocessing_backend == "python_native" and os.path.isdir(SHM):
        free = shutil.disk_usage(SHM).free
        if slots > free:
            raise ConfigError(f"the trajectory slots need {gib(slots)} of shared memory but {SHM} has {gib(free)} "
                              "free: lower --shared_queue_size, --envs_per_worker or --r_f_steps, or enlarge "
                              f"{SHM}")
