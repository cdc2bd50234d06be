"""Node-side ``dmesg`` stand-in: prints the node's kernel log (boot lines, plus any planted Xid lines).

The real ``dmesg`` would show this machine's kernel log, identical on every simulated node; the checks
look for NVRM Xid lines per node, so each node gets its own log from its data dir. ``--level``/``-l``
filtering is not simulated (every line is printed); ``-T``/``--ctime`` print the same relative stamps.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None, data_dir: str | Path | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write("Usage:\n dmesg [options]\n\nDisplay or control the kernel ring buffer.\n")
        return 0
    if any(a in ("-c", "-C", "--clear", "--read-clear") for a in argv):
        sys.stderr.write("dmesg: clearing the kernel log is not simulated by the test-bed\n")
        return 1
    folder = Path(data_dir or os.environ.get("CLUSTER_ACCEPT_TESTBED_DATA", "."))
    try:
        sys.stdout.write((folder / "dmesg.txt").read_text(encoding="utf-8"))
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
