"""The probe interpreter's kept CUDA start rests on the Python modules torch's import loaded from outside torch's
folder, as it rests on the shared libraries it loaded: a pure-Python dependency removed or changed since the answer
was kept is never vouched for. The real check command, run by ``sh`` with a stand-in torch that imports a stand-in
dependency from another folder (as torch imports ``typing_extensions``, ``sympy`` or ``filelock`` from
site-packages) and counts its imports."""

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
HEALTHY = [("python", Status.PASS, "ok"), ("torch", Status.PASS, "ok"), ("cuda", Status.PASS, "ok")]


def _stand_ins(root: Path) -> tuple[dict[str, str], Path]:
    """A torch package that imports ``torchdep`` from a folder of its own and counts its imports in ``imports``,
    and an nvidia-smi saying CUDA 13.0; the environment to run the check in, and the dependency's file."""
    torch = root / "site" / "torch"
    torch.mkdir(parents=True)
    (torch / "version.py").write_text("__version__ = '2.13.0'\ncuda = '12.8'\n")
    (torch / "__init__.py").write_text(
        f"open({str(root / 'imports')!r}, 'a').write('x')\n"
        "import torchdep\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: torchdep.AVAILABLE)\n"
        "    device_count = staticmethod(lambda: 8)\n"
    )
    (torch / "lib").mkdir()
    dependency = root / "deps" / "torchdep.py"
    dependency.parent.mkdir()
    dependency.write_text("AVAILABLE = True\n")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |'\n")
    smi.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": f"{root / 'site'}:{root / 'deps'}",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        probe_python.IMPORT_CACHE_ENV: str(root / "state" / "probe-import.json"),
    }
    return env, dependency


def _check(env: dict[str, str]) -> tuple[list[tuple[str, Status, str]], dict[str, object]]:
    done = subprocess.run(["sh", "-c", probe_python.command_for(CUDA)], env=env, capture_output=True, text=True)
    model = probe_python.parse(done.stdout, done.returncode)
    assert model.info is not None, done.stdout + done.stderr
    rows = [(r.item, r.status, r.reason) for r in probe_python.evaluate(model, CUDA, NOBODY) if r.item != "import"]
    return rows, model.info


def test_a_dependency_removed_after_the_answer_was_kept_is_imported_again_and_fails(tmp_path: Path) -> None:
    env, dependency = _stand_ins(tmp_path)
    imports = tmp_path / "imports"
    rows, info = _check(env)
    assert rows == HEALTHY and "cached_at" not in info and imports.read_text() == "x"
    rows, info = _check(env)
    assert rows == HEALTHY and "cached_at" in info and imports.read_text() == "x"  # kept: not imported again

    dependency.unlink()  # torch's own folder untouched
    rows, info = _check(env)
    assert rows == [("python", Status.PASS, "ok"), ("torch", Status.FAIL, "torch_broken")], info
    assert "No module named 'torchdep'" in str(info["torch_error"]) and imports.read_text() == "xx"


def test_a_dependency_changed_in_place_is_imported_again(tmp_path: Path) -> None:
    """The dependency rewritten (a pip upgrade of a pure-Python package): its size and mtime changed, so its
    answer is taken afresh, and the new answer (no GPU seen) is the one reported."""
    env, dependency = _stand_ins(tmp_path)
    assert _check(env)[0] == HEALTHY and "cached_at" in _check(env)[1]
    dependency.write_text("AVAILABLE = False  # the new release sees no GPU\n")
    rows, info = _check(env)
    assert rows[-1] == ("cuda", Status.FAIL, "cuda_unavailable") and "cached_at" not in info
    assert (tmp_path / "imports").read_text() == "xx"


def test_a_kept_answer_without_its_modules_is_not_taken(tmp_path: Path) -> None:
    """A file kept before its modules were recorded (the shape of an earlier version: no ``modules``) vouches for
    nothing: torch is imported afresh and the file written anew with them: the dependency's file, none of torch's
    own folder."""
    env, dependency = _stand_ins(tmp_path)
    _check(env)
    cache = Path(env[probe_python.IMPORT_CACHE_ENV])
    earlier = json.loads(cache.read_text())
    earlier.pop("modules", None)
    cache.write_text(json.dumps(earlier))
    rows, info = _check(env)
    assert rows == HEALTHY and "cached_at" not in info and (tmp_path / "imports").read_text() == "xx"
    recorded = [entry[0] for entry in json.loads(cache.read_text())["modules"]]
    assert str(dependency) in recorded and not any(p.startswith(str(tmp_path / "site" / "torch")) for p in recorded)
