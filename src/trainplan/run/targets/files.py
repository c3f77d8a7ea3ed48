"""Writing a rendered launch: every file or none (a temporary folder renamed into place)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from trainplan.errors import TrainplanError
from trainplan.run.targets.base import Rendered

#: The record of a rendered launch in ``--out``: target, commands (argument lists, environment), notes.
LAUNCH_RECORD = "launch.json"


def launch_record(rendered: Rendered) -> dict[str, object]:
    return {
        "target": rendered.target.value,
        "commands": [
            {"argv": list(c.argv), "env": dict(c.env), "where": c.where, "cwd": str(c.cwd) if c.cwd else None}
            for c in rendered.commands
        ],
        "notes": list(rendered.notes),
        "files": sorted(rendered.files),
    }


def write_rendered(rendered: Rendered, out: Path) -> list[Path]:
    """Write ``rendered.files`` and ``launch.json`` into ``out`` — all of them, or nothing.

    ``out`` must not exist, be empty, or be a directory trainplan rendered
    (checked earlier, by :func:`trainplan.run.targets.plan.check_out`); it is replaced whole.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the run from a cluster's other users
        files = {**rendered.files, LAUNCH_RECORD: json.dumps(launch_record(rendered), indent=2) + "\n"}
        for name, text in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                path.write_bytes(text)
            else:
                path.write_text(text, encoding="utf-8")
            if name in rendered.executable:
                path.chmod(0o755)
        if out.exists():
            if any(out.iterdir()) and not (out / "run.json").exists():
                raise TrainplanError(f"{out} is not a directory trainplan rendered; refusing to replace it", field="--out")
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [out / name for name in sorted(files)]
