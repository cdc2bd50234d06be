"""Text surgery on captured nvidia-smi outputs, shared by fault application (at ``up``) and the stand-in.

Faults and ``-i`` selection both boil down to "find the part of a captured output that belongs to GPU k and
drop or edit it". Doing that on the real captured text (instead of re-rendering outputs from a model) keeps
every byte the tool under test sees identical to a real node except for the part a fault changes.

This module is imported by the node-side stand-in, so it uses the standard library only and stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# `-q` text: one block per GPU starting with "GPU 00000000:00:06.0" at column 0 (q-*.txt alike).
Q_START = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
# `-q -x`: <gpu id="00000000:00:06.0"> ... </gpu>
X_START = re.compile(r'^\s*<gpu id="([^"]+)">\s*$')
X_END = re.compile(r"^\s*</gpu>\s*$")
# nvlink -s/-c/-e/-gt: "GPU 0: NVIDIA H200 (UUID: GPU-...)"
N_START = re.compile(r"^GPU (\d+): ")
# plain `nvidia-smi`: first line of a GPU entry, "|   0  NVIDIA H200    On  |"
T_START = re.compile(r"^\|\s+(\d+)\s+\S")


@dataclass
class Blocks:
    """A text cut into a head, per-GPU blocks (keyed by what the start line names) and a tail."""

    head: str
    blocks: list[tuple[str, str]]
    tail: str

    def join(self) -> str:
        return self.head + "".join(text for _, text in self.blocks) + self.tail

    def keep(self, wanted: Callable[[str], bool]) -> Blocks:
        return Blocks(self.head, [(k, t) for k, t in self.blocks if wanted(k)], self.tail)

    def edit(self, key: str, change: Callable[[str], str]) -> Blocks:
        return Blocks(self.head, [(k, change(t) if k == key else t) for k, t in self.blocks], self.tail)


def split_blocks(text: str, start: re.Pattern[str], end: re.Pattern[str] | None = None) -> Blocks:
    """Cut ``text`` at every line matching ``start``; with ``end``, a block stops after its end line.

    Blank lines after an end line stay with the block (so dropping a block keeps the spacing right);
    the first other line after it starts the tail (e.g. ``</nvidia_smi_log>``).
    """
    head: list[str] = []
    tail: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    state = "head"
    for line in text.splitlines(keepends=True):
        m = start.match(line)
        if m:
            blocks.append((m.group(1), [line]))
            state = "open"
        elif state == "head":
            head.append(line)
        elif state == "open":
            blocks[-1][1].append(line)
            if end is not None and end.match(line):
                state = "closed"
        elif state == "closed" and not line.strip() and not tail:
            blocks[-1][1].append(line)
        else:
            state = "tail"
            tail.append(line)
    return Blocks("".join(head), [(k, "".join(v)) for k, v in blocks], "".join(tail))


def q_blocks(text: str) -> Blocks:
    return split_blocks(text, Q_START)


def xml_blocks(text: str) -> Blocks:
    return split_blocks(text, X_START, X_END)


def nvlink_blocks(text: str) -> Blocks:
    return split_blocks(text, N_START)


def table_blocks(text: str) -> Blocks:
    """The plain ``nvidia-smi`` table: each GPU is three rows plus the ``+---`` separator under them."""
    lines = text.splitlines(keepends=True)
    end_of_gpus = next((i for i, line in enumerate(lines) if "Processes:" in line), len(lines))
    starts = [i for i in range(end_of_gpus) if T_START.match(lines[i])]
    if not starts:
        return Blocks(text, [], "")
    blocks: list[tuple[str, str]] = []
    for i in starts:
        m = T_START.match(lines[i])
        assert m is not None
        blocks.append((m.group(1), "".join(lines[i : i + 4])))
    last = starts[-1] + 4
    return Blocks("".join(lines[: starts[0]]), blocks, "".join(lines[last:]))


def drop_topo_gpu(text: str, index: int) -> str:
    """Remove GPU ``index``'s row and column from ``nvidia-smi topo -m`` (tab-separated, escape codes)."""
    label = f"GPU{index}"
    out: list[str] = []
    column: int | None = None
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        cells = body.split("\t")
        if column is None and any(strip_ansi(c).strip() == label for c in cells[1:]):
            column = next(i for i, c in enumerate(cells) if i > 0 and strip_ansi(c).strip() == label)
            prefix = cells[column][: len(cells[column]) - len(strip_ansi(cells[column]))]
            del cells[column]
            if column < len(cells) and prefix:  # keep the underline escape on the new first header cell
                cells[column] = prefix + cells[column]
            out.append("\t".join(cells) + line[len(body) :])
            continue
        if cells[0] == label:
            continue
        if column is not None and cells[0].startswith("GPU") and len(cells) > column:
            del cells[column]
        out.append("\t".join(cells) + line[len(body) :])
    return "".join(out)


def topo_links(text: str, index: int, delta: int) -> str:
    """Change the ``NV#`` bond count by ``delta`` between GPU ``index`` and every peer (row and column)."""
    lines = text.splitlines(keepends=True)
    header = next((i for i, line in enumerate(lines) if "GPU0" in strip_ansi(line)), None)
    if header is None:
        return text
    heads = [strip_ansi(c).strip() for c in lines[header].rstrip("\n").split("\t")]
    label = f"GPU{index}"

    def bump(cell: str) -> str:
        return re.sub(r"NV(\d+)", lambda m: f"NV{max(0, int(m.group(1)) + delta)}", cell)

    for i, line in enumerate(lines):
        body = line.rstrip("\n")
        cells = body.split("\t")
        if i == header or not cells[0].startswith("GPU"):
            continue
        for j in range(1, len(cells)):
            if j < len(heads) and (cells[0] == label or heads[j] == label):
                cells[j] = bump(cells[j])
        lines[i] = "\t".join(cells) + line[len(body) :]
    return "".join(lines)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def replace_keep_width(line: str, old: str, new: str) -> str:
    """Replace ``old`` by ``new`` in a fixed-width table row, eating or adding the spaces after it."""
    pos = line.find(old)
    while pos >= 0:
        after = pos + len(old)
        spaces = len(line[after:]) - len(line[after:].lstrip(" "))
        diff = len(new) - len(old)
        if diff > 0:
            eat = min(diff, max(0, spaces - 1))
            line = line[:pos] + new + line[after + eat :]
        else:
            line = line[:pos] + new + " " * (-diff) + line[after:]
        pos = line.find(old, pos + len(new))
    return line


def csv_table(text: str) -> tuple[list[str], list[list[str]]]:
    """A ``--format=csv`` output as (header cells, rows of cells); cells are split on ``", "``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return [], []
    return lines[0].split(", "), [line.split(", ") for line in lines[1:]]


def without_unit(header: str) -> tuple[str, str | None]:
    """``"memory.total [MiB]"`` -> ``("memory.total", "MiB")``."""
    m = re.fullmatch(r"(.*?) \[([^\]]+)\]", header)
    return (m.group(1), m.group(2)) if m else (header, None)


def strip_unit(value: str, unit: str | None) -> str:
    if unit and value.endswith(" " + unit):
        return value[: -len(unit) - 1]
    return value
