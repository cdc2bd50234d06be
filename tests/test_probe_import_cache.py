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


def _rows(env: dict[str, str]) -> list[tuple[str, Status, str]]:
    done = subprocess.run(["sh", "-c", probe_python.command_for(CUDA)], env=env, capture_output=True, text=True)
    model = probe_python.parse(done.stdout, done.returncode)
    return [(r.item, r.status, r.reason) for r in probe_python.evaluate(model, CUDA, NOBODY)]


@pytest.mark.parametrize(
    "planted",
    [
        "null",
        "[]",
        '"probe"',
        "{}",
        "{not json",
        "KEPT without answer",
        "KEPT with cuda_devices '99'",
        "KEPT with cuda_available 1",
        "KEPT with an extra key",
    ],
)
def test_a_kept_answer_of_another_shape_is_replaced_never_trusted(tmp_path: Path, planted: str) -> None:
    """A file of the checking user, but not of the shape written (cut, edited, another version's): torch is
    imported afresh, the node passes, and the file is replaced by the fresh answer, taken from then on."""
    env = _stand_ins(tmp_path)
    cache = tmp_path / "state" / "probe-import.json"
    kept = {**env, probe_python.IMPORT_CACHE_ENV: str(cache)}
    _check(kept)
    good = json.loads(cache.read_text())
    if planted.startswith("KEPT"):
        bad = json.loads(cache.read_text())
        if "without answer" in planted:
            del bad["answer"]
        elif "'99'" in planted:
            bad["answer"]["cuda_devices"] = "99"
        elif "available 1" in planted:
            bad["answer"]["cuda_available"] = 1
        else:
            bad["by"] = "hand"
        planted = json.dumps(bad)
    cache.write_text(planted)
    assert _rows(kept) == [("python", Status.PASS, "ok"), ("torch", Status.PASS, "ok"), ("cuda", Status.PASS, "ok")]
    assert (tmp_path / "imports").read_text() == "xx"  # imported afresh
    healed = json.loads(cache.read_text())
    assert healed["key"] == good["key"] and healed["answer"] == good["answer"]
    info, said = _check(kept)
    assert info["cuda_devices"] == 8 and said.startswith("torch sees 8 GPUs (as torch's import answered at ")
    assert (tmp_path / "imports").read_text() == "xx"


def _external_library(root: Path) -> Path:
    """A copy of the C maths library outside torch's folder, which the stand-in torch loads at import (as torch
    loads CUDA's libraries from their own pip packages)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    libm = next(line.split()[-1] for line in maps if line.split()[-1].rsplit("/", 1)[-1].startswith("libm.so"))
    lib = root / "elsewhere" / "libext.so.1"
    lib.parent.mkdir()
    lib.write_bytes(Path(libm).read_bytes())
    init = root / "site" / "torch" / "__init__.py"
    init.write_text(init.read_text() + f"import ctypes\nctypes.CDLL({str(lib)!r}).cos\n")
    return lib


def test_a_library_torch_loads_from_elsewhere_is_part_of_the_key(tmp_path: Path) -> None:
    env = _stand_ins(tmp_path)
    lib = _external_library(tmp_path)
    kept = {**env, probe_python.IMPORT_CACHE_ENV: str(tmp_path / "state" / "probe-import.json")}
    imports = tmp_path / "imports"
    assert "cached_at" not in _check(kept)[0] and "cached_at" in _check(kept)[0] and imports.read_text() == "x"

    lib.write_bytes(b"not a shared object any more\n")  # broken in place, torch's own folder untouched
    assert _rows(kept) == [("python", Status.PASS, "ok"), ("torch", Status.FAIL, "torch_broken")]
    assert imports.read_text() == "xx"  # imported afresh, not taken from the kept answer


def test_a_state_directory_that_is_a_link_is_never_used(tmp_path: Path) -> None:
    """The state directory must be the checking user's own directory, not a link to one (root's prolog would
    write wherever another user's link points)."""
    env = _stand_ins(tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(target)
    kept = {**env, probe_python.IMPORT_CACHE_ENV: str(tmp_path / "state" / "probe-import.json")}
    for _ in range(2):
        assert "cached_at" not in _check(kept)[0]
    assert (tmp_path / "imports").read_text() == "xx" and list(target.iterdir()) == []
