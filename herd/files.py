"""Small files of a run (config.json, summary.json, test_results.json), written atomically
and durably: a reader, or a kill or power loss at any instant, sees the old file or the
new one, never half of one (the data is fsync'ed before the rename, and the folder after,
or a crash could leave the new name pointing at blocks never written)."""
from __future__ import annotations

import json
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Makes a rename in the folder `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=2, default=str))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)       # a failed write leaves no temporary file behind
    fsync_dir(path.parent)
