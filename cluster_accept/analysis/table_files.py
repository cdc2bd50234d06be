"""A table's Parquet file read back, held to what this version writes, before a row of it is held in memory.

The history and a sharded run's shards are read back from files that were written by this tool but can since have
been cut short (a full disk, a copy stopped), edited, or written by another version or another tool. Each reader
stopping on the first such file left every later run without verdicts; a file of another schema met a sort or a
comparison much later (``TypeError: '<' not supported``) naming neither the file nor the problem; and a few dozen
KB can hold millions of identical rows, each a Python object once read. So a file is checked from its footer
alone (schema version, schema, row count, what its columns unpack to) and then read only for the columns asked
for; what does not fit raises :class:`UnfitTable` naming the file and the problem, and the reader decides what
to do without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cluster_accept.analysis.schemas import SCHEMA_VERSION, TABLES
from cluster_accept.inventory.hostlist import MAX_NODES

# A run's rows per node, by table, well above what a node yields (an 8-GPU HGX node: a few hundred checks and
# counters, a few dozen figures): a file with more rows than its run's nodes can have is no record of that run.
ROWS_PER_NODE = 20_000
ONE_ROW_PER = {"runs": "run", "verdicts": "node"}  # exactly: a run's one row, one verdict per node
# What any file may take once read (the run's row is as editable as the file, so it buys little more): the footer
# tells each column's unpacked bytes, and each value read is an object of about CELL_BYTES in a frame.
FILE_BUDGET_BYTES = 512 * 2**20
# Beyond FILE_BUDGET_BYTES, a file may take this much for each row its run can have: a run of 16,384 nodes
# (a million check rows, several million figures) is read whole, while a run's row claiming more nodes than it
# had buys little (20,000 rows a node: 320 KiB a node).
ROW_BUDGET_BYTES = 16
CELL_BYTES = 64
KEY_COLUMNS = ("run_id",)  # every table's rows name their run
_SAID_CHARS = 200  # a reader's own error is quoted this far


class UnfitTable(ValueError):
    """A table file that cannot be read as its table: not Parquet, cut short, another schema, implausible rows."""

    def __init__(self, path: Path, problem: str, left: str = "") -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
        self.left = left  # why it is to be left where it is (sound for another reader); "": to be moved aside


def row_limit(table: str, nodes: int) -> int:
    """The most rows a run of ``nodes`` nodes writes to ``table``: one in ``runs``, one per node in
    ``verdicts``, :data:`ROWS_PER_NODE` per node elsewhere. ``nodes`` is held to 1 … MAX_NODES."""
    nodes = min(max(nodes, 1), MAX_NODES)
    if table == "runs":
        return 1
    return nodes if table == "verdicts" else nodes * ROWS_PER_NODE


def _kind(kind: pa.DataType) -> str:
    """What a column holds, as far as reading it back goes: any width of integer is an integer, any text text."""
    if pa.types.is_dictionary(kind):
        return _kind(kind.value_type)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "text"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"a list of {_kind(kind.value_type)}"
    for name, test in (("an integer", pa.types.is_integer), ("a number", pa.types.is_floating)):
        if test(kind):
            return name
    if pa.types.is_timestamp(kind):
        return "a time"
    return "a boolean" if pa.types.is_boolean(kind) else str(kind)


def schema_problem(found: pa.Schema, table: str) -> str | None:
    """Why a file's schema is not ``table``'s, or None. Columns a later version added may be absent (they read
    as nulls) and a column may be stored wider or narrower; a column holding another kind of value (text where
    this version has a number), a column named twice, no ``run_id``, or a file naming another table is another
    schema."""
    expected = TABLES[table]
    named = (found.metadata or {}).get(b"cluster_accept_schema", table.encode()).decode(errors="replace")
    if named != table:
        return f"another schema: it holds the {named[:40]!r} table, not {table}"
    twice = sorted({n for n in found.names if found.names.count(n) > 1})
    missing = [n for n in KEY_COLUMNS if n not in found.names]
    if twice or missing:
        return f"another schema: {'columns named twice: ' + ', '.join(twice) if twice else 'no run_id column'}"
    wrong = [
        f"{field.name} holds {_kind(field.type)}, not {_kind(expected.field(field.name).type)}"
        for field in found
        if field.name in expected.names and _kind(field.type) != _kind(expected.field(field.name).type)
    ]
    return f"another schema: {'; '.join(wrong[:3])}" if wrong else None


def read_cost_bytes(metadata: pq.FileMetaData, stored: Sequence[str], columns: int) -> int:
    """What reading ``stored`` columns of a file takes, from its footer alone: their bytes unpacked (each row
    group's column chunks, uncompressed) plus :data:`CELL_BYTES` for each of the ``columns`` values of each row
    (a run of identical values packs to a few bytes whatever the row count)."""
    unpacked = sum(
        group.column(i).total_uncompressed_size
        for group in (metadata.row_group(g) for g in range(metadata.num_row_groups))
        for i in range(group.num_columns)
        if group.column(i).path_in_schema.split(".")[0] in stored
    )
    return unpacked + metadata.num_rows * columns * CELL_BYTES


def _hold_to_budget(
    path: Path, metadata: pq.FileMetaData, stored: Sequence[str], columns: int, max_rows: int | None
) -> None:
    """Raise :class:`UnfitTable` when reading the file would take more than :data:`FILE_BUDGET_BYTES`, or, for
    a large run, more than :data:`ROW_BUDGET_BYTES` for each row it can have: what one file costs is bounded by
    the size of its run, never by how well its values pack."""
    budget = FILE_BUDGET_BYTES if max_rows is None else max(FILE_BUDGET_BYTES, max_rows * ROW_BUDGET_BYTES)
    cost = read_cost_bytes(metadata, stored, columns)
    if cost > budget:
        raise UnfitTable(path, f"it unpacks to {cost:,} bytes, more than a file may take here ({budget:,})")


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:_SAID_CHARS]}"


def _version_problem(found: pa.Schema) -> str | None:
    version = (found.metadata or {}).get(b"version", SCHEMA_VERSION.encode()).decode(errors="replace")
    if version == SCHEMA_VERSION:
        return None
    return f"written with schema version {version[:20]!r}, this version reads {SCHEMA_VERSION!r}"


def read_table_file(
    path: Path, table: str, columns: Sequence[str] | None = None, max_rows: int | None = None
) -> pa.Table:
    """``table``'s file at ``path``: its ``columns``, those it lacks as nulls (default: those of the table's
    columns it has), each of this version's type. Raises :class:`UnfitTable` when the file is no readable
    Parquet file, is of another schema, holds more than ``max_rows`` rows or unpacks past its budget
    (:func:`_hold_to_budget`), each found from the footer before any column is read; a file of another schema
    version (its schema that version's to judge) is one to leave where it is (``left``)."""
    expected = TABLES[table]
    try:
        with pq.ParquetFile(path) as parquet:
            found, rows = parquet.schema_arrow, parquet.metadata.num_rows
            if (version := _version_problem(found)) is not None:  # its schema is its version's to judge
                raise UnfitTable(path, version, left="for the version that wrote it")
            problem = schema_problem(found, table)
            if problem is not None:
                raise UnfitTable(path, problem)
            if max_rows is not None and rows > max_rows:
                raise UnfitTable(path, f"{rows:,} rows, more than its run can have ({max_rows:,})")
            wanted = [c for c in (found.names if columns is None else columns) if c in expected.names]
            stored = [c for c in wanted if c in found.names]
            _hold_to_budget(path, parquet.metadata, stored, len(wanted), max_rows)
            read = parquet.read(columns=stored)
        return _as_written(read, wanted, expected)
    except UnfitTable:
        raise
    except (OSError, ValueError, TypeError, KeyError, pa.ArrowException) as exc:
        raise UnfitTable(path, f"cannot be read as a Parquet file of {table} ({_said(exc)})") from None


def _as_written(read: pa.Table, wanted: Sequence[str], expected: pa.Schema) -> pa.Table:
    """``read`` with each ``wanted`` column of this version's type, in that order; one the file lacks as nulls."""
    arrays = [
        read.column(name).cast(expected.field(name).type)
        if name in read.column_names
        else pa.nulls(read.num_rows, expected.field(name).type)
        for name in wanted
    ]
    return pa.table(arrays, schema=pa.schema([expected.field(name) for name in wanted]))
