"""The process herd.train (herd/api.py) trains in: `python -m herd.api_run FOLDER`.

herd.train never trains in its caller's process. The actors start from a fork server or
by spawn, and both re-import the __main__ of the process that starts them: a caller's
script without an `if __name__ == "__main__":` guard would train again in every actor
(which then die: "before the current process has finished its bootstrapping phase"), and
a heredoc's or a notebook's __main__ has no file to re-import. Here __main__ is this
module, which any process can import, whatever the caller was.

FOLDER (a temporary folder of herd.train's) holds options.json: the options and the
caller's sys.path, so that a `module:Id` environment imports here (and in the actors) as
it does there. This process writes result.json there: {"exit_code", "run_dir"}, or
{"user_error", "kind"} for bad input (nothing written), or {"crash"} for an exception.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from herd import stopping


def watch_parent(parent: int) -> None:
    """Stops the run (cleanly, with a checkpoint) once herd.train's process is gone: a
    notebook kernel restarted or killed must not leave a run training unseen."""
    while os.getppid() == parent:
        time.sleep(1.0)
    stopping.STOP.set()


def train(request: dict) -> dict:
    """Trains as herd.train asked; the result for result.json."""
    from herd.backends.start import start_fork_server
    start_fork_server()         # its torch import beside this process's (herd/backends/start.py)
    from herd.errors import UserError
    from herd.run import prepare_run, run_plan
    try:
        plan = prepare_run(request["options"])
    except UserError as err:
        return {"user_error": str(err), "kind": type(err).__name__}
    code, run_dir = run_plan(plan, argv=request.get("argv"))
    return {"exit_code": code, "run_dir": None if run_dir is None else str(run_dir)}


def main(folder: Path) -> int:
    # Stop requests first, before any slow import (as herd.cli): a Ctrl+C or a stop that
    # herd.train passes on is then a clean stop. herd.train started this process with
    # SIGINT blocked, so none was lost before the handler was in place.
    stopping.install()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    request = json.loads((folder / "options.json").read_text())
    # The caller's sys.path first, as spawn does for its children (the actors get this one).
    sys.path[:] = [*request["sys_path"], *(p for p in sys.path if p not in request["sys_path"])]
    try:
        result = train(request)
    except Exception as err:        # noqa: BLE001 (reported to herd.train as one line, traceback here)
        traceback.print_exc()
        result = {"crash": f"{type(err).__name__}: {' '.join(str(err).split())}"}
    (folder / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
