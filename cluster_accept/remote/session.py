"""What a node's session is to everything above it (:class:`NodeSession`: SSH, the controller itself, or a
simulated node), and the controller's own session (:class:`LocalSession`)."""

from __future__ import annotations

import shutil
from typing import Protocol

from cluster_accept.inventory.model import Node
from cluster_accept.remote.local import run_local


class NodeSession(Protocol):
    def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]: ...

    def put(self, local_path: str, remote_path: str) -> None: ...

    def close(self) -> None: ...


class LocalSession:
    """The controller itself, without SSH."""

    def __init__(self, node: Node):
        self.node = node

    def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]:
        return run_local(["sh", "-c", script], timeout_s)

    def put(self, local_path: str, remote_path: str) -> None:
        shutil.copyfile(local_path, remote_path)

    def close(self) -> None:
        return None
