"""Node-side stand-ins for GPU tools, installed into each simulated node's bin dir.

Each installed tool is a three-line wrapper with this interpreter's absolute path in its shebang: it puts
the project on ``sys.path`` and calls the stand-in's ``main`` with the node's data dir baked in, so no
environment variable or working directory is needed on the node side.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cluster_accept

# The directory holding the ``cluster_accept`` package (site-packages, or the checkout for an editable install).
PROJECT_ROOT = Path(cluster_accept.__file__).absolute().parent.parent
TOOLS = {
    "nvidia-smi": "cluster_accept.testbed.standins.nvidia_smi",
    "dmesg": "cluster_accept.testbed.standins.dmesg",
    "dcgmi": "cluster_accept.testbed.standins.dcgmi",
}


def _wrapper(path: Path, module: str, data_dir: Path, python: str) -> Path:
    path.write_text(
        # -I isolated, -S no site-packages: the stand-ins need only the stdlib, and site costs ~40 ms a call.
        f"#!{python} -IS\n"
        "import sys\n"
        f"sys.path.insert(0, {str(PROJECT_ROOT)!r})\n"
        f"from {module} import main\n"
        f"sys.exit(main(data_dir={str(data_dir.resolve())!r}))\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def write_standins(bin_dir: Path, data_dir: Path, python: str = sys.executable) -> dict[str, Path]:
    """Install every stand-in into ``bin_dir`` answering from ``data_dir``; returns tool -> path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    return {tool: _wrapper(bin_dir / tool, module, data_dir, python) for tool, module in TOOLS.items()}
