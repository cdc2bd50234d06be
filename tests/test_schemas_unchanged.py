"""The Parquet schemas are a contract with whoever reads the run directories and the history (DuckDB
queries, dashboards, other teams' scripts): a column renamed, retyped, reordered or made nullable breaks them
silently. tests/data/schemas.json is the committed snapshot of every table's columns; this test fails on any
difference, so a schema change is always a deliberate one, made together with ``SCHEMA_VERSION``.

That docs/data.md documents every column is tested in tests/test_history.py.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.analysis.schemas import SCHEMA_VERSION, TABLES

GOLDEN = Path(__file__).resolve().parent / "data" / "schemas.json"


def current_schemas() -> dict[str, Any]:
    """The schema version, and per table its columns in order: [name, Arrow type as text, nullable]."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tables": {
            table: [[field.name, str(field.type), field.nullable] for field in schema]
            for table, schema in TABLES.items()
        },
    }


def render(snapshot: dict[str, Any]) -> str:
    """One column per line, so a diff of two snapshots points at the column that changed."""
    lines = ["{", f'  "schema_version": {json.dumps(snapshot["schema_version"])},', '  "tables": {']
    tables = list(snapshot["tables"].items())
    for t, (table, columns) in enumerate(tables):
        lines.append(f"    {json.dumps(table)}: [")
        for c, column in enumerate(columns):
            lines.append(f"      {json.dumps(column)}" + ("," if c < len(columns) - 1 else ""))
        lines.append("    ]" + ("," if t < len(tables) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def write_golden(path: Path = GOLDEN) -> None:
    """Rewrite the snapshot from the code: ``python3 -c "from tests.test_schemas_unchanged import write_golden;
    write_golden()"``. Only as part of a deliberate schema change, with ``SCHEMA_VERSION`` bumped where a column
    changes meaning, the readers told, and docs/data.md updated; never to make this test pass."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(current_schemas()), encoding="utf-8")


def test_the_snapshot_reads_back_as_written() -> None:
    """The file is what ``write_golden`` writes (valid JSON, in the one-column-per-line layout)."""
    text = GOLDEN.read_text(encoding="utf-8")
    assert render(json.loads(text)) == text


def test_every_table_schema_equals_the_committed_snapshot() -> None:
    expected = GOLDEN.read_text(encoding="utf-8")
    actual = render(current_schemas())
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), "tests/data/schemas.json", "the code", lineterm=""
        )
        pytest.fail(
            "the Parquet schemas differ from tests/data/schemas.json (see write_golden before changing it):\n"
            + "\n".join(diff),
            pytrace=False,
        )
