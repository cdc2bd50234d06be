"""Read a set of real captured GPU-tool outputs (``testbed/captures/<base>/``) into what a node serves.

The captures are kept byte for byte as taken; this module strips the ``$ command`` / ``[exit N]`` framing,
makes the set self-consistent (the every-field table and ``nvlink -gt r`` were taken on a second machine
with other UUIDs/serials: those are mapped onto the first machine's), fills the few outputs a base lacks
(h100x1 has no ``--query-remapped-rows`` capture, ...) from the data it has, and builds the
``--query-gpu`` field table the stand-in answers any field list from.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from cluster_accept.testbed.textops import csv_table, without_unit

CAPTURES_DIR = Path(__file__).parent / "captures"
BASES = ("h200x4", "h100x1")
# Captures that describe errors or one-off invocations: the stand-in produces those itself.
_NOT_SERVED = {"query-gpu-invalid-field.txt", "invalid-index.txt", "query-gpu-one-index-noheader-nounits.txt"}

_CMD_LINE = re.compile(r"^\$ ")
_EXIT_LINE = re.compile(r"^(\[exit (-?\d+)\]|rc=(-?\d+))\s*$")


def strip_capture(text: str) -> tuple[str, int | None]:
    """What the tool printed and its exit status: drop a leading ``$ cmd`` and a trailing ``[exit N]``."""
    lines = text.splitlines(keepends=True)
    status: int | None = None
    if lines and _CMD_LINE.match(lines[0]):
        lines = lines[1:]
    if lines:
        m = _EXIT_LINE.match(lines[-1])
        if m:
            status = int(m.group(2) or m.group(3))
            lines = lines[:-1]
    return "".join(lines), status


@dataclass
class FieldTable:
    """``--query-gpu`` answers: canonical field -> header (with unit) and one value per GPU."""

    order: list[str]
    headers: dict[str, str]
    values: dict[str, list[str]]
    aliases: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return len(self.values[self.order[0]]) if self.order else 0

    def canonical(self, name: str) -> str | None:
        name = self.aliases.get(name, name)
        return name if name in self.headers else None

    def get(self, name: str, gpu: int) -> str:
        canonical = self.canonical(name)
        if canonical is None:
            raise KeyError(name)
        return self.values[canonical][gpu]

    def set(self, name: str, gpu: int | None, value: str) -> None:
        canonical = self.canonical(name)
        if canonical is None:
            return
        gpus = range(self.gpu_count) if gpu is None else [gpu]
        for g in gpus:
            self.values[canonical][g] = value

    def drop_gpu(self, gpu: int) -> None:
        for values in self.values.values():
            del values[gpu]

    def to_json(self) -> dict[str, object]:
        return {"order": self.order, "headers": self.headers, "values": self.values, "aliases": self.aliases}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> FieldTable:
        return cls(
            order=list(data["order"]),  # type: ignore[call-overload]
            headers=dict(data["headers"]),  # type: ignore[call-overload]
            values={k: list(v) for k, v in dict(data["values"]).items()},  # type: ignore[call-overload]
            aliases=dict(data["aliases"]),  # type: ignore[call-overload]
        )


def parse_aliases(help_text: str) -> tuple[list[str], dict[str, str]]:
    """Field names from ``--help-query-gpu``: lines like ``"clocks.current.sm" or "clocks.sm"``."""
    names: list[str] = []
    aliases: dict[str, str] = {}
    for line in help_text.splitlines():
        if re.fullmatch(r'"[^"]+"( or "[^"]+")*', line.strip()):
            found = re.findall(r'"([^"]+)"', line)
            names.append(found[0])
            for alias in found[1:]:
                if alias != found[0]:
                    aliases[alias] = found[0]
    return names, aliases


def parse_every_field(text: str) -> FieldTable:
    """``### field`` / header / one value per GPU blocks -> table (an empty block = empty values)."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("### "):
            blocks.append((line[4:].strip(), []))
        elif blocks and line != "":
            blocks[-1][1].append(line)
    gpus = max(len(lines) - 1 for _, lines in blocks)
    table = FieldTable(order=[], headers={}, values={})
    for name, lines in blocks:
        table.order.append(name)
        table.headers[name] = lines[0] if lines else name
        values = lines[1:]
        table.values[name] = values + [""] * (gpus - len(values))
    return table


def parse_query_csv(text: str) -> FieldTable:
    """A ``--query-gpu=... --format=csv`` capture -> table of just those fields."""
    header, rows = csv_table(text)
    table = FieldTable(order=[], headers={}, values={})
    for i, cell in enumerate(header):
        name, _ = without_unit(cell)
        table.order.append(name)
        table.headers[name] = cell
        table.values[name] = [row[i] for row in rows]
    return table


@dataclass
class CaptureSet:
    """One base's outputs as a node serves them: file name -> printed text, plus the field table."""

    base: str
    files: dict[str, str]

    def copy(self) -> CaptureSet:
        return CaptureSet(self.base, dict(self.files))


def build_table(files: dict[str, str]) -> FieldTable:
    """The field table from a (possibly fault-edited) capture set.

    With an every-field capture, its values are overlaid by ``query-gpu.txt`` (taken on the same machine as
    ``-L``, ``-q``, ...), so uuid/serial/temperature agree across outputs; without one, only the fields of
    ``query-gpu.txt`` exist.
    """
    _, aliases = parse_aliases(files.get("help-query-gpu.txt", ""))
    main = parse_query_csv(files["query-gpu.txt"])
    if "query-gpu-every-field.txt" in files:
        table = parse_every_field(files["query-gpu-every-field.txt"])
        for name in main.order:
            if name in table.values and len(main.values[name]) == table.gpu_count:
                table.values[name] = list(main.values[name])
    else:
        table = main
    table.aliases = {a: c for a, c in aliases.items() if c in table.headers}
    return table


def _uuid_map(files: dict[str, str]) -> dict[str, str]:
    if "query-gpu-every-field.txt" not in files:
        return {}
    other = parse_every_field(files["query-gpu-every-field.txt"])
    main = parse_query_csv(files["query-gpu.txt"])
    mapping: dict[str, str] = {}
    for name in ("uuid", "serial"):
        if name in other.values and name in main.values:
            mapping.update(zip(other.values[name], main.values[name], strict=False))
    return mapping


def _fill_missing(files: dict[str, str]) -> None:
    """Outputs a base lacks, built the way the h200x4 ones look, from this base's own GPUs."""
    main = parse_query_csv(files["query-gpu.txt"])
    buses = main.values.get("pci.bus_id", [])
    if "query-remapped-rows.txt" not in files:
        rows = [f"{b}, 0, 0, No, No\n" for b in buses]
        header = "gpu_bus_id, remapped_rows.correctable, remapped_rows.uncorrectable, "
        files["query-remapped-rows.txt"] = header + "remapped_rows.pending, remapped_rows.failure\n" + "".join(rows)
    if "query-retired-pages.txt" not in files:
        rows = [f"{b}, [N/A], {cause}\n" for b in buses for cause in ("Single Bit ECC", "Double Bit ECC")]
        files["query-retired-pages.txt"] = "gpu_bus_id, retired_pages.address, retired_pages.cause\n" + "".join(rows)
    files.setdefault("query-compute-apps.txt", "pid, process_name, used_gpu_memory [MiB]\n")
    if "nvlink-gt-r.txt" not in files:
        files["nvlink-gt-r.txt"] = (
            files.get("nvlink-gt.txt", "").replace("Data Tx", "Raw Tx").replace("Data Rx", "Raw Rx")
        )


@functools.lru_cache(maxsize=4)
def _load(base: str) -> CaptureSet:
    folder = CAPTURES_DIR / base
    if base not in BASES or not folder.is_dir():
        raise ValueError(f"unknown test-bed base {base!r}; known: {', '.join(BASES)}")
    files: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in _NOT_SERVED and path.name != "README.md":
            files[path.name], _ = strip_capture(path.read_text(encoding="utf-8"))
    mapping = _uuid_map(files)
    if mapping:
        for name, text in files.items():
            if name != "query-gpu-every-field.txt":
                for old, new in mapping.items():
                    text = text.replace(old, new)
                files[name] = text
    _fill_missing(files)
    return CaptureSet(base, files)


def load_base(base: str) -> CaptureSet:
    """The served capture set of ``base`` (a fresh copy, safe to edit)."""
    return _load(base).copy()


def raw_capture(base: str, name: str) -> tuple[str, int | None]:
    """One capture file as printed and its exit status (for tests comparing against the real thing)."""
    return strip_capture((CAPTURES_DIR / base / name).read_text(encoding="utf-8"))
