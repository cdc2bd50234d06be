"""The run directory: ``run.json``, the Parquet files and the reports, written stage by stage.

Everything an operator needs after the run is here; a crash keeps what completed.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import secrets
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

TOOLS = ("cluster-accept", "prefect", "fabric", "paramiko", "pyarrow", "pandas", "pydantic", "ClusterShell")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@dataclass
class RunDir:
    path: Path
    run_id: str

    @classmethod
    def create(cls, out_dir: Path, run_id: str | None = None) -> RunDir:
        run_id = run_id or new_run_id()
        path = out_dir / run_id
        path.mkdir(parents=True, exist_ok=False)
        return cls(path, run_id)

    def write_json(self, name: str, data: dict[str, Any]) -> Path:
        target = self.path / name
        tmp = target.with_name(name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(target)
        return target
