"""The soak tier (docs/development.md): left out of a run unless its ``-m`` expression names it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
SOAK_FILE = "tests/test_noise_testbed.py"  # both of its tests are soak


def collected(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_soak_tests_run_only_when_the_marker_expression_names_them() -> None:
    assert collected(SOAK_FILE) == []
    assert collected("-m", "testbed", SOAK_FILE) == []
    soak = collected("-m", "soak", SOAK_FILE)
    assert len(soak) == 2 and all(t.startswith(SOAK_FILE) for t in soak), soak
    assert collected("-m", "soak", "tests/test_soak_tier.py") == []  # a test in no soak is not in the tier
