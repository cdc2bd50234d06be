"""Where the watch's files lie, with nothing else loaded: the command line's help shows them without importing
the watch itself."""

from __future__ import annotations

from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parent / "node"  # the shim and the node-side reader
DEFAULT_WATCH_DIR = "/var/tmp/cluster-accept-watch"  # CA_WATCH_DIR on the node: where armed ranks leave their files
