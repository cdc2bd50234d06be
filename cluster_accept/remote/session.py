"""What a node's session is to everything above it (:class:`NodeSession`: SSH, the controller itself, or a
simulated node), the controller's own session (:class:`LocalSession`), and a simulated node's, from the scale
simulator loaded by name (:func:`simulated_session`: it is not part of the wheel, and nothing here imports it)."""

from __future__ import annotations

import importlib
import shutil
from typing import Protocol, cast

from cluster_accept.inventory.model import Node
from cluster_accept.inventory.simulation_settings import SIMULATOR
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


def simulated_session(node: Node) -> NodeSession:
    """The session of a node of a simulated inventory (its ``simulation`` block, refused at load where the
    simulator is not installed), answered in-process from the recording."""
    assert node.simulated is not None, node.name
    simulator = importlib.import_module(SIMULATOR)
    return cast(NodeSession, simulator.simulated_session(node.name, node.simulated))
