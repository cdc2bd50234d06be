"""DCGM's diagnostics read from ``dcgmi diag -r 3 -j`` documents of DCGM 3.3.5 and 4.5.0 (tests/data/dcgm): each
failing GPU named with DCGM's message and error, the GPUs failed along with it, passes folded per test; a node
without dcgmi, dcgmi's runtime error and unreadable output."""

from __future__ import annotations

import json
from pathlib import Path

from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.burn_settings import BurnSettings
from cluster_accept.inventory.model import Node, ProbeSettings, Profile, SshSettings
from cluster_accept.probes import dcgm
from cluster_accept.probes.scripts import DCGM_EXIT, DCGM_MISSING, dcgm_command

DATA = Path(__file__).parent / "data" / "dcgm"


def rows(text: str) -> dict[tuple[str, int | None, str], CheckRow]:
    return {(r.item, r.gpu, r.reason): r for r in dcgm.inspect(dcgm.parse(text), Profile())}


def test_dcgm_4_names_the_gpu_its_error_points_at_and_folds_the_rest():
    text = (DATA / "dcgm4.5.0_r3_nvbandwidth_fail.json").read_text() + f"{DCGM_EXIT}205\n"
    found = rows(text)
    culprit = found[("nvbandwidth", 2, "hardware_error")]
    assert culprit.status is Status.FAIL
    assert culprit.observed.startswith("Fail: The memory copy utilization for the GPU: 2 is greater than 10%")
    assert culprit.detail == (
        "DCGM error 38 (category 10 HARDWARE_MEMORY, severity 2 ISOLATE); DCGM 4.5.0, driver 580.95.05, exit 205"
    )
    along = found[("nvbandwidth", None, "failed_with_test")]
    assert along.observed == "Fail on GPU 0-1, 3-7" and along.status is Status.WARN
    assert found[("nccl_tests", None, "test_skipped")].observed == "Skip on GPU 0-7"
    passed = sorted(item for item, _, reason in found if reason == "passed")
    assert passed == [
        "diagnostic",
        "memory",
        "memory_bandwidth",
        "pcie",
        "software",
        "targeted_power",
        "targeted_stress",
    ]


def test_dcgm_3_reads_string_gpu_ids_and_pcie_errors():
    found = rows((DATA / "dcgm3.3.5_r3_pcie_fail.json").read_text() + f"{DCGM_EXIT}226\n")
    pcie = found[("PCIe", 2, "pcie_error")]
    assert "running at PCI link width 8X" in pcie.observed
    assert pcie.detail.startswith("DCGM error 46 (category 13 HARDWARE_PCIE, severity 5 CONFIG); DCGM 3.3.5")
    assert found[("PCIe", None, "passed")].observed == "Pass on GPU 0-1, 3"
    assert found[("Persistence Mode", None, "passed")].observed == "Pass (a node-wide test)"
    assert found[("EUD Test", None, "test_skipped")].status is Status.SKIP


def test_no_dcgmi_a_runtime_error_and_output_that_is_not_json():
    missing = dcgm.inspect(dcgm.parse(DCGM_MISSING + "\n"), Profile())
    assert [(r.reason, r.status) for r in missing] == [("not_installed", Status.SKIP)]
    broken = {"DCGM Diagnostic": {"runtime_error": "Unable to connect to host engine", "version": "4.5.0"}}
    failed = dcgm.inspect(dcgm.parse(json.dumps(broken) + f"\n{DCGM_EXIT}254\n"), Profile())
    assert [(r.reason, r.observed) for r in failed] == [("runtime_error", "Unable to connect to host engine")]
    junk = dcgm.inspect(dcgm.parse(f"Error: unable to establish a connection\n{DCGM_EXIT}1\n"), Profile())
    assert [(r.reason, r.observed) for r in junk] == [("unreadable", "exit 1")]


def test_a_monitor_severity_error_is_a_warning():
    warning = {"warning": "power", "error_id": 1, "error_category": 14, "error_severity": 1}
    result = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Fail", "warnings": [warning]}
    test = {"name": "targeted_power", "results": [result]}
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [test]}]}}
    found = dcgm.inspect(dcgm.parse(json.dumps(doc)), Profile())
    assert [(r.reason, r.status) for r in found] == [("monitor", Status.WARN)]


def test_command_per_suite_and_partition():
    def node(**probes: object) -> Node:
        settings = ProbeSettings(**probes)  # type: ignore[arg-type]
        return Node("n1", SshSettings(), "p", Profile(probes=settings, burn=BurnSettings(dcgm_level=3)))

    full, light = dcgm_command(node(), False), dcgm_command(node(), True)
    assert full is not None and "dcgmi diag -r 3 -j 2>&1" in full and DCGM_EXIT in full
    assert light is not None and "dcgmi diag -r 1 -j" in light
    assert "dcgmi diag -r 3 -i 2,3 -j" in (dcgm_command(node(cuda_visible_devices="2,3"), False) or "")
    assert dcgm_command(Node("n1", SshSettings(), "p", Profile()), False) is None


def test_failures_dcgm_ties_to_no_gpu_unknown_statuses_and_a_bare_exit_status():
    summary_only = {"name": "memory", "results": [], "test_summary": {"status": "Fail", "warnings": [
        {"warning": "Unable to allocate", "error_id": 51, "error_category": 6, "error_severity": 4}]}}  # fmt: skip
    odd = {"name": "pcie", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Warn"}]}
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [summary_only, odd]}]}}
    found = {
        (r.item, r.reason): r for r in dcgm.inspect(dcgm.parse(json.dumps(doc) + f"\n{DCGM_EXIT}226\n"), Profile())
    }
    assert found[("memory", "test_failed")].observed == "Fail: Unable to allocate"
    assert found[("pcie", "unknown_status")].observed == "status 'Warn'"
    passing = {"name": "software", "results": [{"entity_id": 0, "entity_group": "GPU", "status": "Pass"}]}
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [passing]}]}}
    rows = dcgm.inspect(dcgm.parse(json.dumps(doc) + f"\n{DCGM_EXIT}226\n"), Profile())
    assert [(r.reason, r.observed) for r in rows] == [("passed", "Pass on GPU 0"), ("exit_without_failure", "exit 226")]
