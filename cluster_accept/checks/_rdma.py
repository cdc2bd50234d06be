"""What the RDMA checks (``roce``, ``roce_qos``, ``efa``) share: how their commands read the NCCL setting a job
would see, and how their parsers read a hardware counter line. Not a check (discovery skips ``_`` modules)."""

from __future__ import annotations

import re
from collections.abc import Collection

from cluster_accept.checks._conf_files import CONF_READER

_COUNTER = re.compile(r"^C\|(?P<port>[\w.-]{1,64}/\d{1,3})\|(?P<name>\w{1,64})\|(?P<value>\d{1,20})$", re.ASCII)


def nccl_conf_setting(name: str) -> str:
    """Shell: ``$c`` set to ``name``'s value in ``~/.nccl.conf``, else ``/etc/nccl.conf`` (empty when neither sets
    it); the command then prefers the environment's, as NCCL does. Each file read as :mod:`._conf_files` reads a
    file a job's user can write."""
    files = '{ ca_conf "$HOME/.nccl.conf"; ca_conf /etc/nccl.conf; } 2>/dev/null'
    return CONF_READER + f'c=$({files} | sed -n "s/^{name}=//p" | head -n 1); '


def counter_line(line: str, names: Collection[str]) -> tuple[str, int] | None:
    """``C|mlx5_0/1|packet_seq_err|3`` -> (``mlx5_0/1.packet_seq_err``, 3); None for another line, or a counter
    not in ``names``."""
    match = _COUNTER.match(line)
    if match is None or match["name"] not in names:
        return None
    return f"{match['port']}.{match['name']}", int(match["value"])
