"""The probe interpreter check, on real outputs of its command (tests/data/probe_python) and variants of them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cluster_accept.checks import probe_python
from cluster_accept.checks.base import ClusterView, Status
from cluster_accept.checks.samples import SAMPLES_DIR
from cluster_accept.inventory.model import Profile

DATA = SAMPLES_DIR / "probe_python"
CUDA = Profile()
CPU = Profile.model_validate({"probes": {"device": "cpu"}})
NOBODY = ClusterView({}, 0)


def _rows(stdout: str, profile: Profile) -> list[tuple[str, Status, str, str | None, str | None]]:
    model = probe_python.parse(stdout, 0)
    return [(r.item, r.status, r.reason, r.observed, r.expected) for r in probe_python.evaluate(model, profile, NOBODY)]


def _data(name: str) -> str:
    return (DATA / name).read_text()


def test_cpu_torch_on_a_cpu_profile_passes() -> None:
    rows = _rows(_data("cpu_torch_cpu_profile.txt"), CPU)
    assert rows == [
        ("python", Status.PASS, "ok", "Python 3.11.7", "python3"),
        ("torch", Status.PASS, "ok", "torch 2.13.0+cpu", None),
        ("cuda", Status.SKIP, "cpu_device", None, None),
    ]


def test_cpu_torch_on_a_cuda_node_is_torch_no_cuda() -> None:
    rows = _rows(_data("cpu_torch_cuda_profile.txt"), CUDA)
    assert rows[-1] == ("cuda", Status.FAIL, "torch_no_cuda", "torch 2.13.0+cpu (CPU build)", "CUDA")


def test_wrong_python_path_and_missing_torch() -> None:
    missing = Profile.model_validate({"probes": {"python": "/opt/venvs/probes/bin/python3"}})
    assert _rows(_data("python_missing.txt"), missing) == [
        ("python", Status.FAIL, "python_missing", "not found", "/opt/venvs/probes/bin/python3")
    ]
    rows = _rows(_data("torch_missing.txt"), CPU)
    assert rows[0][:3] == ("python", Status.PASS, "ok")
    assert rows[1] == ("torch", Status.FAIL, "torch_missing", "not installed", "torch for python3")


def _cuda_output(build: str | None, driver: str, **more: object) -> str:
    """The real CPU-torch output turned into a node with the driver's header and a CUDA build of torch."""
    lines = _data("cpu_torch_cuda_profile.txt").splitlines()
    info = json.loads(lines[1])
    info.update({"torch": "2.9.1+cu128", "cuda_build": build, "cuda_available": True, "cuda_devices": 8, **more})
    return f"CUDA Version: {driver}\n{lines[0]}\n{json.dumps(info)}\n"


def test_cuda_build_against_the_driver() -> None:
    assert _rows(_cuda_output("12.8", "13.0"), CUDA)[-1] == (
        "cuda",
        Status.PASS,
        "ok",
        "CUDA 12.8",
        "<= 13.0 (the driver's CUDA)",
    )
    assert _rows(_cuda_output("12.8", "12.4"), CUDA)[-1][1:3] == (Status.WARN, "cuda_minor_newer")
    too_old = _rows(_cuda_output("13.0", "12.8"), CUDA)[-1]
    assert too_old == (
        "cuda",
        Status.FAIL,
        "cuda_driver_too_old",
        "torch built for CUDA 13.0",
        "<= 12.8 (the driver's CUDA)",
    )
    assert _rows(_cuda_output("12.8", "N/A"), CUDA)[-1][1:3] == (Status.SKIP, "cuda_unknown")


def test_cuda_build_that_sees_no_gpu_says_torchs_warning() -> None:
    warning = "CUDA initialization: The NVIDIA driver on your system is too old (found version 12020)."
    out = _cuda_output("12.2", "12.2", cuda_available=False, cuda_devices=0, warnings=[warning])
    model = probe_python.parse(out, 0)
    row = probe_python.evaluate(model, CUDA, NOBODY)[-1]
    assert (row.status, row.reason, row.detail) == (Status.FAIL, "cuda_unavailable", warning)


def test_a_cuda_build_that_sees_no_gpu_fails_even_without_nvidia_smi() -> None:
    """Inside a container without nvidia-smi the driver's CUDA is unknown; torch seeing no GPU still fails."""
    out = _cuda_output("12.8", "N/A", cuda_available=False, cuda_devices=0, warnings=[])
    assert _rows(out, CUDA)[-1][1:3] == (Status.FAIL, "cuda_unavailable")


def test_torch_that_does_not_import_is_broken() -> None:
    out = _cuda_output("12.8", "12.8", torch_error="OSError: libcudnn.so.9: cannot open shared object file")
    rows = _rows(out, CUDA)
    assert rows[-1] == ("torch", Status.FAIL, "torch_broken", "2.9.1+cu128", "torch imports")


def test_garbage_is_an_error_row_not_a_pass() -> None:
    assert _rows("Permission denied\n", CUDA)[0][1:3] == (Status.ERROR, "unparsable_output")
    assert _rows("### probe-python found\nSegmentation fault\n", CUDA)[0][1:3] == (Status.ERROR, "unparsable_output")


@pytest.mark.integration
def test_the_command_runs_here_and_is_quoted(tmp_path: Path) -> None:
    """The command itself, run by sh on this machine: a path with a space and a quote stays one path."""
    odd = Profile.model_validate({"probes": {"python": str(tmp_path / "it's a dir" / "python3"), "device": "cpu"}})
    done = subprocess.run(["sh", "-c", probe_python.command_for(odd)], capture_output=True, text=True, check=False)
    assert _rows(done.stdout, odd)[0][1:3] == (Status.FAIL, "python_missing")
    done = subprocess.run(["sh", "-c", probe_python.command_for(CPU)], capture_output=True, text=True, check=False)
    assert [row[1] for row in _rows(done.stdout, CPU)] == [Status.PASS, Status.PASS, Status.SKIP]


@pytest.mark.parametrize(("capture", "devices"), [("h200x2_cuda_profile.txt", 2), ("h100x1_cuda_profile.txt", 1)])
def test_real_gpu_nodes_pass(capture: str, devices: int) -> None:
    """Captured on lent H200 and H100 machines (bench/results/*-builtin): torch 2.11.0+cu130 on driver 580's
    CUDA 13.0, every GPU seen."""
    model = probe_python.parse(_data(capture), 0)
    assert model.driver_cuda == (13, 0)
    rows = probe_python.evaluate(model, CUDA, NOBODY)
    assert [(r.item, r.status, r.reason, r.observed) for r in rows] == [
        ("python", Status.PASS, "ok", "Python 3.12.3"),
        ("torch", Status.PASS, "ok", "torch 2.11.0+cu130"),
        ("cuda", Status.PASS, "ok", "CUDA 13.0"),
    ]
    assert rows[-1].detail == f"torch sees {devices} GPUs"
    assert rows[0].detail == "/opt/torch/.venv/bin/python3"


def test_an_answer_taken_from_the_import_cache_is_said_and_is_no_retest() -> None:
    """The node's own check took torch's answer as an earlier check got it: torch was not imported again, so a
    drain for the interpreter is not lifted on this check's word."""
    from cluster_accept.checks.base import retested

    kept = probe_python.parse(_cuda_output("12.8", "13.0", cached_at="2026-11-18T11:06:00Z"), 0)
    rows = probe_python.evaluate(kept, CUDA, NOBODY)
    assert [(r.item, r.status, r.reason, r.observed) for r in rows if r.item == "import"] == [
        ("import", Status.PASS, "kept_answer", "as answered at 2026-11-18T11:06:00Z")
    ]
    assert "probe" not in retested(rows)
    fresh = probe_python.evaluate(probe_python.parse(_cuda_output("12.8", "13.0"), 0), CUDA, NOBODY)
    assert "probe" in retested(fresh) and [r.item for r in fresh] == ["python", "torch", "cuda"]
