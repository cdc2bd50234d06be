"""Which test-bed holds a name or a state dir: what of it is alive, where its state is, and the host lock.

A test-bed is running while anything of it is alive: its network namespaces, the links it made or processes
started from its state dir. ``up`` refuses a name or state dir held by a running test-bed (a stale one,
nothing alive, is cleaned and replaced); the choice of a free subnet and the bridge that takes it happen under
one host-wide lock, so two ``up`` at once never pick the same subnet.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cluster_accept.testbed import net

DEFAULT_NAME = "ca"
STATE_DIR_BASE = "/tmp/cluster-accept-testbed"
LOCK_PATH = Path("/run/cluster-accept-testbed.lock")


class TestbedError(RuntimeError):
    """The test-bed cannot be brought up, reopened or changed as asked."""


def default_state_dir(name: str) -> Path:
    """Where the test-bed ``name`` keeps its state unless told otherwise: ``/tmp/cluster-accept-testbed-NAME``."""
    return Path(f"{STATE_DIR_BASE}-{name}")


def demo_name() -> str:
    """A fresh name for a ``demo`` test-bed: ``demo`` and 4 random hex digits."""
    return f"demo{secrets.token_hex(2)}"


def down_command(name: str) -> str:
    return f"cluster-accept testbed down --name {name}"


def name_to_take_down(name: str | None, state_dir: Path | None) -> str:
    """The test-bed a ``down`` means: ``name``, else the one whose state ``state_dir`` holds, else the default
    name; an error when ``state_dir`` holds another test-bed than ``name``, or no state and no name is given."""
    if state_dir is not None:
        state = read_state(Path(state_dir).resolve())
        recorded = state.get("prefix") if state is not None else None
        if name is None and recorded is None:
            raise TestbedError(f"no test-bed state in {state_dir} (state.json missing or unreadable): give its --name")
        if name is not None and recorded not in (None, name):
            raise TestbedError(f"{state_dir} holds the test-bed {recorded!r}, not {name!r}")
        name = name or str(recorded)
    name = name or DEFAULT_NAME
    net.check_name(name)
    return name


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def own_processes(state_dir: Path) -> list[int]:
    """Processes started from this state dir: anything whose command line names one of its node dirs or its
    Slurm dir (munged, slurmctld)."""
    markers = (f"{state_dir}/nodes/", f"{state_dir}/slurm/")
    return processes_whose_command(lambda line: any(marker in line for marker in markers))


def processes_whose_command(matches: Callable[[str], bool]) -> list[int]:
    """Processes (this one aside) whose command line, its arguments joined by spaces, ``matches``."""
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if matches(line):
                    pids.append(int(entry.name))
    return pids


def locate(name: str) -> Path | None:
    """The state dir of the running test-bed ``name``, as its bridge records it (None if unknown)."""
    recorded = net.bridge_state_dir(name)
    return Path(recorded) if recorded else None


def alive(state_dir: Path, name: str) -> list[str]:
    """What of the test-bed ``name`` / of ``state_dir`` is alive, in words (empty: nothing)."""
    parts = []
    namespaces = net.list_netns(name)
    if namespaces:
        parts.append(f"{len(namespaces)} network namespace(s) {namespaces[0]}..")
    links = net.list_links(name)
    if links:
        parts.append(f"interface(s) {', '.join(sorted(links)[:3])}{'..' if len(links) > 3 else ''}")
    pids = own_processes(state_dir)
    if pids:
        parts.append(f"{len(pids)} process(es) started from {state_dir} (pid {min(pids)}..)")
    return parts


def refuse_taken(state_dir: Path, name: str) -> None:
    """Raise :class:`TestbedError` when ``state_dir`` holds another test-bed, or when the test-bed ``name``
    or the one of ``state_dir`` is running; naming it and how to take it down."""
    state = read_state(state_dir)
    other = state.get("prefix") if state is not None else None
    if other not in (None, name):
        raise TestbedError(
            f"{state_dir} holds the test-bed {other!r}; take it down first ({down_command(str(other))} "
            f"--state-dir {state_dir}) or use another state dir"
        )
    parts = alive(state_dir, name)
    if parts:
        where = locate(name) or (state_dir if state is not None else None)
        at = f" (state dir {where})" if where else ""
        raise TestbedError(
            f"test-bed {name!r} is already running{at}: {'; '.join(parts)}. Take it down first with "
            f"`{down_command(name)}`, or choose another name (--name)"
        )


def refuse_foreign_links(name: str) -> None:
    """Raise :class:`TestbedError` when interfaces the test-bed ``name`` would create exist and are not a
    test-bed's (``vmbr0`` is Proxmox's bridge, not the one of a test-bed ``vm``)."""
    foreign = net.foreign_links(name)
    if foreign:
        raise TestbedError(
            f"interface(s) {', '.join(foreign)} already exist on this machine and were not made by a test-bed "
            f"named {name!r}: choose another name (--name), or remove them (ip link del DEV) if they are "
            "leftovers"
        )


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """One ``up`` at a time claims a name and a subnet on this machine (flock, released on exit or death)."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
