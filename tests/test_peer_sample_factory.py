"""The peer benchmark's log parsing, on a made-up Sample Factory log (no SF venv needed)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import peer_sample_factory as peer  # noqa: E402


def report(second: int, frames: int, fps60: str = "1000.0") -> str:
    # the shape SF 2.1.1 logs every 5 s, colours included
    return (f"\x1b[36m[2026-11-23 01:00:{second:02d},500][4242] Fps is (10 sec: 1000.0, 60 sec: {fps60}, "
            f"300 sec: {fps60}). Total num frames: {frames}. Throughput: 0: 250.0. Samples: 9. "
            "Policy #0 lag: (min: 1.0, avg: 1.0, max: 1.0)\x1b[0m")


def test_rate_is_frames_over_the_window_after_warmup():
    log = "\n".join([report(0, 0, "nan"), report(5, 0), report(10, 4096), report(15, 4096), report(20, 8192),
                     report(25, 12288), report(30, 16384), "some other line"])
    r = peer.parse_fps(log, warmup=5)
    # first trained frames at 10 s; window from 15 s (4096) to 30 s (16384)
    assert r["frames_per_s"] == pytest.approx(12288 / 15)
    assert r["window_s"] == 15 and r["frames_step"] == 4096 and r["total_frames"] == 16384
    assert r["sf_last_60s_fps"] == 1000.0


def test_too_short_or_untrained_runs_say_so():
    with pytest.raises(peer.PeerError, match="no trained frames"):
        peer.parse_fps("\n".join([report(0, 0), report(5, 0)]), warmup=5)
    with pytest.raises(peer.PeerError, match="too short"):
        peer.parse_fps("\n".join([report(0, 4096), report(5, 4096)]), warmup=5)


def test_modes_are_known_and_unknown_mode_is_refused():
    assert "--serial_mode=True" in peer.MODES["serial"]
    with pytest.raises(peer.PeerError, match="unknown mode"):
        peer.run_peer(mode="turbo")
