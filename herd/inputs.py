"""Bounded reading of what users and files hand in (options, --replay_parameters, the
experiments of `herd multi`): sizes and nesting depths are checked before anything is
parsed, values must be scalars, and an error line quotes at most a short excerpt.

A leaf module (it imports only herd.errors), so the config, the replay specs and run.py
share it without an import loop. Why bounds: a 405-byte YAML of aliases expands to a
58 MB error line, JSON nested 100,000 deep ends in a RecursionError traceback, and an
option given as a nested list would be turned into its Python repr silently."""
from __future__ import annotations

import json
import os
import re
import reprlib
import stat
from typing import Any

from herd.errors import ConfigError

# The longest text an option value may be (--replay_parameters is the longest legitimate
# one: a list of a few replays, well under 2 KB).
MAX_OPTION_CHARS = 64 * 1024
# Containers nested deeper than this in --replay_parameters or an experiments file: herd's
# own inputs are 2 to 3 deep.
MAX_DEPTH = 16
# An experiments file (`herd multi FILE`) and how many experiments it may hold.
MAX_FILE_BYTES = 1024 * 1024
MAX_EXPERIMENTS = 1000
# Items of a tuple option (--hidden_sizes, --frame_scale_resolution, --observation_shape).
MAX_TUPLE_ITEMS = 16
EXCERPT_CHARS = 60
SCALARS = (str, int, float, bool, type(None))

_short = reprlib.Repr()
_short.maxlevel, _short.maxlist, _short.maxdict, _short.maxtuple = 2, 4, 4, 4
_short.maxstring = _short.maxother = EXCERPT_CHARS


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """At most about `limit` characters of a value, on one line (newlines escaped): what an
    error line may quote of input. reprlib stops at two levels, so a tree of shared
    references (a YAML alias bomb) is never walked."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])[1:-1]
    else:
        text = _short.repr(value)
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    return text if len(text) <= limit else text[:limit] + "..."


# How much of a file-provided name (an environment id, a module) an error line quotes.
QUOTE_CHARS = 100


def quoted(text: Any) -> str:
    """A name that came from a file or a user, as an error line quotes it: in quotes, at most
    QUOTE_CHARS characters, newlines, escape sequences and other control characters shown
    escaped (excerpt), so a crafted id can neither forge lines nor drive the terminal."""
    return f"'{excerpt(str(text), QUOTE_CHARS)}'"


# A double-quoted string with its escapes, a bracket, or (last) a quote that opens no
# string: one never closed. The possessive quantifiers never backtrack, and DOTALL lets an
# escape take a newline (YAML's line continuation).
_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]|"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """The deepest nesting of [ ] and { } in JSON text, strings skipped (no parsing, no
    recursion: regular expressions find the brackets), in time linear in the text.

    A quote never closed counts as no string: the brackets after it are counted. Every
    later quote then fails to close too (it lay inside that unclosed string, escaped, so
    the escapes after it pair up alike), so the rest is scanned for brackets alone, once:
    retrying each quote, as a plain finditer does, rescanned the rest of the text per quote
    (64 KiB of escaped quotes took 14 s)."""
    depth = deepest = 0
    tokens = _TOKENS.finditer(text)
    for match in tokens:
        token = match.group()
        if token == '"':
            tokens = _BRACKETS.finditer(text, match.end())
            break
        depth, deepest = step(token, depth, deepest)
    for match in tokens:                      # after an unclosed quote: brackets only
        depth, deepest = step(match.group(), depth, deepest)
    return deepest


def step(bracket: str, depth: int, deepest: int) -> tuple[int, int]:
    """(depth, deepest) after one token; a string token leaves both as they were."""
    if bracket in ("[", "{"):
        return depth + 1, max(deepest, depth + 1)
    if bracket in ("]", "}"):
        return depth - 1, deepest
    return depth, deepest


def check_text(what: str, text: str, max_chars: int = MAX_OPTION_CHARS) -> None:
    if len(text) > max_chars:
        raise ConfigError(f"{what} is {len(text):,} characters long, more than the {max_chars:,} allowed")


def parse_json(what: str, text: str, max_chars: int = MAX_OPTION_CHARS) -> Any:
    """json.loads after the size and depth checks; json.JSONDecodeError passes through."""
    check_text(what, text, max_chars)
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise ConfigError(f"{what} nests lists and objects {depth} deep, more than the {MAX_DEPTH} allowed")
    return json.loads(text)


def check_option_value(name: str, value: Any, tuple_option: bool = False) -> None:
    """A single value (text, number, boolean, none), or for a tuple option a short list of
    numbers; refuses with one line anything else (a dict, a nested list, a huge text)."""
    if isinstance(value, str):
        check_text(f"--{name}", value)
        return
    if isinstance(value, SCALARS):
        return
    if tuple_option and isinstance(value, (list, tuple)) and len(value) <= MAX_TUPLE_ITEMS and all(
            isinstance(item, (int, float, str)) and not isinstance(item, bool) for item in value):
        return
    kind = "up to 16 integers" if tuple_option else "a single value (text, number or boolean)"
    raise ConfigError(f"--{name} must be {kind}, got {type(value).__name__} {excerpt(value)}")


def read_bounded(path: str, limit: int = MAX_FILE_BYTES, what: str = "an experiments file") -> str:
    """The text of a regular file of at most `limit` bytes, read through one descriptor.
    O_NONBLOCK: opening a FIFO does not wait for a writer; fstat of the opened descriptor
    (not a stat of the name before it) refuses FIFOs and devices (a link to /dev/zero
    never ends); the read stops one byte past the limit, so a file that grows after the
    check is still refused. OSError (missing file, no permission) passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"'{excerpt(path)}' is not a regular file ({file_kind(mode)}): {what} must be one")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"'{excerpt(path)}' is more than the {limit:,} bytes {what} may be")
    return data.decode()                     # UnicodeDecodeError is a ValueError: the caller's one line


def file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a plain file")


class FromFile(dict):
    """Options read from a file (an experiments file's experiment): a plain dict that says
    where it came from, so that herd.config.resolve refuses what only a typed command may
    ask for (a custom environment's module to import)."""


def read_experiments(path: str) -> list[dict]:
    """The experiments of a JSON or YAML file: a list of dicts of option names to values,
    checked for size before parsing and for shape after (values: check_option_value, by
    the caller, which knows the options)."""
    import yaml
    text = read_bounded(path)
    try:
        if path.endswith((".yaml", ".yml")):
            # Brackets outside double quotes: YAML's flow nesting (an upper bound, as single-
            # quoted text is counted too), checked before PyYAML's recursive composer sees it.
            if nesting_depth(text) > MAX_DEPTH:
                raise ConfigError(f"'{excerpt(path)}' nests lists or mappings more than {MAX_DEPTH} deep, too deep "
                                  "to read")
            experiments = yaml.safe_load(text)
        else:
            experiments = parse_json(f"'{excerpt(path)}'", text, MAX_FILE_BYTES)
    except RecursionError:
        raise ConfigError(f"'{excerpt(path)}' nests lists or mappings too deep to read") from None
    if not isinstance(experiments, list) or not all(isinstance(e, dict) for e in experiments):
        raise ConfigError(f"{excerpt(path)} must hold a list of experiments, each a dict of options")
    if len(experiments) > MAX_EXPERIMENTS:
        raise ConfigError(f"{excerpt(path)} holds {len(experiments):,} experiments, more than the "
                          f"{MAX_EXPERIMENTS:,} one file may hold")
    return [FromFile(experiment) for experiment in experiments]


def check_experiments(experiments: list[dict], check_value) -> None:
    """Every experiment's keys are option names (text) and check_value(name, value)
    accepts its values: a one-line ConfigError naming the experiment otherwise."""
    for index, experiment in enumerate(experiments, start=1):
        for name, value in experiment.items():
            if not isinstance(name, str):
                raise ConfigError(f"experiment {index}: option name {excerpt(name)} is not text")
            try:
                check_value(name, value)
            except ConfigError as err:
                raise ConfigError(f"experiment {index}: {err}") from None


def describe(overrides: dict, limit: int = 200) -> str:
    """An experiment's overrides for a log line, cut to `limit` characters."""
    return excerpt(json.dumps(overrides, default=str), limit) if overrides else "{}"
