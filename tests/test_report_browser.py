"""The README's first command on a fresh machine, and the report as an operator sees it.

The demo runs twice: first as the README's first command, verbatim, in a fresh virtual environment with
nothing installed (a copy of the working tree; the install takes only the CPU build of torch); then again from
that environment, so that its report has history, rendered in headless Chromium. And a node whose output
carries HTML, which must appear as text and never run."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pandas as pd
import pytest

from tests.browser import load_page
from tests.processes import run_cli

pytestmark = pytest.mark.testbed

SECTIONS = ("verdict", "nodes", "unreachable", "differences", "measurements", "scaling", "isolation", "history")
CHARTS = ("gemm", "memory", "allreduce", "scaling", "isolation")
SCREENSHOT = Path(__file__).resolve().parent.parent / "runs" / "browser" / "demo-report.png"


def _runs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir() and p.name != "history")


ROOT = Path(__file__).resolve().parent.parent


def readme_first_command() -> str:
    """The README's quick-start line: install, then ``cluster-accept demo``."""
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.endswith("&& cluster-accept demo")]
    assert len(lines) == 1, lines
    return lines[0]


def _copy_tree(target: Path) -> None:
    """The working tree as git sees it (tracked and new files, not ignored ones), symlinks kept."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source, copy = ROOT / name, target / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, copy)


def _fresh_environment(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the project and a new virtual environment with nothing installed, first on PATH."""
    tree, env_dir = tmp_path / "cluster-accept", tmp_path / "venv"
    _copy_tree(tree)
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    env.update(PATH=f"{env_dir / 'bin'}:{env['PATH']}", VIRTUAL_ENV=str(env_dir), DEBIAN_FRONTEND="noninteractive")
    listed = subprocess.run([env_dir / "bin" / "python3", "-m", "pip", "list"], capture_output=True, text=True, env=env)
    assert "torch" not in listed.stdout and "prefect" not in listed.stdout  # nothing preinstalled
    return tree, env


@pytest.mark.soak  # docs/development.md: the soak tier
def test_readme_first_command_then_demo_report_in_chromium(tmp_path: Path) -> None:
    tree, env = _fresh_environment(tmp_path)
    out = tree / "runs"
    first = subprocess.run(
        ["bash", "-c", readme_first_command()], cwd=tree, env=env, capture_output=True, text=True, timeout=1200
    )
    again = subprocess.run(
        ["cluster-accept", "demo", "--out", str(out)], cwd=tree, env=env, capture_output=True, text=True, timeout=400
    )
    names = []
    for attempt, proc in enumerate((first, again), start=1):
        assert proc.returncode == 1, f"demo run {attempt}: {proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        assert "report:" in proc.stdout and "preflight" in proc.stdout  # the stage bars were drawn
        names.append(proc.stdout.split("starting the 8-node test-bed ", 1)[1].split()[0])
    installed = subprocess.run(
        ["python3", "-c", "import torch; print(torch.__version__)"], env=env, capture_output=True, text=True
    )
    assert installed.stdout.strip().endswith("+cpu")  # the CPU build, never the CUDA one
    for node, reasons in {
        "node02": "ssh:refused", "node03": "ssh:host-key", "node04": "driver:version_mismatch",
        "node05": "gpu_count:count_low", "node06": "driver:nvidia_smi_failed", "node08": "isolation:slow_node",
    }.items():  # fmt: skip
        assert any(line.startswith(f"│ {node}") and reasons in line for line in first.stdout.splitlines()), first.stdout
    assert "accepted 2 / rejected 4 / unreachable 2" in first.stdout
    assert all(name.startswith("demo") for name in names)  # a test-bed of its own, not the default "ca"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [line for line in netns.splitlines() if line.startswith(tuple(f"{name}-" for name in names))]
    earlier, second = _runs(out)
    verdicts = pd.read_parquet(second / "verdicts.parquet")
    got = {r.node: (r.verdict, list(r.reasons)) for r in verdicts.itertuples()}
    assert got["node08"] == ("rejected", ["isolation:slow_node"])
    assert {n for n, (v, _) in got.items() if v == "accepted"} == {"node01", "node07"}

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    checks = {f"section_{s}": f"!!document.getElementById('{s}')" for s in SECTIONS}
    checks.update({f"chart_{c}": f"document.querySelectorAll('svg[data-chart=\"{c}\"]').length" for c in CHARTS})
    checks["bars_gemm"] = "document.querySelectorAll('svg[data-chart=\"gemm\"] g.bar').length"
    checks["bad_isolation_bars"] = "document.querySelectorAll('svg[data-chart=\"isolation\"] g.bar.bad').length"
    checks["sparklines"] = "document.querySelectorAll('#history-table svg.sparkline').length"
    checks["summary"] = "document.getElementById('verdict').innerText"
    checks["rows"] = "document.querySelectorAll('#node-table tbody tr').length"
    # The filter is the page's one script: it runs under the page's Content-Security-Policy.
    checks["rejected_shown"] = (
        "(() => { const s = document.getElementById('verdict-filter'); s.value = 'rejected';"
        " s.dispatchEvent(new Event('change'));"
        " return [...document.querySelectorAll('#node-table tbody tr')].filter(r => !r.hidden)"
        ".map(r => r.cells[0].innerText); })()"
    )
    page = load_page(second / "report.html", evaluate=checks, screenshot=SCREENSHOT)
    assert page.console_errors == []
    assert page.requests == [(second / "report.html").resolve().as_uri()]  # self-contained: nothing else loads
    assert page.title == f"cluster-accept — testbed — {second.name}"
    values = page.values
    assert all(values[f"section_{s}"] for s in SECTIONS), values
    assert all(values[f"chart_{c}"] == 1 for c in CHARTS), values
    assert values["bars_gemm"] == 3  # one CPU "GPU" per node measured: node01, node07, node08
    assert values["bad_isolation_bars"] >= 1
    assert values["sparklines"] >= 3  # each measured node against the first run
    assert values["summary"].startswith("Not accepted: node[02-06,08]")
    assert "accepted 2 / rejected 4 / unreachable 2" in values["summary"]
    assert values["rows"] == 8
    assert values["rejected_shown"] == ["node04", "node05", "node06", "node08"]
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = pd.read_parquet(out / "history" / "runs")
    assert sorted(history.run_id) == [earlier.name, second.name]


HOSTILE_NAME = "NVIDIA H200 <script>window.__pwned = 1</script>"
HOSTILE_ENV = '<img src=x onerror="window.__pwned = 2">'


@pytest.mark.untimed  # preflight only: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_report_browser")
def test_node_output_carrying_html_is_shown_as_text(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    faults = {
        "nodes": {
            "node02": [
                {"gpu_field": {"field": "name", "value": HOSTILE_NAME, "gpu": 0}},
                {"nccl_env": {"NCCL_SOCKET_IFNAME": HOSTILE_ENV}},
            ]
        }
    }
    bed = testbed_factory(nodes=3, faults=faults, prefix="cax", subnet="10.254.52.0/24")
    proc = run_cli("run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "preflight")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = _runs(tmp_path)[0]
    html = (run_dir / "report.html").read_text()
    assert HOSTILE_NAME not in html and HOSTILE_ENV not in html
    md = (run_dir / "report.md").read_text()
    assert "<script>window" not in md and "<img src=x" not in md
    page = load_page(
        run_dir / "report.html",
        evaluate={
            "pwned": "typeof window.__pwned",
            "text": "document.body.innerText",
            "imgs": "document.images.length",
        },
    )
    assert page.values["pwned"] == "undefined"
    assert page.values["imgs"] == 0
    assert "<script>window.__pwned = 1</script>" in page.values["text"]  # shown, as text
    assert HOSTILE_ENV in page.values["text"]
    assert page.console_errors == []
    assert page.requests == [(run_dir / "report.html").resolve().as_uri()]
