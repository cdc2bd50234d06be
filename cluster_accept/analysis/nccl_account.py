"""NCCL's own account of a run, read from its ``NCCL_DEBUG=INFO`` log: per rank, the channels each communicator
opened, the algorithm and protocol where NCCL logs them, every variable it says it took, its version and the
plug-ins it loaded. A slow collective has a mechanism NCCL states plainly (4 channels where a healthy node opens
24; ``NCCL_P2P_LEVEL set by environment to LOC``): these rows keep it beside the figure.

The lines read, as NCCL 2.18 to 2.28 print them (each after ``host:pid:tid [cudaDev] NCCL INFO``):

- ``ncclCommInitRankConfig comm 0x35fdc980 rank 0 nranks 4 … commId 0x2282f8d7b133764e - Init START`` and
  ``comm 0x35fdc980 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0``: the communicator a process's
  later lines belong to, its rank and its shape;
- ``24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer`` (before
  2.21 without ``collnet``); where a communicator has none, its ring lines ``Channel 00/24 : 0 1 2 3`` give the
  count of collective channels;
- ``AllReduce: 1073741824 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..23}`` (2.25+; before: ``Algo 1
  proto 2 time …``, numbered), printed by rank 0 with ``NCCL_DEBUG_SUBSYS`` holding ``TUNING``;
- ``NCCL_P2P_LEVEL set by environment to LOC`` and ``NCCL_NVLS_ENABLE set by environment to 0.``: NCCL prints these
  for a variable it took from the environment or from ``/etc/nccl.conf``, ``~/.nccl.conf`` or
  ``NCCL_CONF_FILE`` alike (it loads the files into its environment first);
- ``NCCL version 2.28.9+cuda13.0``;
- ``NET/Plugin: Could not find: libnccl-net.so`` (``No plugin found``, ``Using internal tuner plugin``: none),
  ``NET/Plugin: Loaded net plugin NCCL RDMA Plugin v8 (v8)``, ``TUNER/Plugin: Using <name> (v3)``,
  ``PROFILER/Plugin: Loaded <name> (v4)``, ``Successfully loaded external network plugin <lib>`` and ``Using
  network IB``.

Lines from one process and device (``host:pid`` and ``[cudaDev]``) are one rank's: proxy threads print
``[0]`` whatever their device, and none of what is read here. Pure; nothing here raises on odd input (a count
is read up to 9 digits).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.vocabulary.rows import NcclFact

CHANNELS, COMMUNICATOR, ALGORITHM, PROTOCOL = "channels", "communicator", "algorithm", "protocol"
SETTING, VERSION, PLUGIN = "setting", "version", "plugin"
PER_COMMUNICATOR = frozenset({CHANNELS, COMMUNICATOR, ALGORITHM, PROTOCOL})  # the others hold per process
NONE = "none"  # a plug-in NCCL looked for and did not find: it used its own
ALGORITHMS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")  # NCCL's numbering
PROTOCOLS = ("LL", "LL128", "SIMPLE")

_LINE = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] NCCL INFO (?P<msg>.*)")
_INIT = re.compile(r"^\w+ comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d{1,9}) nranks \d+\b.*- Init START")
_COMM_ID = re.compile(r"\bcommId (0x[0-9a-fA-F]+)")
_SHAPE = re.compile(
    r"^comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d{1,9}) nRanks (?P<nranks>\d{1,9}) nNodes (?P<nnodes>\d{1,9}) "
    r"localRanks (?P<local>\d{1,9})\b"
)
_CHANNEL_COUNTS = re.compile(r"^\d+ coll channels")
_CHANNEL_COUNT = re.compile(r"(?<!\d)(\d{1,9}) ([a-z0-9]+(?: [a-z0-9]+)*?) channels( per peer)?")
_RING = re.compile(r"^Channel \d+/(?P<count>\d{1,9}) :(?:\s+\d+)+\s*$")
_TUNING = re.compile(r"^(?:(?P<func>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)")
_SET = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*?)\.?\s*$")
_VERSION = re.compile(r"^NCCL version (\S+)")
_NOT_FOUND = re.compile(
    r"^(?P<kind>NET|TUNER|PROFILER|ENV|GIN|RMA)/Plugin ?: ?(?:Could not find|No plugin found|.*\busing internal"
    r"|Using internal|.*\busing default)",
    re.IGNORECASE,
)
_PLUGIN_LOADED = (  # (pattern, plug-in name or None: the pattern's ``what`` group names it)
    (re.compile(r"^(?:NET|GIN|RMA)/Plugin ?: ?Loaded (?P<what>\w+) plugin (?P<name>.+?)(?: \(v\d+\))?\s*$"), None),
    (re.compile(r"^TUNER/Plugin: Using (?:tuner plugin )?(?P<name>.+?)(?: \(v\d+\))?\s*$"), "tuner"),
    (re.compile(r"^PROFILER/Plugin: [Ll]oaded (?P<name>.+?)(?: \(v\d+\))?\.?\s*$"), "profiler"),
    (re.compile(r"^ENV/Plugin: Using (?P<name>.+?)(?: \(v\d+\))?\s*$"), "env"),
    (re.compile(r"^Successfully loaded external (?P<what>\w+) plugin (?P<name>.+?)\s*$"), None),
    (re.compile(r"^Using network (?P<name>.+?)\s*$"), "network"),
)
_PLUGIN_NAMES = {"coll": "collnet", "network": "net"}  # the pattern's ``what`` -> the plug-in's kind


@dataclass(frozen=True)
class NcclRun:
    """Where a log came from: the run, the stage, the node, which probe (or multi-node job) and, between nodes,
    the group of nodes it ran on."""

    run_id: str
    cluster: str
    stage: str
    node: str
    probe: str
    group: str | None = None


_Stream = tuple[str, str, str]  # (host, pid, cudaDev): one rank's lines


@dataclass
class _Reading:
    """What the log said so far, per stream: the communicator its lines belong to, each communicator's rank,
    and the facts, one per (stream, communicator, kind, name), in the order NCCL first said them."""

    current: dict[_Stream | None, str] = field(default_factory=dict)  # stream -> communicator
    comm_ids: dict[tuple[_Stream | None, str], str] = field(default_factory=dict)  # (stream, address) -> commId
    ranks: dict[tuple[_Stream | None, str], int] = field(default_factory=dict)  # (stream, communicator) -> rank
    rings: dict[tuple[_Stream | None, str], str] = field(default_factory=dict)
    facts: dict[tuple[_Stream | None, str | None, str, str], str] = field(default_factory=dict)

    def communicator(self, stream: _Stream | None, address: str, rank: int) -> None:
        comm = self.comm_ids.get((stream, address), address)
        self.current[stream] = comm
        self.ranks.setdefault((stream, comm), rank)

    def add(self, stream: _Stream | None, kind: str, name: str, value: str) -> None:
        comm = self.current.get(stream) if kind in PER_COMMUNICATOR else None
        if kind in PER_COMMUNICATOR and comm is None:
            return  # a communicator's line before any communicator was named: whose it is is unknown
        key = (stream, comm, kind, name)
        if kind == PLUGIN and value == NONE and self.facts.get(key, NONE) != NONE:
            return  # the plug-in NCCL loaded after not finding another name stands
        self.facts[key] = value


def read_account(text: str, run: NcclRun) -> list[NcclFact]:
    """Every fact of NCCL's account in ``text`` (one node's output of one run, masked where it entered the
    controller: a secret-looking variable's value too), per rank. Empty when NCCL logged nothing at INFO."""
    reading = _Reading()
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        match = _LINE.search(line)
        stream = (match["host"], match["pid"], match["dev"]) if match else None
        message = match["msg"] if match else line.split("NCCL INFO", 1)[1].strip()
        _read_line(reading, stream, message.rstrip())
    for (stream, comm), count in reading.rings.items():
        reading.facts.setdefault((stream, comm, CHANNELS, "coll"), count)
    return _facts(reading, run)


def _read_line(reading: _Reading, stream: _Stream | None, message: str) -> None:
    """One INFO line's part of the account (most lines have none)."""
    if (init := _INIT.match(message)) is not None:
        comm_id = _COMM_ID.search(message)
        if comm_id is not None:
            reading.comm_ids[(stream, init["ptr"])] = comm_id.group(1)
        reading.communicator(stream, init["ptr"], int(init["rank"]))
    elif (shape := _SHAPE.match(message)) is not None:
        reading.communicator(stream, shape["ptr"], int(shape["rank"]))
        for name, value in (("nranks", shape["nranks"]), ("nnodes", shape["nnodes"]), ("local_ranks", shape["local"])):
            reading.add(stream, COMMUNICATOR, name, value)
    elif _CHANNEL_COUNTS.match(message):
        for count, what, per_peer in _CHANNEL_COUNT.findall(message):
            reading.add(stream, CHANNELS, what.replace(" ", "_") + ("_per_peer" if per_peer else ""), count)
    elif (ring := _RING.match(message)) is not None:
        comm = reading.current.get(stream)
        if comm is not None:
            reading.rings[(stream, comm)] = str(int(ring["count"]))  # ``Channel 00/02`` in older versions
    elif (tuning := _TUNING.match(message)) is not None:
        name = f"{tuning['func'] or 'collective'} {tuning['bytes']}"
        reading.add(stream, ALGORITHM, name, _named(tuning["algo"], ALGORITHMS))
        reading.add(stream, PROTOCOL, name, _named(tuning["proto"], PROTOCOLS))
    elif (setting := _SET.match(message)) is not None:
        _read_setting(reading, stream, setting["name"], setting["value"])
    elif (version := _VERSION.match(message)) is not None:
        reading.add(stream, VERSION, "nccl", version.group(1))
    else:
        plugin = _plugin(message)
        if plugin is not None:
            reading.add(stream, PLUGIN, *plugin)


def _read_setting(reading: _Reading, stream: _Stream | None, name: str, value: str) -> None:
    """A variable NCCL took (masked where the log entered the controller when its name is secret-looking);
    ``NCCL_ALGO`` and ``NCCL_PROTO`` also as the algorithm and protocol NCCL was held to."""
    reading.add(stream, SETTING, name, value)
    if name in ("NCCL_ALGO", "NCCL_PROTO"):
        kind = ALGORITHM if name == "NCCL_ALGO" else PROTOCOL
        reading.facts[(stream, None, kind, name)] = value  # the whole process's, whichever communicator it read


def _named(value: str, names: tuple[str, ...]) -> str:
    """NCCL's name of an algorithm or protocol it printed as a number (before 2.25)."""
    return names[int(value)] if value.isdigit() and len(value) < 3 and int(value) < len(names) else value


def _plugin(message: str) -> tuple[str, str] | None:
    """(plug-in kind, what NCCL loaded or ``none``) of a plug-in line; None for any other line."""
    if (missing := _NOT_FOUND.match(message)) is not None:
        return missing["kind"].lower(), NONE
    for pattern, kind in _PLUGIN_LOADED:
        if (loaded := pattern.match(message)) is not None:
            what = kind or _PLUGIN_NAMES.get(loaded["what"].lower(), loaded["what"].lower())
            return what, loaded["name"]
    return None


def _facts(reading: _Reading, run: NcclRun) -> list[NcclFact]:
    """The typed rows, each with its rank: a communicator's for its lines; for what holds per process, the rank of
    the stream's first communicator, else of its process when that process had one rank only."""
    by_process: dict[tuple[str, str], set[int]] = {}
    first: dict[_Stream | None, int] = {}
    for (stream, _), held in reading.ranks.items():
        first.setdefault(stream, held)
        if stream is not None:
            by_process.setdefault(stream[:2], set()).add(held)
    found = []
    for (stream, comm, kind, name), value in reading.facts.items():
        rank: int | None
        if comm is not None:
            rank = reading.ranks.get((stream, comm))
        else:
            alone = by_process.get(stream[:2], set()) if stream is not None else set()
            rank = first.get(stream, next(iter(alone)) if len(alone) == 1 else None)
        where = (run.run_id, run.cluster, run.stage, run.node, run.probe)
        found.append(NcclFact(*where, kind, name, value, run.group, rank, comm))
    return found


def facts_of(records: Iterable[NcclFact | Mapping[str, Any]]) -> list[NcclFact]:
    """Typed facts from rows as a run's state or ``nccl.parquet`` holds them."""
    return [r if isinstance(r, NcclFact) else NcclFact.from_record(r) for r in records]
