"""A run: check the plan (herd/plan.py), make the results folder, then train, resume or
test; and `herd multi`, experiments in sequence. The top of the import graph: nothing in
herd imports this module."""
from __future__ import annotations

import json
import logging
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from herd import stopping
from herd.config import Config, ConfigError, resolve
from herd.errors import UserError
from herd.evaluate import test_policy
from herd.files import write_json
from herd.plan import prepare
from herd.devices import learner_device, use_deterministic_algorithms
from herd.learner.distributed import from_primary, leave_group, torchrun_group, torchrun_world_size
from herd.train import learner_logging, train

log = logging.getLogger("herd")

USER_ERRORS = (UserError,)


class RunDirError(UserError):
    """The run folder cannot be made (prepare() checked the path, but the file system can
    still refuse: a read-only mount, a full disk, a folder removed meanwhile)."""


def make_run_dir(cfg: Config) -> Path:
    """results/<env>_<unix_timestamp>, unique even when two runs start in the same second."""
    base = Path(cfg.general.results_dir)
    name = cfg.env.env.replace("/", "-")
    stamp = int(time.time())
    while True:
        run_dir = base / f"{name}_{stamp}"
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            return run_dir
        except FileExistsError:
            if not run_dir.is_dir():   # a file on the way (not a taken name): another stamp cannot help
                raise RunDirError(f"cannot create the run folder '{run_dir}': a file is in the way") from None
            stamp += 1
        except OSError as err:
            raise RunDirError(f"cannot create the run folder '{run_dir}': {err.strerror or err}") from None


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


def run_experiment(options: dict, overrides: dict | None = None) -> int:
    """Runs one experiment; returns the process exit code (2 for bad input)."""
    try:
        plan = prepare(options, overrides)
    except USER_ERRORS as err:
        print(f"herd: error: {err}", file=sys.stderr)
        return 2
    if stopping.requested():   # Ctrl+C or SIGTERM while checking: nothing was written yet
        print("[herd] stopped before the run started: no run folder was made", file=sys.stderr)
        return 0
    if plan.cfg.general.op_mode != "test" and torchrun_world_size() is not None:
        return run_under_torchrun(plan)
    try:
        run_dir = make_run_dir(plan.cfg)
        setup_logging(run_dir, plan.cfg.general.debug)
        seed_everything(plan.cfg)
        write_config(plan, run_dir)
    except OSError as err:
        print(f"herd: error: cannot write the run folder: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    except RunDirError as err:
        print(f"herd: error: {err}", file=sys.stderr)
        return 1
    log.info("run folder %s", run_dir)
    if plan.cfg.general.op_mode != "test" and plan.machine_picks and plan.machine_picks["options"]:
        log.info("picked for this machine (%s): %s", describe_hardware(plan.machine_picks["hardware"]),
                 ", ".join(f"{name}={value}" for name, value in plan.machine_picks["options"].items()))
    if plan.cfg.general.op_mode == "test":
        return interruptible_test(plan, run_dir)
    return train(plan, run_dir)


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
    write_json(run_dir / "config.json", config)


def run_under_torchrun(plan) -> int:
    """torchrun started every learner process: they join one group, and learner 0 makes
    the run folder and picks the seed for all of them."""
    cfg = plan.cfg
    group = torchrun_group(learner_device(cfg.general.device).type, cfg.parallel.learner_timeout)
    try:
        run_dir = make_run_dir(cfg) if group.primary else None
        run_dir, cfg.general.seed = from_primary([run_dir, cfg.general.seed])
        if group.primary:
            setup_logging(run_dir, cfg.general.debug)
            write_config(plan, run_dir)
            log.info("run folder %s (torchrun: %d learners)", run_dir, group.size)
        else:
            learner_logging(group.rank, cfg.general.debug)
        seed_everything(cfg)
        return train(plan, run_dir, group)
    finally:
        leave_group()


def load_experiments(path: str) -> list[dict]:
    text = Path(path).read_text()
    if path.endswith((".yaml", ".yml")):
        import yaml
        experiments = yaml.safe_load(text)
    else:
        experiments = json.loads(text)
    if not isinstance(experiments, list) or not all(isinstance(e, dict) for e in experiments):
        raise ConfigError(f"{path} must hold a list of experiments, each a dict of options")
    return experiments


def summaries(command_line: dict, overrides: dict) -> set[Path]:
    """The summary.json files now in the experiment's results folder."""
    try:
        results = Path(resolve(command_line, overrides).general.results_dir)
    except ConfigError:
        return set()
    return set(results.glob("*/summary.json"))


def stopped_by_signal(code: int, before: set[Path], after: set[Path]) -> bool:
    """Ctrl+C or SIGTERM: a training run stops cleanly and exits 0, but says so in its summary."""
    if code == 130:
        return True
    for path in after - before:
        try:
            if json.loads(path.read_text()).get("ended") == "stopped":
                return True
        except (OSError, ValueError):  # another process's half-visible file: not ours to judge
            continue
    return False


def run_multi(experiments: list[dict], command_line: dict) -> int:
    """Runs experiments in sequence; a failing one is logged and the rest go on, but a stop
    request (Ctrl+C, SIGTERM) ends the sequence. Returns 0 when all succeeded, 1 when any
    failed, 130 when stopped."""
    bad = first_bad_experiment(experiments, command_line)
    if bad:
        print(f"herd: error: {bad}", file=sys.stderr)
        return 2
    failed = []
    for index, overrides in enumerate(experiments, start=1):
        if stopping.requested():   # a stop between two experiments ends the sequence too
            return 130
        print(f"[herd] experiment {index}/{len(experiments)}: {json.dumps(overrides)}", file=sys.stderr)
        before = summaries(command_line, overrides)
        try:
            code = run_experiment(command_line, overrides)
        except Exception as err:  # one broken experiment must not stop the others
            print(f"[herd] experiment {index} raised {type(err).__name__}: {err}", file=sys.stderr)
            code = 1
        if stopped_by_signal(code, before, summaries(command_line, overrides)):
            print(f"[herd] stopped during experiment {index}; experiments {index + 1}..{len(experiments)} "
                  "were not run", file=sys.stderr)
            return 130
        if code != 0:
            # Named here too: the experiment's own error line may be far up in a long log.
            print(f"[herd] experiment {index} failed (exit code {code}): {json.dumps(overrides)}", file=sys.stderr)
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
            prepare(command_line, overrides)
        except USER_ERRORS as err:
            return f"experiment {index}/{len(experiments)} {json.dumps(overrides)}: {err} (nothing was run)"
    return None


def run_multi_file(path: str, command_line: dict) -> int:
    import yaml
    try:
        experiments = load_experiments(path)
    except ConfigError:
        raise
    except (OSError, ValueError, yaml.YAMLError) as err:  # YAMLError is no ValueError
        reason = " ".join(str(err).split())                # YAML's messages span lines
        raise ConfigError(f"cannot read experiments from '{path}': {reason}") from None
    return run_multi(experiments, command_line)
