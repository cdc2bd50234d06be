"""The single-node stage: ship the probes to a node, run them, bring back figures and NCCL's transport.

Per node (one Prefect task): a private ``mktemp -d`` directory on the node receives ``probes/*.py`` over
SFTP (a copy for the local transport); the GPU probe and the intra-node all-reduce run there under the
node-side ``timeout`` (a hung probe's whole process group is killed on the node, the node is marked
``timeout``, its other results are kept); the directory is removed afterwards whatever happened.
Evaluation waits for every node, since stragglers are judged against the cluster.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from cluster_accept.analysis.probe_output import (
    ProbeOutput,
    nccl_transports,
    nccl_version,
    parse_json_lines,
    parse_nccl_tests,
    transport_matches,
)
from cluster_accept.analysis.probe_verdicts import judge, measurement_row
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.remote.result import CommandResult, NodeStatus, RemoteCommand
from cluster_accept.tasks.checkpoints import Checkpoints, commands_from_data, commands_to_data
from cluster_accept.tasks.probe_dir import run_in_probe_dir
from cluster_accept.tasks.rows import row_dict, unreachable_row

STAGE = "single-node"
PROBE_FILES = ("gpu_bench.py", "allreduce.py")


@dataclass
class NodeProbes:
    node: str
    status: NodeStatus
    detail: str = ""
    cause: str | None = None
    commands: list[CommandResult] = field(default_factory=list)
    outputs: dict[str, ProbeOutput] = field(default_factory=dict)


# A light suite's probes: fewer timed repeats, a short warm-up, all-reduce up to 256 MiB. Minutes per node
# instead of tens of minutes, for checks every few hours; the full suite measures as acceptance does.
QUICK_BENCH = " --repeats 3 --warmup-s 1"
QUICK_ALLREDUCE_MAX_BYTES = 256 << 20


def probe_commands(node: Node, quick: bool = False) -> list[RemoteCommand]:
    """The node-side command lines. ``command_prefix`` is the operator's own (e.g. ``docker exec trainer``)."""
    probes = node.profile.probes
    run = f"{probes.command_prefix} " if probes.command_prefix else ""
    python = shlex.quote(probes.python)
    device = probes.device
    nproc = (
        "n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); "
        'if [ "$n" -lt 2 ]; then echo \'{"info": "skip", "reason": "fewer than 2 GPUs"}\'; exit 0; fi; '
        if device == "cuda"
        else "n=2; "
    )
    top_bytes = probes.allreduce_max_bytes
    if quick:
        top_bytes = min(top_bytes or QUICK_ALLREDUCE_MAX_BYTES, QUICK_ALLREDUCE_MAX_BYTES)
    max_bytes = f" --max-bytes {top_bytes}" if top_bytes else ""
    if probes.nccl_tests_all_reduce:
        top = top_bytes or (1 << 30)
        allreduce = (
            f"{nproc}NCCL_DEBUG=INFO exec {run}{shlex.quote(probes.nccl_tests_all_reduce)} "
            f"-b 1M -e {top} -f 4 -g $n 2>&1"
        )
    else:
        allreduce = (
            f'cd "$CA_PROBE_DIR" && {nproc}NCCL_DEBUG=INFO exec {run}{python} -m torch.distributed.run '
            f"--standalone --nproc_per_node=$n allreduce.py --device {device}{max_bytes} 2>&1"
        )
    return [
        RemoteCommand(
            "gpu_bench",
            f'cd "$CA_PROBE_DIR" && exec {run}{python} gpu_bench.py --device {device}{QUICK_BENCH if quick else ""}',
            timeout_s=probes.timeout_s,
        ),
        RemoteCommand("allreduce", allreduce, timeout_s=probes.timeout_s),
    ]


def probe_script(node: Node, check: str, quick: bool = False) -> str:
    """The node-side command behind a judged figure of ``check``: the all-reduce probe or the GPU bench."""
    probe = "allreduce" if check == "allreduce" else "gpu_bench"
    return next(c.script for c in probe_commands(node, quick) if c.name == probe)


def run_probes_on_node(node: Node, quick: bool = False) -> NodeProbes:
    """Ship, run, collect, clean up. Never raises."""
    run = run_in_probe_dir(node, PROBE_FILES, probe_commands(node, quick))
    outputs = {r.name: parse_output(node, r) for r in run.results}
    return NodeProbes(node.name, run.status, run.detail, run.cause, run.results, outputs)


def parse_output(node: Node, result: CommandResult) -> ProbeOutput:
    """Our probes print JSON lines; nccl-tests prints its table (when the profile names the binary)."""
    if result.name == "allreduce" and node.profile.probes.nccl_tests_all_reduce:
        skip = parse_json_lines(result.stdout)
        return skip if skip.info else parse_nccl_tests(result.stdout)
    return parse_json_lines(result.stdout)


@task(name="single-node", task_run_name="single-node-{node.name}", cache_policy=NO_CACHE, persist_result=False)
def single_node_probes(node: Node, checkpoints: Checkpoints | None = None, quick: bool = False) -> NodeProbes:
    outcome = run_probes_on_node(node, quick)
    if checkpoints is not None:
        data = {
            "node": outcome.node,
            "status": outcome.status.value,
            "detail": outcome.detail,
            "cause": outcome.cause,
            "commands": commands_to_data(outcome.commands),
        }
        checkpoints.save_node(STAGE, node.name, data)
    return outcome


def saved_probes(checkpoints: Checkpoints, inventory: Inventory) -> dict[str, NodeProbes]:
    """Nodes whose probes finished before the run was interrupted; outputs parsed again from the raw text."""
    saved = {}
    for name, data in checkpoints.load_nodes(STAGE).items():
        node = inventory.node(name)
        commands = commands_from_data(data["commands"])
        outputs = {r.name: parse_output(node, r) for r in commands}
        status = NodeStatus(data["status"])
        saved[name] = NodeProbes(name, status, data["detail"], data["cause"], commands, outputs)
    return saved


def _command_rows(node: Node, result: CommandResult, output: ProbeOutput) -> list[CheckRow]:
    check = "gemm" if result.name == "gpu_bench" else "allreduce"
    tail = (result.stderr or result.stdout)[-2000:]
    if result.timed_out:
        return [
            CheckRow(
                check,
                result.name,
                Status.TIMEOUT,
                "probe_timeout",
                None,
                f"done within {node.profile.probes.timeout_s:g} s",
                "killed on the node with its whole process group",
            )
        ]
    rows = [CheckRow(check, result.name, Status.ERROR, "probe_error", None, None, e) for e in output.errors]
    if result.exit_code != 0 and not output.errors:
        rows.append(
            CheckRow(check, result.name, Status.ERROR, "probe_failed", f"exit {result.exit_code}", "exit 0", tail)
        )
    return rows


def _transport_rows(node: Node, result: CommandResult) -> tuple[list[CheckRow], str | None]:
    used = nccl_transports(result.stdout)
    if not used:
        return [], None
    observed = ",".join(sorted(used))
    expected = node.profile.probes.expected_transport.intra_node
    if expected is None:
        return [CheckRow("transport", "intra_node", Status.PASS, "recorded", observed, None)], observed
    bad = [t for t in used if not transport_matches(t, expected)]
    status, reason = (Status.FAIL, "unexpected") if bad else (Status.PASS, "ok")
    detail = ", ".join(f"{t}: {n} channel connections" for t, n in sorted(used.items()))
    return [CheckRow("transport", "intra_node", status, reason, observed, expected, detail)], observed


def evaluate_single_node(
    run_id: str, inventory: Inventory, outcomes: list[NodeProbes], quick: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(check rows, measurement rows) for the stage."""
    rows: list[dict[str, Any]] = []
    measurements: list[dict[str, Any]] = []
    for outcome in outcomes:
        node = inventory.node(outcome.node)
        if outcome.status is NodeStatus.UNREACHABLE:
            row = unreachable_row(outcome.cause, outcome.detail)
            rows.append(row_dict(run_id, inventory.cluster, STAGE, node.name, row, ""))
            continue
        if outcome.status is NodeStatus.ERROR and not outcome.commands:
            row = CheckRow("probe", "session", Status.ERROR, "session_failed", None, None, outcome.detail)
            rows.append(row_dict(run_id, inventory.cluster, STAGE, node.name, row, ""))
            continue
        for result in outcome.commands:
            output = outcome.outputs.get(result.name, ProbeOutput())
            raw = result.stdout[-20000:] + ("\n[stderr]\n" + result.stderr[-4000:] if result.stderr else "")
            check_rows = _command_rows(node, result, output)
            if any(i.get("info") == "skip" for i in output.info):
                reason = next(str(i.get("reason")) for i in output.info if i.get("info") == "skip")
                check_rows.append(CheckRow("allreduce", "intra_node", Status.SKIP, "single_gpu", None, None, reason))
            transport = None
            if result.name == "allreduce" and node.profile.probes.device == "cuda":
                transport_rows, transport = _transport_rows(node, result)
                check_rows += transport_rows
                version = nccl_version(result.stdout)
                if version:
                    check_rows.append(CheckRow("allreduce", "nccl_version", Status.PASS, "recorded", version, None))
            command = next((c.script for c in probe_commands(node, quick) if c.name == result.name), "")
            rows.extend(row_dict(run_id, inventory.cluster, STAGE, node.name, r, raw, command) for r in check_rows)
            for record in output.measurements:
                figure = measurement_row(run_id, inventory.cluster, STAGE, node.name, node.profile_name, record)
                figure["transport"] = transport if record.get("metric") == "allreduce_busbw_gbps" else None
                measurements.append(figure)
    if measurements:
        thresholds = {n.name: n.profile.thresholds for n in inventory.nodes}
        cpu = [n.name for n in inventory.nodes if n.profile.probes.device == "cpu"]
        for node_name, row in judge(pd.DataFrame(measurements), thresholds, warn_only=cpu):
            command = probe_script(inventory.node(node_name), row.check, quick)
            rows.append(row_dict(run_id, inventory.cluster, STAGE, node_name, row, "", command))
    return rows, measurements
