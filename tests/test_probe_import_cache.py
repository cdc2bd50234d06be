"""The probe interpreter's CUDA start, kept for a node's own check: the real check command, run by ``sh`` with a
stand-in torch (a CUDA build that counts its imports) and a stand-in ``nvidia-smi``. The answer is taken again
only while nothing it rests on changed, only from a file of the checking user, and only when it was good."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_accept.checks import probe_python
from cluster_accept.checks.base import ClusterView, Status
from cluster_accept.inventory.model import Profile

pytestmark = pytest.mark.integration

NOBODY = ClusterView({}, 0)
CUDA = Profile.model_validate({"probes": {"python": sys.executable, "device": "cuda"}})


def _stand_ins(root: Path, available: bool = True) -> dict[str, str]:
    """A torch package whose import is counted in ``imports``, and an nvidia-smi saying CUDA 13.0."""
    torch = root / "site" / "torch"
    torch.mkdir(parents=True)
    (torch / "version.py").write_text("__version__ = '2.13.0'\ncuda = '12.8'\n")
    (torch / "__init__.py").write_text(
        f"open({str(root / 'imports')!r}, 'a').write('x')\n"
        "class cuda:\n"
        f"    is_available = staticmethod(lambda: {available})\n"
        "    device_count = staticmethod(lambda: 8)\n"
    )
    (torch / "lib").mkdir()
    bin_dir = root / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |'\n")
    smi.chmod(0o755)
    return {**os.environ, "PYTHONPATH": str(root / "site"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _check(env: dict[str, str]) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        ["sh", "-c", probe_python.command_for(CUDA)], env=env, capture_output=True, text=True, check=True
    )
    model = probe_python.parse(done.stdout, done.returncode)
    assert model.info is not None, done.stdout
    (cuda,) = [r for r in probe_python.evaluate(model, CUDA, NOBODY) if r.item == "cuda"]
    assert (cuda.status, cuda.reason, cuda.observed) == (Status.PASS, "ok", "CUDA 12.8"), cuda
    return model.info, cuda.detail


def test_a_good_import_is_taken_again_until_what_it_rests_on_changes(tmp_path: Path) -> None:
    env = _stand_ins(tmp_path)
    cache = tmp_path / "state" / "probe-import.json"
    kept = {**env, probe_python.IMPORT_CACHE_ENV: str(cache)}
    imports = tmp_path / "imports"

    first, said = _check(kept)
    assert imports.read_text() == "x" and "cached_at" not in first and said == "torch sees 8 GPUs"
    assert cache.stat().st_mode & 0o777 == 0o600 and cache.parent.stat().st_mode & 0o777 == 0o700

    again, said = _check(kept)
    assert imports.read_text() == "x", "imported again though nothing changed"
    assert again["cuda_devices"] == 8 and str(again["cached_at"]).endswith("Z")
    assert said.startswith("torch sees 8 GPUs (as torch's import answered at ") and "unchanged" in said

    init = tmp_path / "site" / "torch" / "__init__.py"
    init.write_text(init.read_text() + "\n")  # torch reinstalled: its files changed
    assert "cached_at" not in _check(kept)[0] and imports.read_text() == "xx"
    assert "cached_at" in _check(kept)[0] and imports.read_text() == "xx"

    picked = {**kept, "CUDA_VISIBLE_DEVICES": "0,1"}  # another choice of GPUs
    assert "cached_at" not in _check(picked)[0] and imports.read_text() == "xxx"


def test_a_run_from_the_controller_always_imports(tmp_path: Path) -> None:
    env = _stand_ins(tmp_path)
    for _ in range(2):
        assert "cached_at" not in _check(env)[0]
    assert (tmp_path / "imports").read_text() == "xx"


def test_a_kept_answer_others_could_write_is_ignored(tmp_path: Path) -> None:
    env = _stand_ins(tmp_path)
    cache = tmp_path / "state" / "probe-import.json"
    kept = {**env, probe_python.IMPORT_CACHE_ENV: str(cache)}
    _check(kept)
    planted = json.loads(cache.read_text())
    planted["answer"]["cuda_devices"] = 99
    cache.write_text(json.dumps(planted))
    cache.chmod(0o666)  # anyone could have written it
    info, _ = _check(kept)
    assert "cached_at" not in info and info["cuda_devices"] == 8
    assert (tmp_path / "imports").read_text() == "xx"


def test_a_failed_cuda_start_is_never_kept(tmp_path: Path) -> None:
    env = _stand_ins(tmp_path, available=False)
    cache = tmp_path / "state" / "probe-import.json"
    kept = {**env, probe_python.IMPORT_CACHE_ENV: str(cache)}
    for _ in range(2):
        done = subprocess.run(["sh", "-c", probe_python.command_for(CUDA)], env=kept, capture_output=True, text=True)
        model = probe_python.parse(done.stdout, done.returncode)
        (cuda,) = [r for r in probe_python.evaluate(model, CUDA, NOBODY) if r.item == "cuda"]
        assert (cuda.status, cuda.reason) == (Status.FAIL, "cuda_unavailable")
    assert not cache.exists() and (tmp_path / "imports").read_text() == "xx"
