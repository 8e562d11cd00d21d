"""The command line's config options: which subcommand takes which, how they are spelled
and shown. Every dataclass field of herd.config is an option named as the field
(`--batch_size`); `--batch-size` is read as the same option. A boolean works as a flag
(`--use_lstm`, `--no-use_lstm`) and keeps the seed's spellings (`--use_lstm=True`,
`--use_lstm True`). An unknown option is refused in one line that suggests the nearest
known ones ("did you mean").

herd.config (and with it torch) is imported inside the functions: herd.cli installs the
stop handlers before any slow import."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
from typing import Iterable, Sequence

from herd.errors import ConfigError

BOOL_WORDS = ("true", "false", "1", "0", "yes", "no")

# What `herd test` reads besides its own section: the tested run's config supplies the
# rest (precedence: the command line wins). The env and network options are there so that
# a mismatch with the checkpoint is reported (its spaces, its network) instead of refused
# as an unknown option.
TEST_GENERAL = ("load_model_url", "seed", "reproducible", "debug", "device", "results_dir", "algorithm")
TEST_SECTION = ("test_episode_count", "render", "test_greedy", "apex_test_epsilon")
# Only test mode reads these; training runs never do.
TEST_ONLY = (*TEST_SECTION, "op_mode")
# Only a resumed run reads these.
RESUME_ONLY = ("load_model_url", "load_optimizer_save")


def command_options(command: str) -> dict[str, list[dataclasses.Field]]:
    """section -> the config fields subcommand `command` takes, in the dataclasses' order.
    command: train, resume, test, multi, or main (the seed's main.py: all of them)."""
    from herd.config import SECTIONS

    def takes(name: str, section: str) -> bool:
        if command in ("main", "multi"):
            return True
        if command == "test":
            return (name in TEST_GENERAL or name in TEST_SECTION or section in ("env", "network")
                    or name == "learner_thread_count")
        if name in TEST_ONLY:
            return False
        return command == "resume" or name not in RESUME_ONLY

    chosen = {section: [f for f in dataclasses.fields(cls) if takes(f.name, section)]
              for section, cls in SECTIONS.items()}
    return {section: fields for section, fields in chosen.items() if fields}


def is_bool(f: dataclasses.Field) -> bool:
    from herd.config import base_type
    return base_type(f.name) is bool


METAVARS = {int: "N", float: "X", tuple: "N,N", bool: "BOOL", str: "TEXT"}


def add_config_flags(parser: argparse.ArgumentParser, command: str, default_text,
                     own_defaults: dict | None = None) -> None:
    """One argument group per config section, each option spelled once (dashes and the
    boolean forms are normalised before argparse sees them: normalize_argv).
    default_text(field) -> ' [default: ...]'; own_defaults: this command's own (herd test's 10 games)."""
    from herd.config import base_type
    for section, fields in command_options(command).items():
        group = parser.add_argument_group(f"{section} options")
        for f in fields:
            own = (own_defaults or {}).get(f.name)
            help_text = f.metadata.get("help", "") + (f" [default: {own}]" if own is not None else default_text(f))
            # Values stay strings here; herd.config.coerce converts them with clear errors.
            choices = f.metadata.get("choices")
            metavar = "|".join(choices) if choices else METAVARS[base_type(f.name)]
            action = group.add_argument(f"--{f.name}", dest=f.name, default=argparse.SUPPRESS,
                                        metavar=metavar, help=help_text.replace("%", "%%"))
            action.boolean = is_bool(f)      # shown as --[no-]name by HelpFormatter


class HelpFormatter(argparse.HelpFormatter):
    """`--batch_size N` rather than argparse's `--batch_size BATCH_SIZE`, and a boolean as
    `--[no-]use_lstm`: each option once, its kind of value visible."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32, width=100)

    def _format_action_invocation(self, action: argparse.Action) -> str:  # noqa: D102 (argparse's hook)
        if getattr(action, "boolean", False):
            return f"--[no-]{action.option_strings[0][2:]}"
        return super()._format_action_invocation(action)


def normalize_argv(argv: Sequence[str], command: str, fields: dict[str, dataclasses.Field]) -> list[str]:
    """The spellings argparse is given: `--batch-size` -> `--batch_size`; a bare boolean
    `--use_lstm` -> `--use_lstm=true` (or `--use_lstm True` -> `--use_lstm=True`, the seed's
    spelling); `--no-use_lstm` -> `--use_lstm=false`. A config option this command does
    not take is refused with one line. fields: every config field by name."""
    taken = {f.name for section in command_options(command).values() for f in section}
    out: list[str] = []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            out += tokens[index - 1:]
            break
        if not token.startswith("--") or len(token) == 2:
            out.append(token)
            continue
        flag, has_value, value = token[2:].partition("=")
        name = flag.replace("-", "_")
        negated = name.startswith("no_") and name not in fields and name[3:] in fields
        if negated:
            name = name[3:]
            if not is_bool(fields[name]):
                raise ConfigError(f"--{flag}: --{name} is not a boolean option, so it has no --no- form")
            if has_value:
                raise ConfigError(f"--{flag} takes no value: use --no-{name} or --{name}={value}")
        if name not in fields:
            out.append(token)                 # the command's own options (--out), or unknown: argparse decides
            continue
        if name not in taken:
            raise ConfigError(f"--{name} is not an option of {describe(command)} "
                              f"(see {describe(command)} --help; it is one of {', '.join(commands_taking(name))})")
        if is_bool(fields[name]) and not has_value:
            if negated:
                value = "false"
            elif index < len(tokens) and tokens[index].lower() in BOOL_WORDS:
                value = tokens[index]         # the seed's `--render True`
                index += 1
            else:
                value = "true"
            has_value = True
        out.append(f"--{name}={value}" if has_value else f"--{name}")
    return out


def describe(command: str) -> str:
    return "main.py" if command == "main" else f"herd {command}"


def commands_taking(name: str) -> list[str]:
    return [describe(c) for c in ("train", "resume", "test")
            if any(f.name == name for fields in command_options(c).values() for f in fields)]


def did_you_mean(unknown: Iterable[str], known: Iterable[str], command: str) -> str:
    """One line for options nobody defines: each with its nearest known spellings."""
    known = sorted(set(known))
    parts = []
    for token in unknown:
        if not token.startswith("-"):
            parts.append(f"unexpected argument '{token}'")
            continue
        flag = token.split("=", 1)[0]
        close = difflib.get_close_matches(flag.replace("-", "_").replace("__", "--", 1), known, n=3, cutoff=0.6)
        parts.append(f"unknown option {flag}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    return f"{describe(command)}: " + "; ".join(parts) + f" (see {describe(command)} --help)"
