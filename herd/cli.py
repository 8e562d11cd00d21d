"""One parser for `python main.py --op_mode=...` (the seed's flags, verbatim) and
`herd COMMAND ...` (COMMANDS: train, resume, test, plot, watch, export, multi). Every dataclass
field of herd.config is an option under its seed name; which command takes which, and
their spellings (`--batch-size`, `--use_lstm`, `--no-use_lstm`), are herd/cli_options.py's."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

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
    from herd.profiles import (ALGORITHM_PROFILES, DEFAULT_ALGORITHM, GAME_PROFILES, MACHINE_ALGORITHMS,
                               MACHINE_PROFILES, PROFILES)
    if f.name == "algorithm":
        picks = [f"{KIND_NAMES[kind]} {DEVICE_NAMES[device]} {algorithm}"
                 for kind, devices in MACHINE_ALGORITHMS.items() for device, algorithm in devices.items()]
        return " [default: " + "; ".join([*picks, f"otherwise {DEFAULT_ALGORITHM}"]) + "]"
    per_kind = {KIND_NAMES[kind]: values[f.name] for kind, values in PROFILES.items() if f.name in values}
    for kind, devices in MACHINE_PROFILES.items():      # the defaults that depend on the machine
        for device, values in devices.items():
            if f.name in values:
                # Where the machine picks another algorithm, these are IMPALA's there.
                other = MACHINE_ALGORITHMS.get(kind, {}).get(device, DEFAULT_ALGORITHM) != DEFAULT_ALGORITHM
                label = f"{KIND_NAMES[kind]} {DEVICE_NAMES[device]}"
                per_kind[label + (f" (--algorithm={DEFAULT_ALGORITHM})" if other else "")] = values[f.name]
    text = f" [default: {f.default}]" if f.default is not None else ""
    if per_kind:
        text = " [default: " + "; ".join(f"{kind} {value}" for kind, value in per_kind.items()) + "]"
    for algorithm, kinds in ALGORITHM_PROFILES.items():
        own = {kind: values[f.name] for kind, values in kinds.items() if f.name in values}
        if own:
            text += (f" [--algorithm={algorithm}: "
                     + "; ".join(f"{KIND_NAMES[kind]} {value}" for kind, value in own.items()) + "]")
    for (algorithm, env_id), values in GAME_PROFILES.items():
        if f.name in values:
            text += f" [--algorithm={algorithm} on {env_id}: {values[f.name]}]"
    return text


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string `parser` knows (for "did you mean")."""
    return [name for action in parser._actions for name in action.option_strings]


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, what adds its own arguments to its parser, and
    what runs it: run(namespace, options) -> exit code, where options are the config
    options typed on the command line. `config` names the set of config options it takes
    (herd.cli_options.command_options), None for none. `reads_stop`: its loops read
    herd.stopping.STOP and stop cleanly (a run saves its checkpoint); a command that does
    not is interrupted where it is by SIGINT and SIGTERM (herd.stopping.interrupt).
    `trains`: it may start actors, so the actors' fork server starts before anything else
    is imported, and imports torch beside this process (herd/backends/start.py)."""
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, dict], int]
    config: str | None = None
    reads_stop: bool = False
    trains: bool = False


def run_folder_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", nargs="?", help="run folder or checkpoint file (same as --load_model_url)")


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command that takes only config options."""


def plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run folders; runs of one configuration are drawn as mean and band, "
                                                 "a resumed run joined to the run it continues")
    parser.add_argument("--out", help="folder for the figures (default: RUN/plots, or ./herd_plots for several runs)")
    parser.add_argument("--compare", action="store_true", help="overlay the configurations on shared axes")
    parser.add_argument("--format", default="png", choices=("png", "pdf", "svg"), help="file format of the figures")
    parser.add_argument("--dpi", type=int, default=150, help="resolution of PNG figures (dots per inch)")
    parser.add_argument("--band", default="se", choices=("se", "bootstrap", "none"),
                        help="band around the mean of several runs: standard error, 95%% bootstrap interval, none")
    parser.add_argument("--smooth", type=int, default=1,
                        help="average the curves over this many grid points (1: no smoothing)")


def watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="the run folder")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")


def multi_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a list of experiments, each a dict of overridden options")


def run_config_command(namespace: argparse.Namespace, options: dict) -> int:
    from herd.run import run_experiment
    return run_experiment(options, argv=namespace.argv)


def run_plot(namespace: argparse.Namespace, options: dict) -> int:
    from herd.monitor.plot import plot_runs
    for path in plot_runs(namespace.runs, namespace.out, namespace.compare, file_format=namespace.format,
                          dpi=namespace.dpi, band=namespace.band, smooth=namespace.smooth):
        print(path)
    return 0


def run_watch(namespace: argparse.Namespace, options: dict) -> int:
    from herd.monitor.watch import watch
    return watch(namespace.run, namespace.interval, namespace.once)


def export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder or checkpoint file")
    parser.add_argument("--out", help="folder for the files (default: RUN/export)")
    parser.add_argument("--env", help="the run's environment id; needed for a custom pkg.module:EnvId, whose module "
                                      "herd imports only when the command line names it")


def run_export(namespace: argparse.Namespace, options: dict) -> int:
    from herd.export import export_command
    return export_command(namespace.run, namespace.out, namespace.env)


def run_multi_command(namespace: argparse.Namespace, options: dict) -> int:
    from herd.run import run_multi_file
    return run_multi_file(namespace.file, options, argv=namespace.argv)


# herd's subcommands, in the order `herd` lists them. A new one is one line here.
COMMANDS: dict[str, Command] = {
    "train": Command("start a new training run (needs --env)", no_arguments, run_config_command, "train",
                     reads_stop=True, trains=True),
    "resume": Command("continue a run from its checkpoint (op_mode=train_w_load)", run_folder_argument,
                      run_config_command, "resume", reads_stop=True, trains=True),
    "test": Command("play episodes with a saved policy; results go inside the run tested", run_folder_argument,
                    run_config_command, "test", reads_stop=True),
    "plot": Command("figures of runs: score (mean and band), losses, policy lag, frames/s", plot_arguments, run_plot),
    "watch": Command("a live terminal view of a run: score, fps, ETA, hardware", watch_arguments, run_watch),
    "export": Command("the policy as TorchScript + safetensors + its preprocessing", export_arguments, run_export),
    "multi": Command("run experiments from a JSON or YAML file in sequence", multi_arguments, run_multi_command,
                     "multi", reads_stop=True, trains=True),
}
COMMAND_MODES = {"train": "train", "resume": "train_w_load", "test": "test"}
# `herd test` plays a few games without a video unless asked (main.py keeps the seed's 1000 with one).
TEST_DEFAULTS = {"test_episode_count": "10", "render": "false"}


def herd_version() -> str:
    from herd.provenance import package_version
    return package_version("herd") or "unknown (not installed)"     # a checkout never installed


def build_parser() -> argparse.ArgumentParser:
    from herd.cli_options import HelpFormatter, add_config_flags
    parser = OneLineParser(prog="herd", description="herd: distributed deep RL (IMPALA, V-trace, CLEAR, LASER)",
                           allow_abbrev=False, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"herd {herd_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser, metavar="COMMAND")
    parser.commands = {}
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help, allow_abbrev=False,
                                  formatter_class=HelpFormatter,
                                  # argparse's usage would repeat every option: the list below has them
                                  usage=f"herd {name} [options]" if command.config else None)
        command.arguments(sub)
        if command.config:
            add_config_flags(sub, command.config, default_text, TEST_DEFAULTS if name == "test" else None)
        parser.commands[name] = sub
    return parser


def command_list() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"herd {herd_version()}: distributed deep RL (IMPALA, V-trace, CLEAR, LASER)", "",
             "usage: herd COMMAND [options]   (herd COMMAND --help: its options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    return "\n".join(lines)


def build_seed_parser() -> argparse.ArgumentParser:
    from herd.cli_options import HelpFormatter, add_config_flags
    parser = OneLineParser(prog="main.py", description="herd, seed-compatible entry point", allow_abbrev=False,
                           formatter_class=HelpFormatter, usage="main.py --op_mode=train|train_w_load|test [options]")
    add_config_flags(parser, "main", default_text)
    return parser


def explicit_options(namespace: argparse.Namespace) -> dict[str, Any]:
    """The options the user actually typed (argparse defaults are suppressed)."""
    from herd.config import FIELD_INFO
    return {k: v for k, v in vars(namespace).items() if k in FIELD_INFO}


def parse_known(parser: argparse.ArgumentParser, argv: list[str], command: str,
                sub: argparse.ArgumentParser) -> argparse.Namespace:
    """parse_args, with unknown options refused in one line that says what was meant."""
    from herd.cli_options import did_you_mean
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ConfigError(did_you_mean(unknown, option_strings(sub), command))
    return namespace


def parse_seed_args(argv: Sequence[str]) -> dict[str, Any]:
    """main.py's and multi_train.py's command line -> the options typed."""
    from herd.cli_options import normalize_argv
    from herd.config import FIELD_INFO
    parser = build_seed_parser()
    return explicit_options(parse_known(parser, normalize_argv(argv, "main", FIELD_INFO), "main", parser))


def parse_herd_args(argv: Sequence[str]) -> tuple[str, dict[str, Any], argparse.Namespace]:
    import difflib

    argv = list(argv)
    name = argv[0] if argv else ""
    if name in ("-h", "--help", "--version"):
        build_parser().parse_args(argv)            # prints, then exits 0
    if name.startswith("-"):
        raise ConfigError(f"unknown option {name}: herd takes --help and --version; other options follow a "
                          f"command (herd COMMAND --help; the commands: {', '.join(COMMANDS)})")
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        raise ConfigError(f"unknown command '{name}'" + (f" (did you mean {close[0]}?)" if close else "")
                          + f"; the commands: {', '.join(COMMANDS)}")
    command = COMMANDS[name]
    if command.config is None:
        # No config options: herd.config (and with it torch, whose exit alone takes half a
        # second on a busy machine) is never imported, so watch and plot end promptly.
        parser = OneLineParser(prog=f"herd {name}", description=command.help, allow_abbrev=False)
        command.arguments(parser)
        namespace = parse_known(parser, argv[1:], name, parser)
        namespace.argv = ["herd", *argv]
        return name, {}, namespace
    from herd.cli_options import normalize_argv
    from herd.config import FIELD_INFO
    parser = build_parser()
    rest = normalize_argv(argv[1:], command.config, FIELD_INFO)
    namespace = parse_known(parser, [name, *rest], name, parser.commands[name])
    namespace.argv = ["herd", *argv]
    options = explicit_options(namespace)
    if name in COMMAND_MODES:
        options["op_mode"] = COMMAND_MODES[name]
        if getattr(namespace, "run", None):
            options["load_model_url"] = namespace.run
    if name == "train" and "env" not in options:
        raise ConfigError("herd train needs --env: a gymnasium id such as --env CartPole-v1 or "
                          "--env PongNoFrameskip-v4 (main.py keeps the seed's default, AtlantisNoFrameskip-v4)")
    if name == "test":
        options = {**TEST_DEFAULTS, **options}
    return name, options, namespace


def report_error(err: Exception) -> int:
    print(f"herd: error: {err}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(command_list())
        return 0
    # Decided from the command's name alone, before any slow import: a stop while torch loads
    # must already be handled the command's way.
    reads_stop = argv[0] not in COMMANDS or COMMANDS[argv[0]].reads_stop
    with stop_handling(stopping.request_stop if reads_stop else stopping.interrupt):
        try:
            if argv[0] in COMMANDS and COMMANDS[argv[0]].trains and not {"-h", "--help"} & set(argv):
                from herd.backends.start import start_fork_server
                start_fork_server()
            command, options, namespace = parse_herd_args(argv)
            return COMMANDS[command].run(namespace, options)
        except UserError as err:
            return report_error(err)
        except stopping.Stopped as stop:
            print(f"herd: stopped ({stop})", file=sys.stderr)
            return 128 + stop.signum


def seed_main(argv: Sequence[str] | None = None) -> int:
    """`python main.py --op_mode=train ...`."""
    with stop_handling():
        from herd.run import run_experiment

        argv = list(sys.argv[1:] if argv is None else argv)
        try:
            options = parse_seed_args(argv)
            return run_experiment(options, argv=["main.py", *argv])
        except UserError as err:
            return report_error(err)


class stop_handling:  # noqa: N801 (used as a statement: `with stop_handling():`)
    """SIGINT/SIGTERM call `handler` (herd.stopping: request_stop sets STOP, interrupt raises
    Stopped) from here until the command returns; the previous handlers come back after,
    for in-process callers."""

    def __init__(self, handler=stopping.request_stop):
        self.handler = handler

    def __enter__(self):
        stopping.STOP.clear()          # a new command: an earlier in-process stop is not ours
        self.restore = stopping.install(self.handler)

    def __exit__(self, *exc) -> None:
        self.restore()
        stopping.STOP.clear()          # this command's stop ends with it (in-process callers run more)


if __name__ == "__main__":
    sys.exit(main())
