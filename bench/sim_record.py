"""Record what real (test-bed) nodes answer, for the simulated transport (:mod:`remote.simulated`).

Brings up a test-bed with one node per variant (a healthy node, and one node per planted fault), runs every
preflight check's command and every single-node probe's commands (full and quick) on each, and writes the
answers as a recording: the healthy node's in full, each faulty variant's only where they differ. A
simulated inventory names the recording (``simulation.recording``) and its nodes answer from it.

Needs root. ``python3 bench/sim_record.py [--out bench/sim/testbed-h200x4.json]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_accept.checks.base import discover  # noqa: E402
from cluster_accept.inventory.load import load_inventory  # noqa: E402
from cluster_accept.probes.base import scripts_for  # noqa: E402
from cluster_accept.remote.fanout import run_node  # noqa: E402
from cluster_accept.remote.result import CommandResult  # noqa: E402
from cluster_accept.remote.simulated import Answer, Recording  # noqa: E402
from cluster_accept.tasks.check_batch import commands_for  # noqa: E402
from cluster_accept.tasks.probe_dir import run_in_probe_dir  # noqa: E402
from cluster_accept.tasks.single_node import probe_commands, probes_of_stage  # noqa: E402
from cluster_accept.testbed import bed  # noqa: E402
from cluster_accept.testbed.faults import fault_plan_from_data  # noqa: E402

# Variant -> the test-bed faults that make it; node01 is healthy.
VARIANTS: dict[str, list[object]] = {
    "healthy": [],
    "gpu_missing": ["gpu_missing"],
    "driver_version": [{"driver_version": {"version": "570.86.15"}}],
    "nvlink_inactive": [{"nvlink_inactive": {"gpu": 1, "link": 7}}],
    "nvlink_errors": [{"nvlink_errors": {"gpu": 0, "link": 3, "crc": 12, "replay": 0, "recovery": 0}}],
    "pcie_width": [{"pcie_width": {"gpu": 2, "width": 8}}],
    "persistence_disabled": ["persistence_disabled"],
    "xid": [{"xid": {"code": 79, "gpu": 1}}],
    "nvidia_smi_fail": ["nvidia_smi_fail"],
}
DEFAULT_OUT = Path(__file__).resolve().parent / "sim" / "testbed-h200x4.json"


def _answer(result: CommandResult) -> Answer:
    """A command that never reported (killed at its timeout) is recorded as timed out (exit 124)."""
    return Answer(result.exit_code if result.exit_code is not None else 124, result.stdout, result.stderr)


def record(out: Path) -> Recording:
    names = list(VARIANTS)
    plan = fault_plan_from_data({"nodes": {f"node{i:02d}": f for i, f in enumerate(VARIANTS.values(), 1) if f}})
    state = Path(tempfile.mkdtemp(prefix="sim-record-"))
    tb = bed.up(len(names), plan, state_dir=state, prefix="simrec")
    try:
        inventory = load_inventory(tb.inventory_path)
        checks = discover()
        recording = Recording(python=sys.executable)  # the test-bed profile's probes.python
        for node, variant in zip(inventory.tested, names, strict=True):
            started = time.perf_counter()
            commands = commands_for(checks, node)
            result = run_node(node, commands)
            for command, answer in zip(commands, result.commands, strict=True):
                recording.add(
                    variant, node.name, command.script, Answer(answer.exit_code or 0, answer.stdout, answer.stderr)
                )
            for quick in (False, True):
                probes = probes_of_stage()
                files = tuple(dict.fromkeys(f for s in scripts_for(node, probes, quick) for f in s.files))
                probe_run = run_in_probe_dir(node, files, probe_commands(node, quick, probes))
                for command, answer in zip(probe_commands(node, quick, probes), probe_run.results, strict=True):
                    recording.add(
                        variant, node.name, command.script, Answer(answer.exit_code or 0, answer.stdout, answer.stderr)
                    )
            print(f"{variant:22s} {node.name}: {len(recording.variants.get(variant, {}))} answers "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)  # fmt: skip
        out.parent.mkdir(parents=True, exist_ok=True)
        recording.save(out)
        return recording
    finally:
        bed.down(state, "simrec")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    recording = record(args.out)
    print(f"wrote {args.out}: {', '.join(f'{v} {len(a)}' for v, a in recording.variants.items())}")


if __name__ == "__main__":
    main()
