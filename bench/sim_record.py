"""Record what real (test-bed) nodes answer, for the simulated transport (:mod:`simulator.nodes`).

Brings up a test-bed with one node per variant (a healthy node, and one node per planted fault), runs every
preflight check's command and every single-node probe's commands (full and quick) on each, and writes the
answers as a recording: the healthy node's in full, each faulty variant's only where they differ. A
simulated inventory names the recording (``simulation.recording``) and its nodes answer from it.

Then the multi-node runs (:func:`record_launches`, on a test-bed of its own): the all-reduce across 2 healthy
nodes, every rank's answer by its role (the first node, the others), and each broken variant's run
(:data:`LAUNCH_VARIANTS`: a healthy node rank 0 beside the broken node rank 1, failing as it does).
``--launches-only`` adds those to an existing recording and keeps its other answers.

Needs root. ``python3 bench/sim_record.py [--out bench/sim/testbed-h200x4.json] [--launches-only]
[--subnet 10.254.207.0/24]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_accept.checks.base import discover  # noqa: E402
from cluster_accept.inventory.load import load_inventory  # noqa: E402
from cluster_accept.inventory.model import Node  # noqa: E402
from cluster_accept.probes.base import scripts_for  # noqa: E402
from cluster_accept.remote.fanout import run_node  # noqa: E402
from cluster_accept.remote.launch import GroupRun, rendezvous_address  # noqa: E402
from cluster_accept.remote.probe_dir import run_in_probe_dir  # noqa: E402
from cluster_accept.remote.result import CommandResult  # noqa: E402
from cluster_accept.simulator.launch import NO_STATUS, launch_key, rank_key, tokenize  # noqa: E402
from cluster_accept.simulator.nodes import Answer, Recording  # noqa: E402
from cluster_accept.tasks.multi_node.ranks import ALLREDUCE_JOB, launch_group  # noqa: E402
from cluster_accept.tasks.preflight.check_batch import commands_for  # noqa: E402
from cluster_accept.tasks.probe_runs import probe_commands  # noqa: E402
from cluster_accept.tasks.single_node import STAGE as SINGLE_NODE  # noqa: E402
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
# Variants that break a multi-node run (and pass preflight and single-node as healthy nodes do): a link held to
# 1 Mbit/s, whose all-reduce runs into the probe's timeout (shortened here, so that recording takes seconds).
LAUNCH_VARIANTS: dict[str, list[object]] = {"net_stalled": [{"slow": {"rate_mbit": 1}}]}
LAUNCH_SIZES = (2,)  # a run of more nodes is told from it (simulator.launch.group_answers)
RECORD_TIMEOUT_S = 40


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
                probes = SINGLE_NODE.probes()
                files = tuple(dict.fromkeys(f for s in scripts_for(node, probes, quick) for f in s.files))
                probe_run = run_in_probe_dir(node, files, probe_commands(node, quick, probes))
                for command, answer in zip(probe_commands(node, quick, probes), probe_run.commands, strict=True):
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


def _add_run(recording: Recording, variant: str, nodes: list[Node], run: GroupRun, roles: list[str]) -> None:
    """Every rank's answer of one real run, keyed by its role and its command with the run's values as tokens."""
    master = rendezvous_address(nodes[0])
    for index, (node, role) in enumerate(zip(nodes, roles, strict=True)):
        # The port the run picked is not kept (0: unknown): no output names it.
        command = ALLREDUCE_JOB.command(node, index, len(nodes), master, 0, run.tag)
        key, args = rank_key(command), command.rendezvous
        assert key is not None and args is not None, command.script
        rank = run.ranks[node.name]
        result = rank.result
        code = NO_STATUS if result is None or result.exit_code is None else result.exit_code
        out, err = (result.stdout, result.stderr) if result is not None else ("", rank.detail)
        answer = Answer(code, tokenize(out, node.name, args), tokenize(err, node.name, args))
        recording.launches.setdefault(variant, {})[launch_key(len(nodes), role, key)] = answer


def record_launches(recording: Recording, subnet: str | None) -> None:
    """Real multi-node runs on a test-bed (healthy nodes, then one node per broken variant) into ``recording``."""
    healthy = max(LAUNCH_SIZES)
    names = [f"node{i:02d}" for i in range(healthy + 1, healthy + 1 + len(LAUNCH_VARIANTS))]
    plan = fault_plan_from_data({"nodes": dict(zip(names, LAUNCH_VARIANTS.values(), strict=True))})
    state = Path(tempfile.mkdtemp(prefix="sim-record-launch-"))
    tb = bed.up(healthy + len(names), plan, state_dir=state, prefix="smrec", subnet=subnet)
    try:
        data = yaml.safe_load(tb.inventory_path.read_text())
        for profile in data["profiles"].values():
            profile["probes"]["timeout_s"] = RECORD_TIMEOUT_S  # not part of the command's text
        shortened = state / "inventory-short.yaml"
        shortened.write_text(yaml.safe_dump(data, sort_keys=False))
        nodes = load_inventory(shortened).tested
        for size in LAUNCH_SIZES:
            started = time.perf_counter()
            run = launch_group(nodes[:size], job=ALLREDUCE_JOB)
            assert run.ok, f"the healthy {size}-node run failed: {run.detail}"
            _add_run(recording, "healthy", nodes[:size], run, ["0"] + ["n"] * (size - 1))
            print(f"healthy {size} nodes: {run.busbw_gbps} GB/s ({time.perf_counter() - started:.1f} s)", flush=True)
        for variant, node in zip(LAUNCH_VARIANTS, nodes[healthy:], strict=True):
            started = time.perf_counter()
            run = launch_group([nodes[0], node], job=ALLREDUCE_JOB)
            assert not run.ok, f"the {variant} run did not fail"
            _add_run(recording, variant, [nodes[0], node], run, ["0", "n"])
            recording.variants.setdefault(variant, {})  # preflight and single-node: as a healthy node
            print(f"{variant}: {run.detail} ({time.perf_counter() - started:.1f} s)", flush=True)
    finally:
        bed.down(state, "smrec")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--launches-only", action="store_true", help="add multi-node runs to the recording at --out")
    parser.add_argument("--subnet", default=None, help="the multi-node test-bed's subnet (default: a free one)")
    args = parser.parse_args()
    recording = Recording.load(args.out) if args.launches_only else record(args.out)
    record_launches(recording, args.subnet)
    recording.save(args.out)
    print(f"wrote {args.out}: {', '.join(f'{v} {len(a)}' for v, a in recording.variants.items())}; multi-node: "
          f"{', '.join(f'{v} {len(a)}' for v, a in recording.launches.items())}")  # fmt: skip


if __name__ == "__main__":
    main()
