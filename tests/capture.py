"""Read the real captured outputs in testbed/captures (command line first, ``[exit N]`` last), and the
helpers the check tests share to derive outputs and faulty variants from them."""

from __future__ import annotations

import re
from pathlib import Path

from cluster_accept.checks.base import CheckRow, ClusterView

CAPTURES = Path(__file__).resolve().parent.parent / "cluster_accept" / "testbed" / "captures"


def captured(machine: str, name: str) -> tuple[str, int]:
    """(what the tool printed, its exit code) from a capture file."""
    lines = (CAPTURES / machine / name).read_text().splitlines(keepends=True)
    assert lines[0].startswith("$ "), name
    assert lines[-1].startswith("[exit "), name
    return "".join(lines[1:-1]), int(lines[-1].strip()[6:-1])


def every_field_block(field: str) -> list[str]:
    """Header and values of one field in h200x4/query-gpu-every-field.txt."""
    lines = (CAPTURES / "h200x4" / "query-gpu-every-field.txt").read_text().splitlines()
    start = lines.index(f"### {field}") + 1
    block = []
    for line in lines[start:]:
        if line.startswith("### "):
            break
        block.append(line)
    return block


# A cluster of one: no majority to drift from.
NO_CLUSTER = ClusterView(majority={}, nodes_compared=0)

# What nvidia-smi prints (exit 9) when it cannot reach the driver.
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def noheader(machine: str, fields: list[str]) -> str:
    """What ``--query-gpu=<fields> --format=csv,noheader,nounits`` prints, from the machine's query-gpu.txt."""
    stdout, code = captured(machine, "query-gpu.txt")
    assert code == 0
    header, *lines = stdout.splitlines()
    heads = [re.fullmatch(r"(.*?)(?: \[(.+)\])?", cell) for cell in header.split(", ")]
    names = [m.group(1) for m in heads if m]
    units = [m.group(2) for m in heads if m]
    out = []
    for line in lines:
        cells = line.split(", ")
        assert len(cells) == len(names) == len(units)
        picked = []
        for f in fields:
            value, unit = cells[names.index(f)], units[names.index(f)]
            picked.append(value.removesuffix(f" {unit}") if unit else value)
        out.append(", ".join(picked) + "\n")
    return "".join(out)


def cut_mid_line(text: str) -> str:
    """The output cut in its middle, not on a line end (as when the tool dies while writing)."""
    cut = len(text) // 2
    return text[: cut - 1 if text[cut - 1] == "\n" else cut]


def table(rows: list[CheckRow]) -> list[tuple[object, ...]]:
    return [(r.item, r.gpu, r.status.value, r.reason, r.observed, r.expected) for r in rows]
