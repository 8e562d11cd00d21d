"""The seed's statistics options do what the seed says: per-actor progress lines
(worker_verbose, verbose_worker_out_int) and metric files written from a background
thread (background_save)."""
import io
import threading

from herd_testing import wait_for
from herd.actors.actor import ActorProgress
from herd.monitor.metrics import CsvTable


def test_an_actor_prints_a_progress_line_every_interval_rollouts():
    stream = io.StringIO()
    progress = ActorProgress(actor_id=3, interval=2, stream=stream)
    progress.delivered(64, [(10.0, 10)])
    assert stream.getvalue() == ""
    progress.delivered(64, [(20.0, 20), (30.0, 30)])
    progress.delivered(64, [])
    progress.delivered(64, [])
    lines = stream.getvalue().splitlines()
    assert lines == ["[herd] actor 3: 2 rollouts, 128 steps, 3 games, average of the last 3: 20.00",
                     "[herd] actor 3: 4 rollouts, 256 steps, 3 games, average of the last 3: 20.00"]


def test_no_progress_lines_without_worker_verbose():
    stream = io.StringIO()
    progress = ActorProgress(actor_id=0, interval=0, stream=stream)
    for _ in range(100):
        progress.delivered(8, [(1.0, 8)])
    assert stream.getvalue() == ""


def test_background_save_writes_from_its_own_thread(tmp_path, monkeypatch):
    writers = []
    real_flush = CsvTable.flush

    def flush(self):
        if self.rows:
            writers.append(threading.current_thread().name)
        real_flush(self)

    monkeypatch.setattr(CsvTable, "flush", flush)
    table = CsvTable(tmp_path / "t.csv", ["a", "b"], flush_seconds=0.05, background=True)
    for i in range(50):
        table.add(a=i, b=2 * i)           # never writes itself
    # The background thread's flush is the event waited for (no fixed sleep: a loaded
    # machine may not run the thread within any given time).
    assert wait_for(lambda: bool(writers), 120), "the background thread never flushed"
    table.add(a=50, b=100)
    table.close()                         # the rest, at close
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert rows[0] == "a,b" and rows[1:] == [f"{i},{2 * i}" for i in range(51)]
    assert writers and writers[0] == "herd-save-t"
