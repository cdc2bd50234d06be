"""The shape of the package: small modules, short functions in the orchestration layers, and imports that
point one way.

Sizes: a module over 400 lines, or a flow or task function over 60 lines, has taken on more than one job;
it is split before it grows further. Imports: Prefect is the orchestration layer (flows/, tasks/), so the
checks, parsers and reports stay usable and testable without it; Fabric and Paramiko stay behind
remote/ssh.py, so the transport can be replaced in one place; the node-side probe scripts run on a node
that has only Python and torch; and every import names ``cluster_accept.``, because the bare folder names
(``tasks``, ``analysis`` …) are other software's top-level packages once installed.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent
# The repository's folders that cluster_accept/ links in as sub-packages.
PACKAGE_FOLDERS = ("analysis", "checks", "flows", "inventory", "probes", "remote", "reports", "tasks", "testbed")
# Data, not modules: captured node output.
DATA = (ROOT / "testbed" / "captures",)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Not the repository's own code: caches, build output, virtual environments, run directories, and the
# links in cluster_accept/ (their targets are walked once, where they live).
NOT_OURS = {".git", "build", "dist", "runs", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
NOT_OURS |= {".hypothesis", ".benchmarks", ".venv", "venv", "node_modules"}


def _is_data(path: Path) -> bool:
    return any(path.is_relative_to(data) for data in DATA)


def package_modules(folders: tuple[str, ...] = PACKAGE_FOLDERS) -> list[Path]:
    """Every ``.py`` file of the given package folders, data folders left out."""
    found: list[Path] = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if not _is_data(path) and not NOT_OURS.intersection(path.relative_to(ROOT).parts):
                found.append(path)
    return found


def repository_modules() -> list[Path]:
    """Every ``.py`` file in the repository (tests/ and bench/ included), each once."""
    found: list[Path] = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[0] == "cluster_accept" and len(parts) > 2:
            continue  # through a link: the same file as <folder>/...
        if NOT_OURS.intersection(parts) or any(part.endswith(".egg-info") for part in parts) or _is_data(path):
            continue
        found.append(path)
    return found


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module name) of every absolute import anywhere in the module: top level, in functions, under
    ``if TYPE_CHECKING``; ``from x import y`` yields ``x``. Relative imports are left out (they stay inside the
    package by construction)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def top(module: str) -> str:
    return module.split(".", 1)[0]


# (a) and (b): sizes -----------------------------------------------------------------------------------


def test_no_module_of_the_package_is_over_400_lines() -> None:
    modules = package_modules()
    assert len(modules) > 30, "the package folders were not found"
    sizes = {rel(path): len(path.read_text(encoding="utf-8").splitlines()) for path in modules}
    over = [f"{path} ({lines} lines)" for path, lines in sorted(sizes.items()) if lines > MAX_MODULE_LINES]
    assert not over, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(over)


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, nested ones included, with its qualified name (``Class.method.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def test_no_function_in_flows_or_tasks_is_over_60_lines() -> None:
    """Counted from the ``def`` line (decorators not included) to the last line of the body, nested functions
    counted on their own as well as inside the function that holds them."""
    over = []
    modules = package_modules(("flows", "tasks"))
    assert modules, "flows/ and tasks/ were not found"
    for path in modules:
        for name, node in functions(parse(path)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                over.append(f"{rel(path)}:{name} ({lines} lines)")
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)


# (c): which way the imports point ----------------------------------------------------------------------


def offending_imports(paths: list[Path], forbidden: set[str]) -> list[str]:
    return [
        f"{rel(path)}:{line} imports {module}"
        for path in paths
        for line, module in imported_modules(parse(path))
        if top(module) in forbidden
    ]


def test_only_flows_and_tasks_import_prefect() -> None:
    others = [p for p in package_modules() if p.relative_to(ROOT).parts[0] not in ("flows", "tasks")]
    found = offending_imports(others, {"prefect"})
    assert not found, "Prefect imported outside flows/ and tasks/:\n" + "\n".join(found)


def test_only_remote_ssh_imports_fabric_or_paramiko() -> None:
    """The package and bench/; tests may use them to build fakes."""
    paths = [*package_modules(), *sorted((ROOT / "bench").rglob("*.py"))]
    found = offending_imports([p for p in paths if p != ROOT / "remote" / "ssh.py"], {"fabric", "paramiko"})
    assert not found, "Fabric or Paramiko imported outside remote/ssh.py:\n" + "\n".join(found)


def node_side_scripts() -> list[Path]:
    """The files under probes/node/ (when the folder exists), and any file under probes/ that imports torch."""
    probes = package_modules(("probes",))
    node = ROOT / "probes" / "node"
    return [
        path
        for path in probes
        if path.is_relative_to(node) or any(top(module) == "torch" for _, module in imported_modules(parse(path)))
    ]


def test_node_side_probe_scripts_import_only_torch_and_the_standard_library() -> None:
    """A node has Python and torch, not cluster-accept or its dependencies: a script that imports anything
    else fails there, not here. Another node-side script may be imported: probes ship it alongside (the burn
    samples nvidia-smi with the GPU bench's sampler)."""
    scripts = node_side_scripts()
    assert scripts, "no node-side probe script found under probes/"
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"} | {path.stem for path in scripts}
    found = [
        f"{rel(path)}:{line} imports {module}"
        for path in scripts
        for line, module in imported_modules(parse(path))
        if top(module) not in allowed
    ]
    assert not found, "node-side probe scripts import more than torch and the standard library:\n" + "\n".join(found)


def test_every_import_of_the_package_names_cluster_accept() -> None:
    """``from tasks import …`` works only where the repository root is on sys.path, and there it shadows (or is
    shadowed by) any other installed ``tasks`` or ``analysis``; the installed package is ``cluster_accept``."""
    modules = repository_modules()
    assert any(p.relative_to(ROOT).parts[0] == "tests" for p in modules), "tests/ not walked"
    found = offending_imports(modules, set(PACKAGE_FOLDERS))
    assert not found, "imports of the old top-level names (write cluster_accept.<name>):\n" + "\n".join(found)
