"""One parser for `python main.py --op_mode=...` (the seed's flags, verbatim) and
`herd train|resume|test|multi ...`. Every dataclass field of herd.config is a flag,
under its seed name and a dashed alias (`--batch_size` and `--batch-size`)."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Sequence

from herd import stopping
from herd.errors import ConfigError, UserError

# herd.config (and with it torch) is imported inside the functions: main() must install
# the stop handlers before any slow import, or a Ctrl+C in the first seconds is a
# KeyboardInterrupt traceback and a SIGTERM a silent exit 143.


KIND_NAMES = {"atari": "Atari", "vector": "vector tasks", "minatar": "MinAtar", "continuous": "continuous control"}
DEVICE_NAMES = {"cpu": "with a CPU learner", "cuda": "with a GPU learner"}


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage and exits on error; we want one clear line."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(message)


def default_text(f: dataclasses.Field) -> str:
    """' [default: ...]' as a run gets it: from the field, or per environment kind where a
    profile sets it (so --help can never disagree with what runs)."""
    from herd.profiles import ALGORITHM_PROFILES, MACHINE_PROFILES, PROFILES
    per_kind = {KIND_NAMES[kind]: values[f.name] for kind, values in PROFILES.items() if f.name in values}
    for kind, devices in MACHINE_PROFILES.items():      # the defaults that depend on the machine
        per_kind.update({f"{KIND_NAMES[kind]} {DEVICE_NAMES[device]}": values[f.name]
                         for device, values in devices.items() if f.name in values})
    text = f" [default: {f.default}]" if f.default is not None else ""
    if per_kind:
        text = " [default: " + "; ".join(f"{kind} {value}" for kind, value in per_kind.items()) + "]"
    for algorithm, kinds in ALGORITHM_PROFILES.items():
        own = {kind: values[f.name] for kind, values in kinds.items() if f.name in values}
        if own:
            text += (f" [--algorithm={algorithm}: "
                     + "; ".join(f"{KIND_NAMES[kind]} {value}" for kind, value in own.items()) + "]")
    return text


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    from herd.config import SECTIONS
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(section)
        for f in dataclasses.fields(cls):
            names = [f"--{f.name}"]
            dashed = f.name.replace("_", "-")
            if dashed != f.name:
                names.append(f"--{dashed}")
            help_text = f.metadata.get("help", "") + default_text(f)
            # Values stay strings here; herd.config.coerce converts them with clear errors.
            group.add_argument(*names, dest=f.name, default=argparse.SUPPRESS, metavar=f.name.upper(),
                               help=help_text.replace("%", "%%"))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="herd", description="herd: distributed deep RL (IMPALA, V-trace, CLEAR, LASER)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, help_text in (("train", "start a new training run"),
                            ("resume", "continue a run from its checkpoint (op_mode=train_w_load)"),
                            ("test", "play episodes with a saved policy")):
        sub = commands.add_parser(name, help=help_text)
        if name != "train":
            sub.add_argument("run", nargs="?", help="run folder or checkpoint file (same as --load_model_url)")
        add_config_flags(sub)
    plot = commands.add_parser("plot", help="PNG figures of runs: score, losses, policy lag, frames/s")
    plot.add_argument("runs", nargs="+", help="run folders; runs of one configuration are drawn as mean and spread")
    plot.add_argument("--out", help="folder for the figures (default: RUN/plots, or ./herd_plots for several runs)")
    plot.add_argument("--compare", action="store_true", help="overlay the configurations on shared axes")
    watch = commands.add_parser("watch", help="a live terminal view of a run: score, fps, lag, hardware")
    watch.add_argument("run", help="the run folder")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    watch.add_argument("--once", action="store_true", help="print one snapshot and exit")
    export = commands.add_parser("export", help="the policy as TorchScript + safetensors + its preprocessing (herd/export.py)")
    export.add_argument("run", help="run folder or checkpoint file")
    export.add_argument("--out", help="folder for the files (default: RUN/export)")
    multi = commands.add_parser("multi", help="run experiments from a JSON or YAML file in sequence")
    multi.add_argument("file", help="a list of experiments, each a dict of overridden options")
    add_config_flags(multi)
    return parser


def build_seed_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="main.py", description="herd, seed-compatible entry point")
    add_config_flags(parser)
    return parser


def explicit_options(namespace: argparse.Namespace) -> dict[str, Any]:
    """The options the user actually typed (argparse defaults are suppressed)."""
    from herd.config import FIELD_INFO
    return {k: v for k, v in vars(namespace).items() if k in FIELD_INFO}


COMMAND_MODES = {"train": "train", "resume": "train_w_load", "test": "test"}


def parse_herd_args(argv: Sequence[str]) -> tuple[str, dict[str, Any], argparse.Namespace]:
    namespace = build_parser().parse_args(argv)
    options = explicit_options(namespace)
    if namespace.command in COMMAND_MODES:
        options["op_mode"] = COMMAND_MODES[namespace.command]
        if getattr(namespace, "run", None):
            options["load_model_url"] = namespace.run
    return namespace.command, options, namespace


def report_error(err: Exception) -> int:
    print(f"herd: error: {err}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    with stop_handling():
        from herd.run import run_experiment, run_multi_file

        argv = list(sys.argv[1:] if argv is None else argv)
        try:
            command, options, namespace = parse_herd_args(argv)
            if command == "plot":
                from herd.monitor.plot import plot_runs
                for path in plot_runs(namespace.runs, namespace.out, namespace.compare):
                    print(path)
                return 0
            if command == "watch":
                from herd.monitor.watch import watch
                return watch(namespace.run, namespace.interval, namespace.once)
            if command == "export":
                from herd.export import export_command
                return export_command(namespace.run, namespace.out)
            if command == "multi":
                return run_multi_file(namespace.file, options)
            return run_experiment(options)
        except UserError as err:
            return report_error(err)


def seed_main(argv: Sequence[str] | None = None) -> int:
    """`python main.py --op_mode=train ...`."""
    with stop_handling():
        from herd.run import run_experiment

        argv = list(sys.argv[1:] if argv is None else argv)
        try:
            options = explicit_options(build_seed_parser().parse_args(argv))
            return run_experiment(options)
        except UserError as err:
            return report_error(err)


class stop_handling:  # noqa: N801 (used as a statement: `with stop_handling():`)
    """SIGINT/SIGTERM only request a stop (herd.stopping) from here until the command
    returns; the previous handlers come back after, for in-process callers."""

    def __enter__(self):
        stopping.STOP.clear()          # a new command: an earlier in-process stop is not ours
        self.restore = stopping.install()

    def __exit__(self, *exc) -> None:
        self.restore()
        stopping.STOP.clear()          # this command's stop ends with it (in-process callers run more)


if __name__ == "__main__":
    sys.exit(main())
