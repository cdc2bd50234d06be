"""Node-side ``dcgmi`` stand-in: ``dcgmi diag -r LEVEL -j`` answers in DCGM 4.5's JSON (tests/data/dcgm/README.md).

Every GPU of the node (the field table's count) passes the tests of the level, except where the node's data dir
holds ``dcgm.json`` (the ``dcgm_fail`` fault): that test fails on that GPU with the error DCGM's own plugin
reports, every GPU of a failed test marked Fail as DCGM marks them, and the exit status DCGM gives (226; 205
where the error's code means "isolate the GPU"). Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# The tests each level runs (DCGM 4.5's FillTestVectors, without EUD and nccl-tests), by category.
LEVELS: dict[int, list[tuple[str, str]]] = {
    1: [("Deployment", "software")],
    2: [("Deployment", "software"), ("Hardware", "memory"), ("Integration", "pcie")],
    3: [("Deployment", "software"), ("Hardware", "memory"), ("Hardware", "diagnostic"), ("Hardware", "nvbandwidth"),
        ("Integration", "pcie"), ("Stress", "memory_bandwidth"), ("Stress", "targeted_stress"),
        ("Stress", "targeted_power")],
}  # fmt: skip
LEVELS[4] = [*LEVELS[3], ("Hardware", "pulse_test"), ("Stress", "memtest")]
# The errors DCGM's plugins report for the failures the test-bed plants: (error id, category, severity, message).
ERRORS: dict[str, tuple[int, int, int, str, int]] = {
    "pcie": (46, 13, 5, "GPU {gpu} is running at PCI link width 8X, which is below the minimum allowed link generation "
             "of 16 (parameter 'min_pci_width') Check DCGM and system configuration. This error may be eliminated "
             "with an updated configuration.", 226),
    "nvbandwidth": (38, 10, 2, "The memory copy utilization for the GPU: {gpu} is greater than 10%. This may affect "
                    "the results of the nvbandwidth test.", 205),
}  # fmt: skip
USAGE = "Usage: dcgmi diag -r <level> -j (test-bed stand-in)\n"


def document(gpus: int, level: int, failures: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    categories: dict[str, list[dict[str, Any]]] = {}
    exit_code = 0
    for category, test in LEVELS[level]:
        failing = [f for f in failures if f.get("test") == test]
        results = []
        for gpu in range(gpus):
            result: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu}
            result["status"] = "Fail" if failing else "Pass"
            for failure in failing:
                if failure.get("gpu") == gpu:
                    error_id, cat, severity, message, code = ERRORS[test]
                    warning = {"error_category": cat, "error_id": error_id, "error_severity": severity,
                               "warning": message.format(gpu=gpu)}  # fmt: skip
                    result["warnings"] = [warning]
                    exit_code = max(exit_code, code) if exit_code != 205 else 205
            results.append(result)
        summary: dict[str, Any] = {"status": "Fail" if failing else "Pass"}
        warnings = [w for r in results for w in r.get("warnings", [])]
        if warnings:
            summary["warnings"] = warnings
        categories.setdefault(category, []).append({"name": test, "results": results, "test_summary": summary})
    doc = {
        "DCGM Diagnostic": {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]},
        "entity_groups": [
            {
                "entities": [{"device_id": "2335", "entity_id": g} for g in range(gpus)],
                "entity_group": "GPU",
                "entity_group_id": 1,
            }
        ],  # fmt: skip
        "metadata": {"Driver Version Detected": "test-bed", "version": "4.5.0"},
    }
    return doc, exit_code


def main(argv: list[str] | None = None, data_dir: str | Path | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(data_dir or os.environ.get("CLUSTER_ACCEPT_TESTBED_DATA", "."))
    if len(argv) < 3 or argv[0] != "diag" or "-r" not in argv or "-j" not in argv:
        sys.stderr.write(USAGE)
        return 2
    level_text = argv[argv.index("-r") + 1] if argv.index("-r") + 1 < len(argv) else ""
    if not level_text.isdigit() or int(level_text) not in LEVELS:
        sys.stderr.write(f"Error: invalid run level {level_text!r}\n")
        return 2
    fields = json.loads((folder / "fields.json").read_text(encoding="utf-8"))
    gpus = len(fields["values"][fields["order"][0]]) if fields["order"] else 0
    planted = folder / "dcgm.json"
    failures = json.loads(planted.read_text(encoding="utf-8")) if planted.exists() else []
    doc, code = document(gpus, int(level_text), failures)
    sys.stdout.write(json.dumps(doc, indent="\t", sort_keys=True) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
