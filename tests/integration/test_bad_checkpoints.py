"""Checkpoints that must be refused: one line on stderr, exit code 2, no new run folder,
and the run being loaded is unchanged byte for byte.

Every case runs in this process (the `cli` fixture: herd's CLI function, file descriptor 2
captured); two of them, and `herd resume`, also as real processes through both entry
points, where the exit code and the single line are the process's own."""
import hashlib
import os
import shutil

import pytest
import torch

from herd_testing import copy_of_run, corrupt_first_weight, run_cli
from herd.checkpoint import CHECKPOINT_DIR, checksum, list_checkpoints, load_checkpoint, to_storable


class Payload:
    """Unpickling this runs a shell command: what a malicious checkpoint would carry."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def sources(small_cartpole_run, tmp_path_factory):
    """A small CartPole run (a copy of the shared one) and, beside it, every kind of bad checkpoint."""
    base = tmp_path_factory.mktemp("bad_checkpoints")
    run = copy_of_run(small_cartpole_run, base / "results")
    assert list_checkpoints(run / CHECKPOINT_DIR)

    truncated = base / "truncated_run"                      # a copy: the trained run stays whole
    shutil.copytree(run, truncated)
    newest = list_checkpoints(truncated / CHECKPOINT_DIR)[0]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    corrupt = base / "corrupt_run"                          # flipped weight bytes, the zip intact
    shutil.copytree(run, corrupt)
    corrupt_first_weight(list_checkpoints(corrupt / CHECKPOINT_DIR)[0])

    no_checkpoint = base / "no_checkpoint_run"
    shutil.copytree(run, no_checkpoint)
    shutil.rmtree(no_checkpoint / CHECKPOINT_DIR)

    garbage = base / "random.pt"
    garbage.write_bytes(os.urandom(50_000))

    malicious = base / "malicious.pt"
    marker = tmp_path_factory.mktemp("payload") / "payload_ran"   # outside the hashed tree
    torch.save({"format_version": 1, "model": Payload(marker)}, malicious)
    crafted = {name: variant(list_checkpoints(run / CHECKPOINT_DIR)[0], base / f"{name}.pt", change)
               for name, change in CRAFTED.items()}
    return {"base": base, "run": run, "truncated": truncated, "corrupt": corrupt, "no_checkpoint": no_checkpoint,
            "garbage": garbage, "malicious": malicious, "marker": marker, **crafted}


def variant(source, path, change):
    """A copy of checkpoint `source` changed by change(storable state), with the checksum herd
    would compute: a file someone else crafted, which the checksum alone cannot refuse."""
    state, _ = load_checkpoint(source)
    storable = to_storable(state)
    change(storable)
    storable["checksum"] = checksum(storable)
    torch.save(storable, path)
    return path


# Checksummed checkpoints whose session parts herd does not write (herd.checkpoint_state).
CRAFTED = {
    "counters_dict": lambda s: s["counters"].update(__dict__={"env_steps": 0}),
    "counters_unknown": lambda s: s["counters"].update(bonus=1),
    "counters_negative": lambda s: s["counters"].update(updates=-5),
    "no_rng": lambda s: s.pop("rng"),
    "rng_short": lambda s: s.update(rng={"torch": torch.zeros(8, dtype=torch.uint8)}),
    "optimizer_list": lambda s: s.update(optimizer=[1, 2]),
    "stats_text": lambda s: s["stats"].update(scores="x" * 1000),
    "replay_list": lambda s: s.update(replay=[1]),
}


CASES = {
    # name: (--load_model_url, extra flags, words of the error line)
    "missing path": (lambda s: s["base"] / "no_such_run", [], "does not exist"),
    "folder with no checkpoint": (lambda s: s["no_checkpoint"], [], "no checkpoint"),
    "truncated checkpoint": (lambda s: s["truncated"], [], "truncated or corrupt"),
    "corrupt weights": (lambda s: s["corrupt"], [], "is corrupt: its contents do not match their checksum"),
    "random bytes": (lambda s: s["garbage"], [], "truncated or corrupt"),
    "malicious pickle": (lambda s: s["malicious"], [], "cannot be loaded safely"),
    # The command line's env wins over the checkpoint's config, and its spaces differ.
    "another environment": (lambda s: s["run"], ["--env=Acrobot-v1"], "made for CartPole-v1"),
    "another network": (lambda s: s["run"], ["--hidden_sizes=32,32"], "another network"),
    "counters holding __dict__": (lambda s: s["counters_dict"], [], "counter named __dict__"),
    "a counter herd does not write": (lambda s: s["counters_unknown"], [], "counter named bonus"),
    "a negative counter": (lambda s: s["counters_negative"], [], "counter updates = -5"),
    "an rng of 8 bytes": (lambda s: s["rng_short"], [], "rng whose torch state"),
    "an optimizer that is a list": (lambda s: s["optimizer_list"], [], "optimizer state"),
    "scores that are text": (lambda s: s["stats_text"], [], "scores are not a list"),
    "a replay that is a list": (lambda s: s["replay_list"], [], "replay that is not a dict"),
}


# What only a resume reads (test mode reads the model alone): refused when resuming.
RESUME_CASES = {
    "no rng": (lambda s: s["no_rng"], [], "has no rng"),
}
CASES_ALL = {**CASES, **RESUME_CASES}


def tree_hashes(folder):
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refuse(run, sources, case, command, results):
    """`run` is run_cli or the `cli` fixture: both take (args, results, entry=...)."""
    url_of, extra, words = CASES_ALL[case]
    url = url_of(sources)
    before = tree_hashes(sources["base"])
    if command == "herd test":
        result = run(["test", str(url), "--render=False", *extra], results)
    else:
        result = run(["--op_mode=train_w_load", f"--load_model_url={url}", *extra], results, entry="main")
    assert_refused(result, words, results, sources, before)


COMMANDS = ["main.py --op_mode=train_w_load", "herd test"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_is_refused_and_changes_nothing(cli, sources, tmp_path, case, command):
    refuse(cli, sources, case, command, tmp_path / "results")


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_a_checkpoint_missing_what_a_resume_reads_is_refused(cli, sources, tmp_path, case):
    refuse(cli, sources, case, "main.py --op_mode=train_w_load", tmp_path / "results")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", ["truncated checkpoint", "malicious pickle"])
def test_bad_checkpoint_in_a_real_process_is_refused_and_changes_nothing(sources, tmp_path, case, command):
    def run(args, results, entry="herd"):
        return run_cli(args, results, entry=entry, timeout=120)
    refuse(run, sources, case, command, tmp_path / "results")


def assert_refused(result, words, results, sources, before):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("herd: error:") and words in lines[0], result.stderr
    assert not results.exists()                             # refused before any run folder is made
    assert tree_hashes(sources["base"]) == before           # the loaded run and its copies: byte for byte
    assert not sources["marker"].exists()                   # weights_only loading never ran the payload


def test_herd_resume_refuses_corrupt_weights(sources, tmp_path):
    """`herd resume` shares main.py's loading, checked above for every case; once here for the checksum."""
    before = tree_hashes(sources["base"])
    results = tmp_path / "results"
    result = run_cli(["resume", str(sources["corrupt"])], results, timeout=120)
    assert_refused(result, "is corrupt: its contents do not match their checksum", results, sources, before)


def test_the_malicious_payload_is_real(sources, tmp_path):
    """The payload runs when unpickled without weights_only, so its refusal above means something."""
    copy = tmp_path / "malicious.pt"
    shutil.copy(sources["malicious"], copy)
    marker = sources["marker"]
    try:
        torch.load(copy, weights_only=False)
        assert marker.exists()
    finally:
        marker.unlink(missing_ok=True)
