"""A run: check the plan (herd/plan.py), make the results folder, then train, resume or
test; and `herd multi`, experiments in sequence. The top of the import graph: nothing in
herd imports this module."""
from __future__ import annotations

import itertools
import json
import logging
import random
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from herd import stopping
from herd.backends.start import start_fork_server
from herd.checkpoint import CHECKPOINT_DIR
from herd.config import Config, ConfigError, check_option
from herd.envs.actor_envs import ENV_BACKEND_WORDS
from herd.errors import UserError
from herd.evaluation import test_policy
from herd.files import LinkedPathError, run_subfolder, write_json
from herd.inputs import check_experiments, describe, excerpt, read_experiments
from herd.plan import describe_ignored, prepare, run_tags
from herd.provenance import provenance
from herd.devices import learner_device, use_deterministic_algorithms
from herd.learner.distributed import from_primary, leave_group, torchrun_group, torchrun_world_size
from herd.training import learner_logging, train

log = logging.getLogger("herd")

USER_ERRORS = (UserError,)


class RunDirError(UserError):
    """The run folder cannot be made (prepare() checked the path, but the file system can
    still refuse: a read-only mount, a full disk, a folder removed meanwhile)."""


def run_folder_name(cfg: Config, now: float) -> str:
    """[<name>_][<tag>+<tag>_]<env>_<algorithm>_<YYYYmmdd-HHMMSS>: a listing of results/
    says what each run was, and sorts one configuration's runs by time."""
    env = re.sub(r"[^A-Za-z0-9._-]", "-", cfg.env.env)       # MinAtar/Breakout-v1, my_pkg:MyEnv-v0
    parts = [cfg.general.name, "+".join(run_tags(cfg)) or None, env, cfg.general.algorithm,
             time.strftime("%Y%m%d-%H%M%S", time.localtime(now))]
    return "_".join(part for part in parts if part)


def make_run_dir(cfg: Config, base: Path | None = None, name: str | None = None) -> Path:
    """results/<run_folder_name>, unique even when two runs start in the same second (-2, -3...).
    base, name: another place and name (a test's folder inside the run it tests)."""
    base = Path(cfg.general.results_dir) if base is None else base
    name = name or run_folder_name(cfg, time.time())
    for attempt in itertools.count(1):
        run_dir = base / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            return run_dir
        except FileExistsError:
            if not run_dir.is_dir():   # a file on the way (not a taken name): another suffix cannot help
                raise RunDirError(f"cannot create the run folder '{run_dir}': a file is in the way") from None
        except OSError as err:
            raise RunDirError(f"cannot create the run folder '{run_dir}': {err.strerror or err}") from None
    raise AssertionError("unreachable")


def test_dir(plan, command_line: dict) -> Path:
    """Where `herd test` writes: <run>/tests/<time> inside the run it tests, unless
    --results_dir was typed (then <results_dir>/test_<run>_<time>), or the checkpoint is a
    lone file outside any run folder (then the results folder)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    checkpoint = Path(plan.checkpoint_path)
    run = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINT_DIR else None
    if "results_dir" in command_line or run is None or not (run / "config.json").is_file():
        tested = run.name if run is not None else checkpoint.stem
        return make_run_dir(plan.cfg, name=f"test_{tested}_{stamp}")
    return make_run_dir(plan.cfg, base=run_subfolder(run, "tests"), name=stamp)   # a linked tests/ is refused


class RunLogFile(logging.FileHandler):
    """log.txt; when it cannot be written (a full disk), one console line says so and the
    run goes on logging to the console, instead of logging's traceback per record."""

    broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.broken:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        self.broken = True
        err = sys.exc_info()[1]
        print(f"[herd] cannot write {self.baseFilename} ({err}): logging to the console only", file=sys.stderr)


def setup_logging(run_dir: Path, debug: bool) -> None:
    for handler in list(log.handlers):  # a previous experiment's log file (herd multi)
        handler.close()
        log.removeHandler(handler)
    log.setLevel(logging.DEBUG if debug else logging.INFO)
    log.propagate = False
    file_handler = RunLogFile(run_dir / "log.txt")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[herd] %(message)s"))
    log.addHandler(file_handler)
    log.addHandler(console)


def seed_everything(cfg: Config) -> None:
    seed = cfg.general.seed
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # Set either way: in `herd multi` one experiment's choice must not leak into the next.
    use_deterministic_algorithms(cfg.general.reproducible)


def prepare_run(options: dict, overrides: dict | None = None):
    """prepare(), which checks the run folder's name too: a Plan, or a UserError's one line."""
    return prepare(options, overrides)


def run_experiment(options: dict, overrides: dict | None = None, argv: list[str] | None = None) -> int:
    """Runs one experiment; returns the process exit code (2 for bad input). argv: the
    command line that asked for it, as recorded in the run (default: sys.argv)."""
    return run_experiment_folder(options, overrides, argv)[0]


def run_experiment_folder(options: dict, overrides: dict | None = None,
                          argv: list[str] | None = None) -> tuple[int, Path | None]:
    """run_experiment, and the run folder it made (None when it made none)."""
    try:
        plan = prepare_run(options, overrides)
    except USER_ERRORS as err:
        print(f"herd: error: {err}", file=sys.stderr)
        return 2, None
    return run_plan(plan, options, argv)


def run_plan(plan, options: dict | None = None, argv: list[str] | None = None) -> tuple[int, Path | None]:
    """Runs a checked plan: (the exit code, the run folder or None when none was made).
    The Python API (herd/api.py) calls this to learn which folder its run wrote.
    options: the command line's options (where `herd test` writes depends on them); argv:
    the command line that asked for the run, as recorded in it (default: sys.argv)."""
    if stopping.requested():   # Ctrl+C or SIGTERM while checking: nothing was written yet
        print("[herd] stopped before the run started: no run folder was made", file=sys.stderr)
        return 0, None
    plan.provenance = provenance(sys.argv if argv is None else argv)
    if plan.cfg.general.op_mode != "test" and plan.cfg.parallel.multiprocessing_backend == "python_native":
        start_fork_server()    # the actors' fork server imports torch while the learner sets up
    if plan.cfg.general.op_mode != "test" and torchrun_world_size() is not None:
        return run_under_torchrun(plan), None
    try:
        run_dir = test_dir(plan, options or {}) if plan.cfg.general.op_mode == "test" else make_run_dir(plan.cfg)
        setup_logging(run_dir, plan.cfg.general.debug)
        seed_everything(plan.cfg)
        write_config(plan, run_dir)
    except OSError as err:
        print(f"herd: error: cannot write the run folder: {' '.join(str(err).split())}", file=sys.stderr)
        return 1, None
    except RunDirError as err:
        print(f"herd: error: {err}", file=sys.stderr)
        return 1, None
    except LinkedPathError as err:     # a run folder's tests/ linked out of it: bad input, nothing written
        print(f"herd: error: {err}", file=sys.stderr)
        return 2, None
    log.info("run folder %s", run_dir)
    if plan.ignored_saved:
        log.info(describe_ignored(plan.ignored_saved))
    if plan.cfg.general.op_mode != "test" and plan.machine_picks and plan.machine_picks["options"]:
        log.info("picked for this machine (%s): %s", describe_hardware(plan.machine_picks["hardware"]),
                 ", ".join(f"{name}={value}" for name, value in plan.machine_picks["options"].items()))
    if plan.cfg.general.op_mode == "test":
        return interruptible_test(plan, run_dir), run_dir
    p = plan.cfg.parallel
    log.info("actors: %d x %d environments, stepped by %s", p.worker_count, p.envs_per_worker,
             ENV_BACKEND_WORDS[p.env_backend])
    return train(plan, run_dir), run_dir


def interruptible_test(plan, run_dir: Path) -> int:
    """Test mode writes nothing until its games are complete, so a stop may interrupt it
    anywhere: SIGINT and SIGTERM raise KeyboardInterrupt, which test_policy turns into
    'no results written' (exit 130), as one line."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in stopping.STOP_SIGNALS}
    try:
        if stopping.requested():
            raise KeyboardInterrupt
        return test_policy(plan, run_dir)
    except KeyboardInterrupt:
        log.warning("test interrupted before its games began: no results written")
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def describe_hardware(hardware: dict) -> str:
    """'a GPU' or '2 CPU cores with bf16 units' (herd.config.machine_picks' hardware)."""
    if hardware["device"] == "cuda":
        return "a GPU learner"
    because = f" ({hardware['bf16_because']})" if hardware.get("bf16_because") else ""
    return f"{hardware['cpu_cores']} CPU cores, {'with' if hardware['bf16_units'] else 'without'} fast bf16{because}"


def write_config(plan, run_dir: Path) -> None:
    config = plan.cfg.to_flat()
    if plan.checkpoint_path is not None:
        config["continues_from"] = str(plan.checkpoint_path)
    if plan.machine_picks is not None:
        config["picked_for_this_machine"] = plan.machine_picks
    config["provenance"] = plan.provenance
    write_json(run_dir / "config.json", config)


def run_under_torchrun(plan) -> int:
    """torchrun started every learner process: they join one group, and learner 0 makes
    the run folder and picks the seed for all of them."""
    cfg = plan.cfg
    group = torchrun_group(learner_device(cfg.general.device).type, cfg.parallel.learner_timeout)
    try:
        run_dir = make_run_dir(cfg) if group.primary else None
        folder, cfg.general.seed = from_primary([None if run_dir is None else str(run_dir), cfg.general.seed])
        run_dir = Path(folder)      # JSON, never a pickle, crosses between the learners
        if group.primary:
            setup_logging(run_dir, cfg.general.debug)
            write_config(plan, run_dir)
            log.info("run folder %s (torchrun: %d learners)", run_dir, group.size)
            if plan.ignored_saved:
                log.info(describe_ignored(plan.ignored_saved))
        else:
            learner_logging(group.rank, cfg.general.debug)
        seed_everything(cfg)
        return train(plan, run_dir, group)
    finally:
        leave_group()


def load_experiments(path: str) -> list[dict]:
    """The experiments of a JSON or YAML file, size, depth and values checked (herd.inputs)."""
    experiments = read_experiments(path)
    check_experiments(experiments, check_option)
    return experiments


def stopped_by_signal(code: int, run_dir: Path | None) -> bool:
    """Ctrl+C or SIGTERM: a training run stops cleanly and exits 0, but says so in its own
    summary (its own folder's only: the results folder is shared with other runs, whose
    stops are not this sequence's), and this process's stop flag is set."""
    if code == 130 or stopping.requested():
        return True
    if run_dir is None:
        return False
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):            # no summary (the run failed before it): no stop said
        return False
    return isinstance(summary, dict) and summary.get("ended") == "stopped"


def run_multi(experiments: list[dict], command_line: dict, argv: list[str] | None = None) -> int:
    """Runs experiments in sequence; a failing one is logged and the rest go on, but a stop
    request (Ctrl+C, SIGTERM) ends the sequence. Returns 0 when all succeeded, 1 when any
    failed, 130 when stopped."""
    try:
        check_experiments(experiments, check_option)    # before any is echoed: values are bounded then
    except ConfigError as err:
        print(f"herd: error: {err}", file=sys.stderr)
        return 2
    bad = first_bad_experiment(experiments, command_line)
    if bad:
        print(f"herd: error: {bad}", file=sys.stderr)
        return 2
    failed = []
    for index, overrides in enumerate(experiments, start=1):
        if stopping.requested():   # a stop between two experiments ends the sequence too
            return 130
        print(f"[herd] experiment {index}/{len(experiments)}: {describe(overrides)}", file=sys.stderr)
        run_dir = None
        try:
            code, run_dir = run_experiment_folder(command_line, overrides, argv)
        except Exception as err:  # one broken experiment must not stop the others
            print(f"[herd] experiment {index} raised {type(err).__name__}: {err}", file=sys.stderr)
            code = 1
        if stopped_by_signal(code, run_dir):
            print(f"[herd] stopped during experiment {index}; experiments {index + 1}..{len(experiments)} "
                  "were not run", file=sys.stderr)
            return 130
        if code != 0:
            # Named here too: the experiment's own error line may be far up in a long log.
            print(f"[herd] experiment {index} failed (exit code {code}): {describe(overrides)}", file=sys.stderr)
            failed.append(index)
    print(f"[herd] {len(experiments) - len(failed)}/{len(experiments)} experiments succeeded"
          + (f"; failed: {', '.join(map(str, failed))}" if failed else ""), file=sys.stderr)
    return 0 if not failed else 1


def first_bad_experiment(experiments: list[dict], command_line: dict) -> str | None:
    """Checks every experiment with prepare() (which writes nothing) before the first runs,
    so a typo in the last one costs one line now, not a failure hours later. Returns the
    first problem as one line, or None."""
    for index, overrides in enumerate(experiments, start=1):
        try:
            prepare_run(command_line, overrides)
        except USER_ERRORS as err:
            return f"experiment {index}/{len(experiments)} {describe(overrides)}: {err} (nothing was run)"
    return None


def run_multi_file(path: str, command_line: dict, argv: list[str] | None = None) -> int:
    import yaml
    try:
        experiments = load_experiments(path)
    except ConfigError:
        raise
    except (OSError, ValueError, yaml.YAMLError) as err:  # YAMLError is no ValueError
        reason = excerpt(" ".join(str(err).split()), 200)  # YAML's messages span lines and quote the input
        raise ConfigError(f"cannot read experiments from '{excerpt(path)}': {reason}") from None
    return run_multi(experiments, command_line, argv)
