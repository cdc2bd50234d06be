"""CLI usage errors: exit 2 with a message, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.processes import run_cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_run_usage_errors_exit_2(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: node001, address: local}]\nprofiles: {p: {}}\n"
    )
    out = tmp_path / "out"
    for args, message in [
        (["--stages", "nonsense"], "unknown stage 'nonsense'"),
        (["--nodes", "node999"], "not in the inventory: node999"),
    ]:
        proc = run_cli("run", "--inventory", str(inventory), "--out", str(out), *args, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert message in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_inventory_check_prints_names_that_look_like_markup(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        'cluster: c\nnodes: [{hosts: "a1", address: local}]\nprofiles: {"[/x] [bold]": {}}\n'
        'defaults: {profile: "[/x] [bold]"}\n'
    )  # a profile's name is free text (a cluster's is a folder's name, refused with brackets)
    proc = run_cli("inventory", "check", str(inventory))
    assert proc.returncode == 0, proc.stderr
    assert "│ [/x] [bold] │" in proc.stdout
