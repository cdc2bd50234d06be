"""No planted secret reaches any file a run writes: the real flow on this machine (``address: local``, no SSH),
secrets planted in what the node returns, then every file of the run directory and the history read back.

Two runs: ``preflight``, with the secrets in the job's NCCL environment and in its ``NCCL_CONF_FILE`` (read by
nccl_env and nccl_harmful, a failing row's evidence in the report); ``single-node``, with a stand-in python
that prints them on stdout and stderr and fails, so that the probes' output is the evidence (cut to its tail).
Each secret holds ``S3KR1T``; the names stay in the output.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration

MARK = "S3KR1T"
GITHUB = "ghp_" + MARK + "github" + "0" * 24
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0." + MARK + "signature0123"
PRIVATE_KEY = f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE{MARK}AAAA\nAAAAC3{MARK}==\n" + (
    "-----END OPENSSH PRIVATE KEY-----\n"
)
PLANTED_ENV = {  # by name
    "NCCL_PASSWD": f"{MARK}-passwd",
    "NCCL_IB_AUTH": f"{MARK}-auth",
    "NCCL_GITHUB_PAT": f"{MARK}-pat",
    "NCCL_COOKIE": f"session={MARK}",
    # by shape, under names that are no secret
    "NCCL_DB_URL": f"postgres://svc:{MARK}-url@db.example:5432/jobs",
    "NCCL_NOTE_GITHUB": GITHUB,
    "NCCL_NOTE_SLACK": f"xoxb-1234567890-{MARK}slack",
    "NCCL_NOTE_AWS": "AKIA" + MARK + "AWS0000007",
    "NCCL_NOTE_HF": "hf_" + MARK + "hugging" + "a" * 20,
    "NCCL_NOTE_OPENAI": "sk-proj-" + MARK + "openai0123456789abcdefghijkl",
    "NCCL_NOTE_GITLAB": "glpat-" + MARK + "gitlab01234567",
    "NCCL_NOTE_JWT": JWT,
}
URL = f"https://svc:{MARK}-probe@registry.example/v2\n"


def stored_text(path: Path) -> str:
    """Everything a file holds as text: its bytes, and for Parquet every cell and the schema's metadata."""
    text = path.read_bytes().decode("utf-8", "replace")
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        text += f"\n{table.schema.metadata!r}\n{table.to_pylist()!r}"
    return text


def inventory(tmp_path: Path, profile: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            cluster: planted
            defaults: {{profile: p}}
            nodes:
              - {{hosts: local1, address: local}}
            profiles:
              p: {profile}
            """
        )
    )
    return path


def preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The job's environment and its NCCL_CONF_FILE carry the secrets; a wrong NCCL_SOCKET_IFNAME makes the
    nccl_env output a failing row's evidence."""
    conf = tmp_path / "nccl.conf"
    conf.write_text(f"NCCL_ALGO=Ring\nNCCL_PASSWD={MARK}-conf\n{PRIVATE_KEY}NCCL_NOTE_CONF={GITHUB}\n")
    env = {**PLANTED_ENV, "NCCL_SOCKET_IFNAME": "eth9", "NCCL_DEBUG": "INFO", "NCCL_CONF_FILE": str(conf)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return inventory(tmp_path, "{nccl_env: {NCCL_SOCKET_IFNAME: eth0}}")


def single_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in python that prints secrets and fails: stdout's tail is kept from inside a URL's user."""
    stdout = tmp_path / "stdout.txt"
    stdout.write_text(URL + "y" * (20_000 - len(URL) + URL.index("vc:")) + "\n")
    stderr = tmp_path / "stderr.txt"
    stderr.write_text(
        "".join(f"export {key}={value}\n" for key, value in PLANTED_ENV.items()) + PRIVATE_KEY + f"via {GITHUB}\n"
    )
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ncat {stdout}\ncat {stderr} >&2\nexit 3\n")
    python.chmod(0o755)
    return inventory(tmp_path, f"{{probes: {{python: {python}, device: cpu, max_parallel_nodes: 1}}}}")


@pytest.mark.parametrize("stage", ["preflight", "single-node"])
def test_no_planted_value_reaches_any_file_of_the_run(
    stage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster_accept.flows.acceptance import run_acceptance

    path = (preflight if stage == "preflight" else single_node)(tmp_path, monkeypatch)
    out = tmp_path / "runs"
    outcome = run_acceptance(path, out, stages=[stage], concurrency=2)

    run_dir = outcome.run_dir
    files = sorted(p for p in out.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert {"checks.parquet", "verdicts.parquet", "runs.parquet", "run.json", "summary.json"} <= names
    assert {"report.html", "report.md"} <= names
    assert any(p.suffix == ".parquet" for p in (out / "history").rglob("*"))
    for file in files:
        assert MARK not in stored_text(file), file
    # The names stay, so the operator sees that a value was there.
    evidence = "\n".join(r["raw_output"] for r in pq.read_table(run_dir / "checks.parquet").to_pylist())
    assert "NCCL_PASSWD=" in evidence and "-----BEGIN OPENSSH PRIVATE KEY-----\n***" in evidence
    assert "ghp_***" in evidence
    if stage == "preflight":
        assert "NCCL_DB_URL=postgres://svc:***@db.example:5432/jobs" in evidence
        values = {(r["key"], r["value"]) for r in pq.read_table(run_dir / "node_values.parquet").to_pylist()}
        assert {("NCCL_PASSWD", "****"), ("NCCL_NOTE_AWS", "AKIA***")} <= values
        assert "NCCL_PASSWD=****" in (run_dir / "report.html").read_text()
    else:
        assert "svc:***@registry.example" in evidence
