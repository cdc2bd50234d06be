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


def runs_row(run_info: dict[str, Any], verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's one row of ``runs.parquet``: when, what, and the verdict counts."""
    from analysis.schemas import SCHEMA_VERSION

    def when(text: str | None) -> dt.datetime | None:
        return dt.datetime.fromisoformat(text) if text else None

    def count(verdict: str) -> int:
        return sum(1 for v in verdicts if v["verdict"] == verdict)

    return {
        "run_id": run_info["run_id"],
        "cluster": run_info["cluster"],
        "started": when(run_info.get("started")),
        "ended": when(run_info.get("ended")),
        "stages": list(run_info.get("stages") or []),
        "inventory": run_info.get("inventory"),
        "inventory_digest": run_info.get("inventory_digest"),
        "nodes_tested": len(run_info.get("nodes_tested") or []),
        "accepted": count("accepted"),
        "rejected": count("rejected"),
        "unreachable": count("unreachable"),
        "skipped": count("skipped"),
        "tool_version": (run_info.get("tools") or {}).get("cluster-accept"),
        "schema_version": SCHEMA_VERSION,
    }
