"""``watch`` and ``arm`` refuse what they cannot act on, each with one line and exit 2, before Prefect starts;
and the CLI loads neither Prefect nor the analysis for them until a watch runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster_accept.flows.cli import app

INVENTORY = "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: 'node[001-002]'}]\nprofiles: {p: {}}\n"


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return path


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --nodes EXPR (with --job NAME) or --slurm-job ID"),
        (["--nodes", "node001", "--slurm-job", "12"], "give --nodes EXPR (with --job NAME) or --slurm-job ID"),
        (["--nodes", "node001"], "give --job NAME"),
        (["--nodes", "node999", "--job", "j"], "not in the inventory: node999"),
        (["--slurm-job", "12; rm -rf /"], "is not a Slurm job id"),
        (["--nodes", "node001", "--job", "j", "--cron", "every minute"], "is not a cron expression"),
        (["--nodes", "node001", "--job", "j", "--job-user", "$(id)"], "job_user"),
    ],
)
def test_watch_refuses_with_one_line(inventory: Path, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["watch", "--inventory", str(inventory), "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.unit
def test_arm_refuses_a_format_and_a_path_it_cannot_write() -> None:
    result = CliRunner().invoke(app, ["arm", "--torch", "2.9.0", "--nccl", "2.27.5", "--format", "yaml"])
    assert result.exit_code == 2 and "--format 'yaml'" in result.output
    result = CliRunner().invoke(app, ["arm", "--torch", "2.9.0", "--watch-dir", "/tmp/a b"])
    assert result.exit_code == 2 and "error: " in result.output and "/tmp/a b" in result.output


@pytest.mark.unit
def test_arm_prints_the_variables_and_says_what_the_versions_cannot_give() -> None:
    result = CliRunner().invoke(
        app, ["arm", "--torch", "2.9.0", "--nccl", "2.27.5", "--format", "env", "--job", "77", "--watch-dir", "/w"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "CA_WATCH_DIR=/w" in lines and "CA_WATCH_JOB=77" in lines and "TORCH_NCCL_ENABLE_TIMING=1" in lines
    assert "inspector unavailable: NCCL 2.27 has no Inspector" in result.output
    untimed = CliRunner().invoke(app, ["arm", "--torch", "2.9.0", "--nccl", "2.27.5", "--format", "env",
                                       "--no-nccl-timing"])  # fmt: skip
    assert untimed.exit_code == 0 and "TORCH_NCCL_ENABLE_TIMING" not in untimed.stdout
    assert "nccl_timing unavailable: not armed (nccl_timing off): a slow GPU is not seen" in untimed.output


@pytest.mark.integration
def test_a_slurm_job_slurm_cannot_be_asked_about_is_refused(inventory: Path, tmp_path: Path) -> None:
    args = ["watch", "--inventory", str(inventory), "--slurm-job", "12", "--scontrol", "/nonexistent/scontrol"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "cannot ask Slurm for job 12" in result.output


@pytest.mark.integration
def test_the_cli_loads_no_prefect_and_no_analysis_at_start_up() -> None:
    code = "import sys, cluster_accept.flows.cli; print(sorted(m for m in ('prefect', 'pandas') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)  # noqa: S603
    assert done.stdout.strip() == "[]"
