"""Sizes checked from the config before anything is built (herd/sizes.py). The
size bombs run the real CLI in a child process under a 3 GB address-space cap, so that
code that builds first ends there in a MemoryError or allocator
traceback instead of taking the machine's memory; the other refusals call prepare()."""
import resource
import subprocess
import sys

import pytest
import torch

import herd.plan
import herd.sizes
from herd_testing import ROOT
from herd.config import ConfigError
from herd.plan import prepare

CAP = 3 * 2**30


def capped():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def herd_capped(args, results):
    """herd train in a child under the cap: (exit code, stderr lines)."""
    result = subprocess.run([sys.executable, "-m", "herd.cli", "train", *args, f"--results_dir={results}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=180, preexec_fn=capped)
    return result.returncode, result.stderr.strip().splitlines()


@pytest.mark.parametrize("args, words", [
    # Before: allocator tracebacks (40 GB and 16 TB asked of the allocator).
    (["--env=CartPole-v1", "--hidden_sizes=100000,100000"], "GiB of parameters"),
    (["--env=CartPole-v1", "--use_lstm=True", "--lstm_size=1000000"], "--lstm_size=1000000"),
    # Before: a numpy MemoryError after the env was made; and 3.8 GB held before a misleading line.
    (["--env=PongNoFrameskip-v4", "--frame_scale_resolution=50000,50000"], "makes observations of 9,537 MiB"),
    (["--env=PongNoFrameskip-v4", "--frames_stacked=100000"], "--frames_stacked=100000 makes observations"),
])
def test_size_bombs_are_one_line_and_exit_2_before_anything_is_built(tmp_path, args, words):
    code, lines = herd_capped(args, tmp_path / "results")
    assert code == 2 and len(lines) == 1 and words in lines[0], lines[-5:]
    assert not (tmp_path / "results").exists()


def refusal(tmp_path, **options) -> str:
    with pytest.raises(ConfigError) as caught:
        prepare({"env": "CartPole-v1", "results_dir": str(tmp_path), **options})
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("options, words", [
    # Before: each passed validation.
    ({"learner_timeout": "1e300"}, "--learner_timeout=1e+300 s is longer than a week"),
    ({"caching_threads": "100000"}, "--caching_threads=100000 is more threads"),
    ({"env_threads": "100000"}, "--env_threads=100000 is more threads"),
    ({"learner_thread_count": "100000"}, "--learner_thread_count=100000 is more threads"),
    # Before: prefetched batches and the writer queue were not counted at all.
    ({"caching": "True", "cache_output_buffer_size": str(10**9)}, "prefetched batches"),
    ({"caching": "True", "cache_sample_size": str(10**9)}, "prefetched batches"),
    ({"replay_writer_queue_size": str(10**10)}, "writer queue"),
])
def test_threads_queues_and_timeouts_are_bounded(tmp_path, options, words):
    assert words in refusal(tmp_path, **options)


def test_trajectory_slots_are_checked_against_free_shared_memory(tmp_path, monkeypatch):
    """Before: /dev/shm was never looked at; a full one failed when the slots were made."""
    class Usage:
        free = 1024
    monkeypatch.setattr(herd.sizes.shutil, "disk_usage", lambda path: Usage())
    assert "shared memory" in refusal(tmp_path)


def test_memory_is_compared_with_what_is_available_not_the_total(tmp_path, monkeypatch):
    """Before: with 64 GiB installed and 1 GiB available, a 10 GiB replay passed."""
    class Memory:
        total, available = 64 * 2**30, 2**30
    monkeypatch.setattr(herd.sizes.psutil, "virtual_memory", lambda: Memory())
    trajectory = prepare({"env": "CartPole-v1", "results_dir": str(tmp_path)}).layout.nbytes()
    capacity = 10 * 2**30 // trajectory
    replays = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
               f'{{"type": "standard", "capacity": {capacity}, "sample_ratio": 0.5}}]')
    assert "1.0 GiB of memory is available" in refusal(tmp_path, replay_parameters=replays)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory: you tried to allocate 40 GB")])
def test_allocation_failures_while_preparing_become_one_line(tmp_path, monkeypatch, error):
    """Memory taken by others between the checks and the build: one line, not a traceback."""
    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(herd.plan, "describe_env", fail)
    assert "memory" in refusal(tmp_path)


def test_other_runtime_errors_are_not_disguised(tmp_path, monkeypatch):
    """Only allocation failures become the memory line: a bug stays a traceback."""
    def fail(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(herd.plan, "describe_env", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        prepare({"env": "CartPole-v1", "results_dir": str(tmp_path)})


def test_a_default_atari_plan_passes_the_checks(tmp_path):
    """The bounds leave real configurations alone: Pong with the seed's defaults."""
    plan = prepare({"env": "PongNoFrameskip-v4", "results_dir": str(tmp_path)})
    assert plan.env_spec.obs_shape == (4, 84, 84)


def big_replay_plan(tmp_path, gib_of_replay: int):
    trajectory = prepare({"env": "CartPole-v1", "results_dir": str(tmp_path)}).layout.nbytes()
    capacity = gib_of_replay * 2**30 // trajectory
    replays = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
               f'{{"type": "standard", "capacity": {capacity}, "sample_ratio": 0.5}}]')
    return prepare({"env": "CartPole-v1", "results_dir": str(tmp_path), "replay_parameters": replays})


def test_a_gpu_learners_replays_are_checked_against_the_gpus_free_memory(tmp_path, monkeypatch):
    """On a GPU learner every replay lives in GPU memory (herd/store.py).
    Catches a check that counts them against the host (a 4 GiB replay on a GPU with 1 GiB
    free would pass, then fail allocating at start; one that fits the GPU would be refused
    for want of host memory), and one that forgets the replay server keeps them on the host."""
    plan = big_replay_plan(tmp_path, 4)
    monkeypatch.setattr(herd.sizes, "learner_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(herd.sizes.torch.cuda, "is_available", lambda: True)
    small_gpu, big_gpu = (lambda device: 2**30), (lambda device: 64 * 2**30)
    with pytest.raises(ConfigError, match=r"the replays need 4\.0 GiB of GPU memory .* cuda has 1\.0 GiB free"):
        herd.sizes.check_memory(plan.cfg, plan.layout, device_free=small_gpu)

    class SmallHost:
        total, available = 64 * 2**30, 2**30
    monkeypatch.setattr(herd.sizes.psutil, "virtual_memory", lambda: SmallHost())
    herd.sizes.check_memory(plan.cfg, plan.layout, device_free=big_gpu)      # not counted against the host
    plan.cfg.parallel.replay_server = True                                    # a host process holds them
    with pytest.raises(ConfigError, match="1.0 GiB of memory is available"):
        herd.sizes.check_memory(plan.cfg, plan.layout, device_free=big_gpu)
