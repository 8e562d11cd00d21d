"""Input checks that must themselves be bounded (issue "Trust, second round", herd/inputs.py):
the nesting-depth scan is linear in its text, and an experiments file is read through
one descriptor, regular files only, up to the limit. Each case runs in a child Python
under a 2 GB address-space cap and a generous 20 s deadline (no timing is measured: the
deadline only turns a hang into a failure). Each test says what the code before did."""
import os

import pytest

from herd_testing import capped_child
from herd.inputs import nesting_depth

ADDRESS_SPACE = 2 * 2**30
DEADLINE_S = 20


def in_child(body: str) -> str:
    """`body` (Python, after the cap) in a fresh interpreter: its stdout, or what went wrong."""
    return capped_child(body, ADDRESS_SPACE, DEADLINE_S)


def test_an_unclosed_quote_hides_no_brackets_and_closed_strings_still_do():
    """What the linear scan must keep of the old one: a quote never closed is no string."""
    assert nesting_depth('"[[[') == 3
    assert nesting_depth('[[{"]]}": 1}]] "') == 3
    assert nesting_depth('["a\\"[", ["\\\\"]]') == 2


def test_a_megabyte_of_escaped_quotes_is_scanned_in_linear_time():
    """Before: every unclosed quote rescanned the rest of the text, quadratic: 64 KiB took
    14 s, so 1 MiB (256 times that) would take about an hour, far past the 20 s deadline;
    now each shape is one pass of well under a second."""
    outcome = in_child("""
        from herd.inputs import nesting_depth
        shapes = ['\\\\"' * 2**19, '"' + '\\\\"' * 2**19, '"\\\\' * 2**19, '["' * 2**19, '"\\\\"[' * 2**18]
        print([nesting_depth(text) for text in shapes])
    """)
    assert outcome == str([0, 0, 0, 2**18, 1]), outcome


def read_in_child(path) -> str:
    return in_child(f"""
        from herd.errors import ConfigError
        from herd.inputs import read_experiments
        try:
            read_experiments({str(path)!r})
        except ConfigError as err:
            print("refused:", err)
        else:
            print("read")
    """)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    """Before: a FIFO stats as 0 bytes, and reading it waited for a writer forever."""
    fifo = tmp_path / "experiments.json"
    os.mkfifo(fifo)
    outcome = read_in_child(fifo)
    assert outcome.startswith("refused:") and "a FIFO" in outcome and "\n" not in outcome, outcome


def test_a_link_to_dev_zero_is_refused_without_reading_it(tmp_path):
    """Before: /dev/zero stats as 0 bytes, and reading it whole never ended (until memory did)."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    link = tmp_path / "experiments.yaml"
    link.symlink_to("/dev/zero")
    outcome = read_in_child(link)
    assert outcome.startswith("refused:") and "character device" in outcome and "\n" not in outcome, outcome


def test_a_regular_file_still_reads(tmp_path):
    good = tmp_path / "experiments.json"
    good.write_text('[{"lr": 0.001}]')
    assert read_in_child(good) == "read"
