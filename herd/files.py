"""Small files of a run (config.json, summary.json, test_results.json), written atomically:
a reader, or a kill at any instant, sees the old file or the new one, never half of one."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)
