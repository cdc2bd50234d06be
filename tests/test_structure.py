"""The shape of the package: short functions, and imports that point one way without circles.

Sizes: a function over 60 lines has taken on more than one job; it is split before it grows further (a
module's size is left to review: what it holds belongs together, or it is split by what it does).

Imports: Prefect is the orchestration layer (flows/, tasks/), so the checks, parsers and reports stay usable
and testable without it; Fabric and Paramiko stay behind remote/ssh.py, so the transport can be replaced in
one place; the node-side probe scripts run on a node that has only Python and torch; every import names
``cluster_accept.``, because the bare folder names (``tasks``, ``analysis`` …) are other software's top-level
packages once installed; and no module imports another that (through others) imports it, nor one on a floor
above its own.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cluster_accept"
# The package's sub-packages: the owner's folders, one level down.
PACKAGE_FOLDERS = (
    "analysis", "checks", "flows", "inventory", "ops", "probes", "remote", "reports", "rundir", "simulator", "tasks",
    "testbed", "vocabulary", "watch",
)  # fmt: skip
# Data, not modules: captured node output.
DATA = (PACKAGE / "testbed" / "captures",)
MAX_FUNCTION_LINES = 60
# Not the repository's own code: caches, build output, virtual environments, run directories.
NOT_OURS = {".git", "build", "dist", "runs", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
NOT_OURS |= {".hypothesis", ".benchmarks", ".venv", "venv", "node_modules"}


def _is_data(path: Path) -> bool:
    return any(path.is_relative_to(data) for data in DATA)


def package_modules(folders: tuple[str, ...] = PACKAGE_FOLDERS) -> list[Path]:
    """Every ``.py`` file of the given package folders, data folders left out."""
    found: list[Path] = []
    for folder in folders:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            if not _is_data(path) and not NOT_OURS.intersection(path.relative_to(ROOT).parts):
                found.append(path)
    return found


def repository_modules() -> list[Path]:
    """Every ``.py`` file in the repository (tests/ and bench/ included), each once."""
    found: list[Path] = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
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


def test_no_function_of_the_package_is_over_60_lines() -> None:
    """Counted from the ``def`` line (decorators not included) to the last line of the body, nested functions
    counted on their own as well as inside the function that holds them; node-side scripts included."""
    over = []
    modules = package_modules()
    assert len(modules) > 100, "the package's folders were not found"
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
    others = [p for p in package_modules() if p.relative_to(PACKAGE).parts[0] not in ("flows", "tasks")]
    found = offending_imports(others, {"prefect"})
    assert not found, "Prefect imported outside flows/ and tasks/:\n" + "\n".join(found)


def test_only_remote_ssh_imports_fabric_or_paramiko() -> None:
    """The package and bench/; tests may use them to build fakes."""
    paths = [*package_modules(), *sorted((ROOT / "bench").rglob("*.py"))]
    found = offending_imports([p for p in paths if p != PACKAGE / "remote" / "ssh.py"], {"fabric", "paramiko"})
    assert not found, "Fabric or Paramiko imported outside remote/ssh.py:\n" + "\n".join(found)


def _imports_torch(path: Path) -> bool:
    return any(top(module) == "torch" for _, module in imported_modules(parse(path)))


def node_side_scripts() -> list[Path]:
    """The files under probes/node/ and watch/node/, and any file under probes/ that imports torch."""
    node = (PACKAGE / "probes" / "node", PACKAGE / "watch" / "node")
    return [
        path
        for path in package_modules(("probes", "watch"))
        if any(path.is_relative_to(folder) for folder in node)
        or (path.is_relative_to(PACKAGE / "probes") and _imports_torch(path))
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


# (d): no circles, no arrow back up -----------------------------------------------------------------------

# The floors, top down, one folder each: a module imports only from its own folder or the folders below it, never
# up, and without circles between modules. The vocabulary (statuses, masking, text cuts) imports nothing of the
# package. docs/layout.md draws the same order (``test_layout_draws_the_floors_the_code_has``).
FLOORS: tuple[str, ...] = (
    "flows", "tasks", "watch", "rundir", "ops", "probes", "reports", "analysis", "checks", "remote", "inventory",
    "vocabulary",
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from cluster_accept.x import y`` names ``x.y`` where that is
    a module, else ``x``), every import counted: top level, in functions, under ``if TYPE_CHECKING``."""
    modules = {module_name(path): path for path in package_modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
                found |= {node.module} if not node.module.endswith("__init__") else set()
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
        graph[name] = {m for m in found if m != name and not name.startswith(f"{m}.")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next((e for e in edges if e in graph), None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return found


def test_circles_are_found() -> None:
    """The finder itself, on a graph with one circle of three and a branch off it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_package_is_in_an_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 100 and "cluster_accept.checks.contract" in graph["cluster_accept.checks.roce"]
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def floor_of(module: str) -> int | None:
    folder = module.split(".")[1] if module.count(".") >= 1 else ""
    return FLOORS.index(folder) if folder in FLOORS else None


NOT_SHIPPED = ("cluster_accept.testbed", "cluster_accept.simulator")  # the checkout's, not the wheel's


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` that points to a folder on a floor above its own, or (from a shipped floor) into
    the test-bed or the scale simulator: flows' test-bed commands alone may (they say so where it is not
    installed)."""
    back_up = []
    for module, imported in graph.items():
        here = floor_of(module)
        for target in imported:
            there = floor_of(target)
            not_shipped = target.startswith(NOT_SHIPPED) and here is not None
            if not_shipped and not (here == 0 and target.startswith("cluster_accept.testbed")):
                back_up.append(f"{module} imports {target}")
            elif here is not None and there is not None and there < here:
                back_up.append(f"{module} imports {target}")
    return sorted(back_up)


def test_an_import_up_a_floor_between_any_two_folders_is_found() -> None:
    """The rule itself: for every pair of floors, an import from the lower to the upper is named, the other way
    is not, and one inside a folder is not."""
    for low, folder in enumerate(FLOORS):
        for high in FLOORS[:low]:
            up = {f"cluster_accept.{folder}.a": {f"cluster_accept.{high}.b"}}
            down = {f"cluster_accept.{high}.b": {f"cluster_accept.{folder}.a"}}
            assert upward_imports(up) == [f"cluster_accept.{folder}.a imports cluster_accept.{high}.b"]
            assert upward_imports(down) == []
        assert upward_imports({f"cluster_accept.{folder}.a": {f"cluster_accept.{folder}.b"}}) == []
    assert upward_imports({"cluster_accept.checks.a": {"cluster_accept.simulator.b"}}) != []


def test_every_folder_of_the_package_has_its_floor() -> None:
    """A new folder is placed on a floor (or named as not shipped) before anything imports it."""
    placed = set(FLOORS) | {name.rsplit(".", 1)[1] for name in NOT_SHIPPED}
    assert set(PACKAGE_FOLDERS) == placed, set(PACKAGE_FOLDERS) ^ placed


def test_no_import_points_back_up_a_floor() -> None:
    """flows -> tasks -> watch -> rundir -> ops -> probes -> reports -> analysis -> checks -> remote -> inventory ->
    vocabulary. The test-bed and the scale simulator (not in the wheel) are on no floor and may import any;
    nothing on a floor imports them, but flows its test-bed commands."""
    back_up = upward_imports(import_graph())
    assert not back_up, "imports that point back up:\n" + "\n".join(back_up)


def test_layout_draws_the_floors_the_code_has() -> None:
    """docs/layout.md's line of floors names the folders in the order :data:`FLOORS` holds them."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    drawn = " → ".join(f"`{folder}`" for folder in FLOORS)
    assert drawn in text, f"docs/layout.md does not draw the floors as {drawn}"
