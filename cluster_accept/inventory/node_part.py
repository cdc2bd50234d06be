"""One node's part of a site inventory: what a node's own check (``check --local``) reads of a file that lists
every node of a large cluster.

A Slurm prolog runs before every job, so building and validating 50,000 entries to find one node's would cost
seconds each time. The file is read as YAML events instead (libyaml's parser where PyYAML has it; no objects are
built for the entries), and each entry of ``nodes`` is kept only when it names the wanted node, cut to that node
where it names others too (never where it gives an address, which a range of nodes cannot share); the file's
other blocks (defaults, profiles, exclude, slurm ...) are kept whole. What is kept is then loaded as a whole file
is (:func:`inventory.load.load_inventory`): the same validation, the same resolved node. The other entries are
not read, so their problems are the whole file's load to name (``inventory check``, a run), not this node's.

Where the events alone cannot tell what an entry names (an anchor or alias, a merge key, a ``hosts`` that is no
plain string or does not expand, labels that are not plain), nothing is chosen here and the whole file is loaded:
never a guess that could check the wrong node.
"""

from __future__ import annotations

import gc
import os
import re
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from yaml.nodes import ScalarNode

from cluster_accept.inventory.hostlist import MAX_NODES, HostlistError, expand
from cluster_accept.inventory.slurm_settings import NodeNameRule, SlurmSettings

# libyaml's parser where PyYAML was built with it (about 40 times faster than the pure-Python one)
_PARSER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR = "tag:yaml.org,2002:str"
# A plain node name (no range, no list): the one name ``expand`` gives for it, read without ClusterShell.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
_RESOLVER = yaml.resolver.Resolver()

Rule = NodeNameRule | None  # the inventory's slurm.node_names
Build = Callable[[list[Event]], Any]  # a document's events -> its value, constructed as the inventory loader does


@dataclass(frozen=True)
class WantedNode:
    """Which node a node's own check is, as ``check --local`` is told: an inventory name (``--node``), else
    Slurm's name for it (``SLURMD_NODENAME``, through the inventory's ``slurm.node_names``), else this host's
    short name. Exactly one is set."""

    name: str = ""
    slurm_name: str = ""
    host: str = ""

    @classmethod
    def for_check(cls, named: str | None, environ: Mapping[str, str] | None = None) -> WantedNode:
        """In the order ``flows.node_check.this_node`` looks for the node."""
        environ = os.environ if environ is None else environ
        if named:
            return cls(name=named)
        if environ.get("SLURMD_NODENAME"):
            return cls(slurm_name=environ["SLURMD_NODENAME"])
        return cls(host=socket.gethostname().split(".")[0])

    def is_it(self, name: str) -> bool:
        """Whether the node ``name`` is this one, by its inventory name (``--node``, the host's name)."""
        return name == (self.name or self.host)


def slurm_namer(rule: Rule, defaults: Mapping[str, str]) -> Callable[[str, Mapping[str, str]], str | None]:
    """Slurm's name of a node (its name, its entry's labels) as ``rule`` gives it (:meth:`NodeNameRule.name_for`,
    the defaults' labels under the entry's); None where the rule cannot name it (the whole file's load says so).
    A ``match`` rule is applied once per node of a large file: where the pattern's match from the start spans the
    name, ``re.sub`` gives the same name with its template compiled once, not once per node."""
    if rule is None:
        return lambda name, _labels: name
    if rule.label is not None:
        label = rule.label
        return lambda name, labels: labels.get(label, defaults.get(label, name))
    pattern, template = re.compile(str(rule.match)), str(rule.replace)

    def by_pattern(name: str, labels: Mapping[str, str]) -> str | None:
        head = pattern.match(name)
        if head is not None and head.end() == len(name):
            return pattern.sub(template, name, count=1)
        try:
            return rule.name_for(name, labels)
        except ValueError:
            return None

    return by_pattern


@dataclass
class _Entry:
    """What one ``nodes`` entry names, read from its events; ``events`` only where it is kept."""

    names: list[str]
    labels: dict[str, str]  # read only for Slurm's name
    address: bool  # the entry gives an address
    events: list[Event] | None = None
    hosts: ScalarEvent | None = None  # the event of ``hosts`` among ``events``

    def narrowed(self, names: list[str]) -> list[Event]:
        """The entry's events naming only ``names`` of its nodes (the others are not the wanted node's part);
        whole where it gives an address, which is one node's, so that one given for several stays a problem."""
        events, mark = self.events or [], self.hosts
        if len(names) == len(self.names) or self.address or mark is None:
            return events
        hosts = ScalarEvent(None, None, (False, True), ",".join(names), mark.start_mark, mark.end_mark, "'")
        return [hosts if event is mark else event for event in events]


@dataclass
class _Walk:
    """The file's events with ``nodes`` set aside: ``head`` up to the top-level mapping, each top-level key with
    its value's events (``nodes``: None, spliced back by :meth:`events`), ``tail``."""

    head: list[Event]
    blocks: list[tuple[ScalarEvent, list[Event] | None]] = field(default_factory=list)
    entries: list[_Entry] = field(default_factory=list)
    nodes_start: Event | None = None
    nodes_end: Event | None = None
    tail: list[Event] = field(default_factory=list)

    def block(self, key: str) -> list[Event] | None:
        """The events of the top-level ``key``'s value (the first, where it is given twice)."""
        return next((value for k, value in self.blocks if k.value == key and value is not None), None)

    def events(self, entries: Mapping[int, list[Event]]) -> list[Event]:
        """The file's events with ``entries`` (by their place in ``nodes``) as its only nodes."""
        out = list(self.head)
        for key, value in self.blocks:
            if value is None:
                kept = [e for i in sorted(entries) for e in entries[i]]
                value = [e for e in (self.nodes_start, *kept, self.nodes_end) if e is not None]
            out += [key, *value]
        return out + self.tail


def part_events(text: str, wanted: WantedNode, build: Build) -> list[Event] | None:
    """The events of ``text`` with only the ``nodes`` entries that name ``wanted``, each naming only it (or, by
    Slurm's name, every node the rule gives that name); None where that cannot be told from the events (the
    caller loads the whole file). ``build`` turns one document's events into its value (the ``slurm`` and
    ``defaults`` blocks, read for Slurm's name)."""
    if yaml.reader.Reader.NON_PRINTABLE.search(text):  # what PyYAML's own reader refuses: the whole load says so
        return None
    try:
        slurm, plain = wanted.slurm_name, wanted.name or wanted.host
        # kept on the first read: the entries naming the node; by Slurm's name, naming it as a node or in a label
        kept = (lambda e: slurm in e.names or slurm in e.labels.values()) if slurm else (lambda e: plain in e.names)
        walk = _walk(text, kept, labels=bool(slurm))
        if walk is None or not 2 <= sum(len(e.names) for e in walk.entries) <= MAX_NODES:
            return None  # one node is this one, however named; too many, the whole load refuses them
        named = slurm_namer(*_naming(walk, build)) if slurm else None
        picked = {}
        for i, entry in enumerate(walk.entries):
            if named is not None:
                names = [n for n in entry.names if named(n, entry.labels) == slurm]
            else:
                names = [n for n in entry.names if wanted.is_it(n)] if entry.events is not None else []
            if names:
                picked[i] = names
        entries = {i: walk.entries[i] for i in picked}
        again = {i for i, entry in entries.items() if entry.events is None}  # the rule named others: read again
        entries.update(_reread(text, again) if again else {})
        return walk.events({i: entry.narrowed(picked[i]) for i, entry in entries.items()})
    except (yaml.YAMLError, ValueError, TypeError, LookupError, AttributeError, RecursionError, _Unsure):
        return None  # ValidationError is a ValueError: the slurm block's own problem, named by the whole load


class _Unsure(Exception):
    """The events alone cannot tell what this part of the file names."""


def _naming(walk: _Walk, build: Build) -> tuple[NodeNameRule | None, dict[str, str]]:
    """The inventory's ``slurm.node_names`` rule and the defaults' labels (read only where both are plain)."""
    slurm, defaults = walk.block("slurm"), walk.block("defaults")
    rule = SlurmSettings.model_validate(build(_document(slurm))).node_names if slurm is not None else None
    given = build(_document(defaults)) if defaults is not None else {}
    labels = given.get("labels", {}) if isinstance(given, dict) else None
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in (*labels, *labels.values())):
        raise _Unsure
    return rule, labels


def _document(value: list[Event]) -> list[Event]:
    """One value's events as a document of its own."""
    return [StreamStartEvent(), DocumentStartEvent(), *value, DocumentEndEvent(), StreamEndEvent()]


@contextmanager
def _parsed(text: str) -> Iterator[Iterator[Event]]:
    """The events of ``text``. The collector pauses meanwhile: the events of an entry left out are freed as they
    go, and none of them is a cycle, yet each of the hundreds of passes it would make scans everything loaded."""
    parser = _PARSER(text)
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield iter(parser.get_event, None)  # get_event gives None past the stream's end
    finally:
        parser.dispose()
        if collecting:
            gc.enable()


def _walk(text: str, keep: Callable[[_Entry], bool], labels: bool = False) -> _Walk | None:
    """The file's top-level blocks, each ``nodes`` entry read (its events kept where ``keep`` says so, its labels
    where ``labels``)."""
    with _parsed(text) as events:
        return _walked(events, lambda first: _entry(first, events, keep, labels))


def _reread(text: str, wanted: set[int]) -> dict[int, _Entry]:
    """The ``nodes`` entries at the places ``wanted`` of a file :func:`_walk` read (so of known shape), read
    again with their events; the parse stops after the last of them, and skips the others whole."""
    found: dict[int, _Entry] = {}
    with _parsed(text) as events:
        for _ in range(3):  # the stream, the document, the top-level mapping
            next(events)
        for key in _until(events, MappingEndEvent, []):
            if isinstance(key, ScalarEvent) and key.value == "nodes":
                break
            _value(next(events), events)
        next(events)  # the sequence of entries
        for i, first in enumerate(_until(events, SequenceEndEvent, [])):
            if i in wanted:
                found[i] = _entry(first, events, lambda _entry: True, labels=False)
                if len(found) == len(wanted):
                    break
            else:
                _value(first, events)
    return found


def _walked(events: Iterator[Event], read: Callable[[Event], _Entry]) -> _Walk | None:
    head = [next(events), next(events), next(events)]
    kinds = (StreamStartEvent, DocumentStartEvent, MappingStartEvent)
    if not all(isinstance(e, kind) for e, kind in zip(head, kinds, strict=True)) or _marked(head[2]):
        return None
    walk = _Walk(head)
    for key in _until(events, MappingEndEvent, walk.tail):
        if not isinstance(key, ScalarEvent) or _marked(key):
            return None
        if key.value == "nodes" and walk.nodes_start is None:
            walk.nodes_start = next(events)
            if not isinstance(walk.nodes_start, SequenceStartEvent) or _marked(walk.nodes_start):
                return None
            walk.blocks.append((key, None))
            ended: list[Event] = []
            walk.entries = [read(e) for e in _until(events, SequenceEndEvent, ended)]
            walk.nodes_end = ended[0]
        else:
            walk.blocks.append((key, _value(next(events), events)))
    walk.tail += list(events)
    one_document = [type(e) for e in walk.tail] == [MappingEndEvent, DocumentEndEvent, StreamEndEvent]
    return walk if one_document and walk.nodes_start is not None else None


def _until(events: Iterator[Event], end: type[Event], ended: list[Event]) -> Iterator[Event]:
    """Each next event up to a collection's ``end`` (added to ``ended``): the caller reads each member whole."""
    for event in events:
        if isinstance(event, end):
            ended.append(event)
            return
        yield event


_STARTS = (MappingStartEvent, SequenceStartEvent)
_ENDS = (MappingEndEvent, SequenceEndEvent)


def _value(first: Event, events: Iterator[Event]) -> list[Event]:
    """One whole value's events: a scalar, an alias, or a collection to its end."""
    got, depth = [first], int(type(first) in _STARTS)
    while depth:
        event = next(events)
        got.append(event)
        kind = type(event)
        depth += 1 if kind in _STARTS else -1 if kind in _ENDS else 0
    return got


def _marked(event: Event) -> bool:
    """An anchor, an alias or a tag other than the plain one: what a top-level key means rests on more."""
    tag = getattr(event, "tag", None)
    return isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None or tag not in (None, "!")


def _entry(first: Event, events: Iterator[Event], keep: Callable[[_Entry], bool], labels: bool) -> _Entry:
    """One entry of ``nodes``: the names its ``hosts`` expands to, else :class:`_Unsure`. An anchor or alias
    elsewhere in it needs no look: an alias left without its anchor fails the load of the part, and the whole
    file is loaded."""
    if type(first) is not MappingStartEvent:
        raise _Unsure
    got: list[Event] = [first]
    fields: dict[str, list[Event]] = {}
    for key in _until(events, MappingEndEvent, got):
        if type(key) is not ScalarEvent or key.value == "<<" or key.value in fields or _marked(key):
            raise _Unsure
        value = _value(next(events), events)
        fields[key.value] = value
        got += [key, *value]
    hosts = _plain_str(fields.get("hosts", []))
    if hosts is None:
        raise _Unsure
    read = _labels(fields.get("labels")) if labels else {}
    entry = _Entry(_names(hosts.value), read, "address" in fields)
    if keep(entry):  # only a kept entry holds on to its events: the others' are freed as the parse goes
        entry.events, entry.hosts = got, hosts
    return entry


def _plain_str(value: list[Event]) -> ScalarEvent | None:
    """The scalar a value's events are, where it is one read as a string (not ``123``, ``true``)."""
    if len(value) != 1 or not isinstance(value[0], ScalarEvent):
        return None
    event = value[0]
    tag = event.tag if event.tag not in (None, "!") else _RESOLVER.resolve(ScalarNode, event.value, event.implicit)
    return event if tag == _STR else None


def _labels(value: list[Event] | None) -> dict[str, str]:
    """The labels an entry's events give, as written, where they are one flat mapping of scalars (else
    :class:`_Unsure`); a label that is no string is refused when the entry that names the node loads."""
    if value is None:
        return {}
    pairs = value[1:-1]
    if not isinstance(value[0], MappingStartEvent) or not all(type(e) is ScalarEvent for e in pairs):
        raise _Unsure
    read = {k.value: v.value for k, v in zip(pairs[::2], pairs[1::2], strict=True)}  # type: ignore[attr-defined]
    if len(read) * 2 != len(pairs):  # a key given twice
        raise _Unsure
    return read


def _names(hosts: str) -> list[str]:
    if _PLAIN_NAME.fullmatch(hosts):
        return [hosts]
    try:
        return expand(hosts)
    except HostlistError:
        raise _Unsure from None
