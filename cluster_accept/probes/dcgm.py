"""DCGM's diagnostics folded in: ``dcgmi diag -r LEVEL -j`` where the node has DCGM, its JSON as check rows.

DCGM tests what our probes do not (memory patterns, PCIe replay, targeted power and stress against its own
per-SKU limits), yet passes a GPU three times slower than its peers (DCGM#122): it runs beside the burn, and its
verdict is one more row, never the only one. Each DCGM test becomes rows under DCGM's own test name: one pass row
per test for the GPUs that passed it, a row per GPU for an error, with DCGM's message, error id, category and
severity, the reason chosen by the error's category (hardware, PCIe, thermal/power, configuration). Both JSON
shapes are read: DCGM 3.x (``DCGM GPU Diagnostic``, ``gpu_id``) and 4.x (``DCGM Diagnostic``, ``entity_id``).
Without dcgmi on the node the row is a skip with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from cluster_accept.analysis.probe_output import InfoLine
from cluster_accept.probes.contract import (
    Action,
    CheckRow,
    Expectation,
    FindingKind,
    MetricRule,
    Probe,
    ProbeOutput,
    Profile,
    Reason,
    Status,
    dead,
    declare,
    fault,
    healthy,
)
from cluster_accept.probes.scripts import DCGM, DCGM_EXIT
from cluster_accept.vocabulary.lazy import pandas as pd

NAME = "dcgm"
STAGE = "burn"
ORDER = 62
SCRIPT = DCGM
METRICS: dict[str, MetricRule] = {}
ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # 4.x, 3.x
CATEGORIES = {
    0: "NONE", 1: "PERF_THRESHOLD", 2: "PERF_VIOLATION", 3: "SOFTWARE_CONFIG", 4: "SOFTWARE_LIBRARY",
    5: "SOFTWARE_XID", 6: "SOFTWARE_CUDA", 7: "SOFTWARE_EUD", 8: "SOFTWARE_OTHER", 9: "HARDWARE_THERMAL",
    10: "HARDWARE_MEMORY", 11: "HARDWARE_NVLINK", 12: "HARDWARE_NVSWITCH", 13: "HARDWARE_PCIE",
    14: "HARDWARE_POWER", 15: "HARDWARE_OTHER", 16: "INTERNAL_OTHER",
}  # fmt: skip
SEVERITIES = {0: "NONE", 1: "MONITOR", 2: "ISOLATE", 3: "UNKNOWN", 4: "TRIAGE", 5: "CONFIG", 6: "RESET"}
# The reason of an error, by DCGM's error category: what the operator does next.
_BY_CATEGORY = {
    **dict.fromkeys((10, 11, 12, 15), "hardware_error"),
    13: "pcie_error",
    **dict.fromkeys((9, 14), "thermal_or_power_error"),
    **dict.fromkeys((3, 4, 6, 7, 8), "config_error"),
    **dict.fromkeys((1, 2), "performance_error"),
    5: "xid_error",
}
REASONS = declare(
    Reason("passed", Status.PASS, "passed DCGM's test", Action.NONE),
    Reason("test_skipped", Status.SKIP, "DCGM skipped this test (not supported here, or not installed)", Action.NONE),
    Reason("hardware_error", Status.FAIL, "DCGM found a hardware fault (memory, NVLink, NVSwitch)", Action.REPLACE_GPU),
    Reason(
        "pcie_error", Status.FAIL, "DCGM found the GPU's PCIe link faulty: reseat the GPU or riser", Action.RESEAT_CABLE
    ),
    Reason(
        "thermal_or_power_error", Status.FAIL, "DCGM found a thermal or power fault: cooling, power", Action.CHECK_NODE
    ),
    Reason(
        "config_error",
        Status.FAIL,
        "DCGM found the node's software or settings wrong (see the message)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "performance_error",
        Status.FAIL,
        "below DCGM's performance limit for this SKU",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason("xid_error", Status.FAIL, "an XID during DCGM's test (see the message)", Action.CHECK_NODE),
    Reason(
        "test_failed",
        Status.FAIL,
        "DCGM failed this test without an error of its own: see DCGM's log",
        Action.CHECK_NODE,
    ),
    Reason("monitor", Status.WARN, "DCGM reports an error to monitor (severity MONITOR)", Action.NONE),
    Reason(
        "failed_with_test",
        Status.WARN,
        "DCGM marked these GPUs failed with a test whose error names another GPU (see that GPU's row)",
        Action.NONE,
    ),
    Reason("unknown_status", Status.ERROR, "DCGM gave a result status we do not know (see the row)", Action.RERUN),
    Reason(
        "exit_without_failure",
        Status.ERROR,
        "dcgmi diag exited non-zero yet its JSON names no failed test: read DCGM's log on the node",
        Action.CHECK_NODE,
    ),
    Reason("not_installed", Status.SKIP, "no dcgmi on this node: DCGM's diagnostics were not run", Action.NONE),
    Reason("runtime_error", Status.ERROR, "dcgmi diag could not run its tests (see its message)", Action.CHECK_NODE),
    Reason("unreadable", Status.ERROR, "dcgmi diag printed no JSON we could read (see the output)", Action.RERUN),
    Reason(
        "probe_timeout", Status.TIMEOUT, "dcgmi diag ran past burn.dcgm_timeout_s and was killed", Action.CHECK_NODE
    ),
    Reason("probe_error", Status.ERROR, "dcgmi diag reported an error", Action.RERUN),
    Reason("probe_failed", Status.ERROR, "dcgmi diag did not finish (see its output)", Action.RERUN),
)
_EXIT = re.compile(rf"^{re.escape(DCGM_EXIT)}(-?\d{{1,5}})\s*$", re.MULTILINE)


def fold_numbers(numbers: list[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``0-3, 5``: GPUs folded as node sets are."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def _document(text: str) -> dict[str, Any] | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        found = json.loads(text[start : end + 1])
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _gpu(result: Mapping[str, Any]) -> int | None:
    """The GPU a result is for: 4.x ``entity_id`` of a GPU entity, 3.x ``gpu_id`` (a string), ≤3.2 ``gpu_ids``."""
    if "entity_id" in result:
        return int(result["entity_id"]) if result.get("entity_group", "GPU") == "GPU" else None
    for key in ("gpu_id", "gpu_ids"):
        value = str(result.get(key, ""))
        if value.isdigit():
            return int(value)
    return None


def _warnings(raw: object) -> list[dict[str, Any]]:
    """DCGM's errors of a result: objects with ``warning`` (``warnings`` in 3.3.3-3.3.9's Deployment results)."""
    if isinstance(raw, str):
        return [{"text": raw, "error_id": None, "category": None, "severity": None}]
    found = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict):
            text = item.get("warning") or item.get("warnings")
            found.append({"text": str(text or ""), "error_id": item.get("error_id"),
                          "category": item.get("error_category"), "severity": item.get("error_severity")})  # fmt: skip
    return found


def parse(stdout: str) -> ProbeOutput:
    """DCGM's results as info records (``dcgm_result`` per test and GPU, ``dcgm_run`` with the version and exit
    status), or a skip (no dcgmi), or an error naming what dcgmi printed instead of JSON."""
    out = ProbeOutput()
    code = _EXIT.search(stdout)
    exit_code = int(code.group(1)) if code else None
    body = _EXIT.sub("", stdout)
    doc = _document(body)
    if doc is not None and doc.get("info") == "skip":
        out.info.append(InfoLine("skip", {"reason": str(doc.get("reason"))}))
        return out
    if doc is not None and isinstance(doc.get("iterations"), list) and doc["iterations"]:
        doc = doc["iterations"][-1]  # --iterations: the last (the first failing) iteration
    root = next((doc[k] for k in ROOTS if doc is not None and isinstance(doc.get(k), dict)), None)
    if doc is None or root is None:
        out.info.append(InfoLine("dcgm_unreadable", {"exit": exit_code, "text": body.strip()[:500]}))
        return out
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else doc
    run = {"version": meta.get("version"), "driver": meta.get("Driver Version Detected")}
    out.info.append(InfoLine("dcgm_run", {"exit": exit_code, **run, "runtime_error": root.get("runtime_error")}))
    for category in root.get("test_categories") or []:
        for test in category.get("tests") or []:
            summary = test.get("test_summary") if isinstance(test.get("test_summary"), dict) else {}
            out.info.append(InfoLine("dcgm_test", {"test": test.get("name"), "status": summary.get("status"),
                                                   "warnings": _warnings(summary.get("warnings"))}))  # fmt: skip
            for result in test.get("results") or []:
                said = {"category": category.get("category"), "test": test.get("name"), "gpu": _gpu(result),
                        "status": result.get("status"), "warnings": _warnings(result.get("warnings"))}  # fmt: skip
                out.info.append(InfoLine("dcgm_result", said))
    return out


def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    return []  # DCGM judges each node itself; its rows come from :func:`inspect`


def _error_reason(warning: Mapping[str, Any]) -> str:
    if warning.get("severity") == 1:
        return "monitor"
    category = warning.get("category")
    return _BY_CATEGORY.get(category, "test_failed") if isinstance(category, int) else "test_failed"


def _said(warning: Mapping[str, Any]) -> str:
    category, severity = warning.get("category"), warning.get("severity")
    return (
        f"DCGM error {warning.get('error_id')} (category {category} {CATEGORIES.get(category, '?')}, "  # type: ignore[arg-type]
        f"severity {severity} {SEVERITIES.get(severity, '?')})"  # type: ignore[arg-type]
    )


def _test_rows(test: str, results: list[Mapping[str, Any]], run: str) -> list[CheckRow]:
    """One test's rows: each GPU's errors, the GPUs it failed along with them, and one row for those that passed
    or were skipped."""
    rows = []
    named = [r for r in results if r["warnings"]]
    for result in named:
        for warning in result["warnings"]:
            reason = _error_reason(warning)
            said = f"{result['status']}: {warning['text']}"[:500]
            detail = f"{_said(warning)}; {run}"
            rows.append(CheckRow(NAME, test, REASONS[reason].severity, reason, said, "Pass", detail, result["gpu"]))
    failed_quietly = [r for r in results if r["status"] == "Fail" and not r["warnings"]]
    if failed_quietly:
        reason = "failed_with_test" if named else "test_failed"
        rows.append(CheckRow(NAME, test, REASONS[reason].severity, reason, _on("Fail", failed_quietly), "Pass", run))
    for status, reason in (("Pass", "passed"), ("Skip", "test_skipped")):
        these = [r for r in results if r["status"] == status and not r["warnings"]]
        if these:
            rows.append(CheckRow(NAME, test, REASONS[reason].severity, reason, _on(status, these), "Pass", run))
    return rows


def _on(status: str, results: list[Mapping[str, Any]]) -> str:
    gpus = fold_numbers([r["gpu"] for r in results if r["gpu"] is not None])
    return f"{status} on GPU {gpus}" if gpus else f"{status} (a node-wide test)"


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    """DCGM's verdicts as rows, under DCGM's own test names."""
    for info in output.info:
        if info.kind == "skip":
            return [CheckRow(NAME, "dcgmi", Status.SKIP, "not_installed", None, "dcgmi diag", str(info.get("reason")))]
        if info.kind == "dcgm_unreadable":
            said = f"exit {info.get('exit')}"
            return [CheckRow(NAME, "dcgmi", Status.ERROR, "unreadable", said, "DCGM's JSON", str(info.get("text")))]
    run_info = next((i.members for i in output.info if i.kind == "dcgm_run"), {})
    run = f"DCGM {run_info.get('version') or '?'}, driver {run_info.get('driver') or '?'}, exit {run_info.get('exit')}"
    if run_info.get("runtime_error"):
        return [
            CheckRow(
                NAME, "dcgmi", Status.ERROR, "runtime_error", str(run_info["runtime_error"])[:500], "tests run", run
            )
        ]
    by_test: dict[str, list[Mapping[str, Any]]] = {}
    for info in output.info:
        if info.kind == "dcgm_result":
            by_test.setdefault(str(info.get("test")), []).append(info.members)
    rows = [row for test, results in by_test.items() for row in _test_rows(test, results, run)]
    rows += _summary_rows(output, by_test, run)
    if run_info.get("exit") not in (0, None) and not any(r.status in (Status.FAIL, Status.ERROR) for r in rows):
        said = f"exit {run_info.get('exit')}"
        rows.append(
            CheckRow(NAME, "dcgmi", Status.ERROR, "exit_without_failure", said, "exit 0 when every test passed", run)
        )
    return rows or [CheckRow(NAME, "dcgmi", Status.ERROR, "unreadable", "no test results", "DCGM's tests", run)]


def _summary_rows(output: ProbeOutput, by_test: Mapping[str, list[Mapping[str, Any]]], run: str) -> list[CheckRow]:
    """A test whose summary says Fail though none of its results does (an error tied to no GPU), and results
    whose status is none of Pass, Skip, Fail."""
    rows = []
    for info in output.info:
        test = str(info.get("test"))
        if info.kind == "dcgm_test" and info.get("status") == "Fail":
            if not any(r["status"] == "Fail" or r["warnings"] for r in by_test.get(test, [])):
                text = "; ".join(w["text"] for w in info.get("warnings") or []) or "no message"
                rows.append(CheckRow(NAME, test, Status.FAIL, "test_failed", f"Fail: {text}"[:500], "Pass", run))
        if info.kind == "dcgm_result" and info.get("status") not in ("Pass", "Skip", "Fail"):
            said = f"status {info.get('status')!r}"
            rows.append(CheckRow(NAME, test, Status.ERROR, "unknown_status", said, "Pass", run, info.get("gpu")))
    return rows


# The profile its samples are judged under: the minimums they are held to.
SAMPLE_PROFILE = {"burn": {"dcgm_level": 3}}

PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    stage=STAGE,
    order=ORDER,
    inspect=inspect,
    expectations=(Expectation("burn.dcgm_level", STAGE, NAME, lambda p: p.burn.dcgm_level is not None),),
    samples=(
        healthy("r3_pass", {"passed"}, fixture="dcgm/r3_pass.txt", profile=SAMPLE_PROFILE),
        fault(
            "pcie_fail",
            {"pcie_error", "test_skipped"},
            fixture="dcgm/dcgm3.3.5_r3_pcie_fail_exit.txt",
            profile=SAMPLE_PROFILE,
        ),
        dead(
            "not_installed",
            {"not_installed"},
            text='{"info": "skip", "reason": "dcgmi is not installed on this node (no DCGM diagnostics)"}\n',
            profile=SAMPLE_PROFILE,
        ),
    ),
)
