"""Read the real captured outputs in testbed/captures (command line first, ``[exit N]`` last)."""

from __future__ import annotations

from pathlib import Path

CAPTURES = Path(__file__).resolve().parent.parent / "testbed" / "captures"


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
