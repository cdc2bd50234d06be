"""Installing cluster-accept adds one top-level name, ``cluster_accept``, and leaves other software alone.

The repository's folders are called ``tasks``, ``analysis``, ``checks`` …: names other packages use too. An
install that put them at the top level of site-packages would overwrite those packages, or be shadowed by
them. Each test installs a copy of this checkout into a fresh virtual environment that already holds
unrelated ``tasks`` and ``analysis`` packages, then, from a directory outside the checkout (else the
checkout's own folders would be found first), imports both worlds and runs the command line.

Fast and offline: the environments see the system site-packages (prefect, fabric, pandas … and pip and
setuptools come from there), ``--no-deps --no-build-isolation --no-index`` download nothing, and the
build runs in the copy, so the checkout gets no build/ or egg-info.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
UNRELATED = {"tasks": "unrelated tasks", "analysis": "unrelated analysis"}
# What a clean checkout would not hold: the copy leaves out caches, build output and run directories.
NOT_COPIED = shutil.ignore_patterns(
    ".git", "runs", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache"
)
NOT_COPIED_EITHER = shutil.ignore_patterns(".pytest_cache", ".hypothesis", ".benchmarks", ".venv", "venv")
# Sub-trees whose every file is shipped: what runs on the nodes, the templates, the outputs plug-ins' samples
# point at (``fixture=``).
SHIPPED_TREES = ("probes", "watch/node", "reports/templates", "samples")
# The source checkout's, not the product's: the test-bed and the scale simulator stay out of the wheel.
NOT_SHIPPED = ("testbed", "simulator")
IMPORTS = """\
import json, sys
import cluster_accept, cluster_accept.tasks.preflight.stage, cluster_accept.analysis.verdicts
print(json.dumps({
    "package": cluster_accept.__file__,
    "preflight": cluster_accept.tasks.preflight.stage.__file__,
    "verdicts": cluster_accept.analysis.verdicts.__file__,
    "sys_path": sys.path,
}))
"""


SAMPLES_READ = """\
from cluster_accept.checks.base import discover
from cluster_accept.probes.base import discover as probes
samples = [s for plugin in [*discover(), *probes()] for s in plugin.samples]
print(len(samples), sum(len(s.output().splitlines()) for s in samples))
"""


def _ignored(directory: str, names: list[str]) -> set[str]:
    return NOT_COPIED(directory, names) | NOT_COPIED_EITHER(directory, names)


@dataclass
class Venv:
    root: Path
    site_packages: Path
    cwd: Path  # outside the checkout and the copy
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300, check=False
        )

    def ok(self, *args: str) -> str:
        """Run; its stdout, or a failure that shows what it printed."""
        done = self.run(*args)
        assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def _environment() -> dict[str, str]:
    """This environment without what would point Python or pip elsewhere (the repository on PYTHONPATH, an
    active virtual environment); pip never asks the network or the terminal, and keeps no cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PIP_NO_CACHE_DIR": "1"}
    env |= {"PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "100"}
    return env


def make_venv(tmp_path: Path, name: str) -> Venv:
    """A virtual environment on this environment's site-packages (a ``.pth``: where the tests run in a virtual
    environment, ``--system-site-packages`` would give the base interpreter's, whose setuptools may be too old to
    build), with the two unrelated packages in its own, in front of them."""
    if importlib.util.find_spec("venv") is None:
        pytest.skip("the venv module is unavailable (on Debian and Ubuntu it is the python3-venv package)")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    root = tmp_path / name
    env = _environment()
    # Without its own pip: ensurepip would put an older setuptools in front of this environment's.
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if made.returncode != 0 and "No module named venv" in made.stderr:
        pytest.skip(f"python3 -m venv is unavailable: {made.stderr.strip()}")
    assert made.returncode == 0, made.stderr
    venv = Venv(root, Path(), cwd, env)
    own = Path(venv.ok(venv.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    outer = dict.fromkeys(sysconfig.get_path(key) for key in ("purelib", "platlib"))
    (own / "_outer_environment.pth").write_text("".join(f"{path}\n" for path in outer))
    venv.ok(venv.python, "-m", "pip", "--version")
    venv.ok(venv.python, "-c", "import setuptools")  # the build backend, used as installed (no isolation)
    purelib = venv.ok(venv.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
    venv.site_packages = Path(purelib)
    assert venv.site_packages.is_relative_to(root), purelib
    for package, who in UNRELATED.items():
        (venv.site_packages / package).mkdir(parents=True)
        (venv.site_packages / package / "__init__.py").write_text(f"WHO = {who!r}\n")
    return venv


def copy_checkout(tmp_path: Path) -> Path:
    """The working tree as it is now (uncommitted files included)."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, symlinks=True, ignore=_ignored)
    return copy


def install(venv: Venv, source: Path, *, editable: bool) -> None:
    args = [venv.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    venv.ok(*args, *(["-e"] if editable else []), str(source))


def assert_unrelated_packages_untouched(venv: Venv) -> None:
    for package, who in UNRELATED.items():
        written = (venv.site_packages / package / "__init__.py").read_text()
        assert written == f"WHO = {who!r}\n", f"the install overwrote the unrelated {package}/: {written[:200]!r}"
    out = venv.ok(venv.python, "-c", "import tasks, analysis; print(tasks.WHO, analysis.WHO, sep='|')")
    assert out.strip() == f"{UNRELATED['tasks']}|{UNRELATED['analysis']}"


def imported_files(venv: Venv) -> dict[str, str]:
    return json.loads(venv.ok(venv.python, "-c", IMPORTS))


def assert_help_runs(venv: Venv) -> None:
    script = venv.root / "bin" / "cluster-accept"
    assert script.exists(), "the cluster-accept console script was not installed"
    out = venv.ok(str(script), "--help")
    assert "Usage" in out and "cluster-accept" in out, out


def dist_info(venv: Venv) -> Path:
    (found,) = venv.site_packages.glob("cluster_accept-*.dist-info")
    return found


def top_level_names(venv: Venv) -> set[str]:
    """The names the installed distribution put directly into site-packages (by its RECORD, where pip lists
    every file it wrote), besides its own .dist-info; the console script lies outside (``../../../bin``)."""
    info = dist_info(venv)
    names = set()
    for line in (info / "RECORD").read_text().splitlines():
        path = line.rsplit(",", 2)[0].strip('"')
        first = path.split("/", 1)[0]
        if first and first not in ("..", info.name):
            names.add(first)
    return names


def files_under(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def assert_shipped(copy: Path, installed: Path) -> None:
    """Every module of every sub-package of cluster_accept/ is installed but the test-bed's and the simulator's,
    and every file of the node-side and report trees; compared with the copy (the checkout as installed), not a
    list of names."""
    package = copy / "cluster_accept"
    folders = sorted(p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert {"analysis", "probes", "reports", "tasks", *NOT_SHIPPED} <= set(folders), folders
    assert not [name for name in NOT_SHIPPED if (installed / name).exists()], "the test-bed or simulator shipped"
    folders = [name for name in folders if name not in NOT_SHIPPED]
    assert not any(p.is_symlink() for p in package.rglob("*")), "links in the package"
    missing = []
    for folder in folders:
        wanted = {f for f in files_under(package / folder) if f.endswith(".py")}
        missing += [f"{folder}/{f}" for f in sorted(wanted - files_under(installed / folder))]
    for tree in SHIPPED_TREES:
        missing += [f"{tree}/{f}" for f in sorted(files_under(package / tree) - files_under(installed / tree))]
    assert not missing, "in the checkout but not installed:\n" + "\n".join(missing)
    assert (installed / "reports" / "templates" / "report.html.j2").is_file()


def test_a_regular_install_beside_unrelated_tasks_and_analysis(tmp_path: Path) -> None:
    copy = copy_checkout(tmp_path)
    venv = make_venv(tmp_path, "venv-regular")

    install(venv, copy, editable=False)

    assert_unrelated_packages_untouched(venv)
    files = imported_files(venv)
    installed = venv.site_packages / "cluster_accept"
    for name in ("package", "preflight", "verdicts"):
        assert Path(files[name]).resolve().is_relative_to(installed.resolve()), (name, files[name])
    assert top_level_names(venv) == {"cluster_accept"}
    top_level = dist_info(venv) / "top_level.txt"
    if top_level.exists():
        assert top_level.read_text().split() == ["cluster_accept"]
    assert not installed.is_symlink() and not any(p.is_symlink() for p in installed.iterdir())
    assert_shipped(copy, installed)
    assert_help_runs(venv)
    assert_checkout_only_parts_refused(venv, tmp_path)
    assert_samples_read(venv)


def assert_samples_read(venv: Venv) -> None:
    """Every sample of every discovered check and probe reads its output from the installed package alone."""
    said = venv.ok(venv.python, "-c", SAMPLES_READ)
    count, lines = (int(x) for x in said.split())
    assert count > 100 and lines > count, said


def assert_checkout_only_parts_refused(venv: Venv, tmp_path: Path) -> None:
    """Without the test-bed and the simulator, what needs them says so and exits 2: nothing half-runs."""
    script = str(venv.root / "bin" / "cluster-accept")
    refused = venv.run(script, "testbed", "up", "--nodes", "1")
    assert refused.returncode == 2 and "comes with the source checkout" in refused.stderr, refused
    inventory = tmp_path / "simulated.yaml"
    inventory.write_text(
        "cluster: sim\ndefaults: {profile: h100-sxm}\nnodes: [{hosts: gpu1}]\nsimulation: {recording: r.json}\n"
    )
    refused = venv.run(script, "inventory", "check", str(inventory))
    said = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "the scale simulator" in said and "not installed" in said, said


def test_an_editable_install_beside_unrelated_tasks_and_analysis(tmp_path: Path) -> None:
    """Editable: the package is found in the copy, through a finder that maps ``cluster_accept`` alone; a path
    entry for the copy's root would put its ``tasks`` and ``analysis`` in front of the unrelated ones."""
    copy = copy_checkout(tmp_path)
    venv = make_venv(tmp_path, "venv-editable")

    install(venv, copy, editable=True)

    assert_unrelated_packages_untouched(venv)
    files = imported_files(venv)
    for name in ("package", "preflight", "verdicts"):
        assert Path(files[name]).is_relative_to(copy / "cluster_accept"), (name, files[name])
    on_path = [entry for entry in files["sys_path"] if entry and Path(entry).resolve().is_relative_to(copy)]
    assert not on_path, f"the editable install put the copy on sys.path: {on_path}"
    top_level = dist_info(venv) / "top_level.txt"
    if top_level.exists():
        assert top_level.read_text().split() == ["cluster_accept"]
    assert_help_runs(venv)
    # a source checkout has them: the test-bed and the simulator import from the copy
    found = venv.ok(venv.python, "-c", "import cluster_accept.testbed.bed as t, cluster_accept.simulator.nodes as s; "
                    "print(t.__file__); print(s.__file__)")  # fmt: skip
    assert all(Path(line).is_relative_to(copy / "cluster_accept") for line in found.split()), found
