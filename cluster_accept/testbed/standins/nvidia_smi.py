"""Node-side ``nvidia-smi`` stand-in: answers from the node's data dir (captured outputs, faults applied).

Each simulated node's bin dir holds a tiny wrapper that calls :func:`main` with that node's data dir, so
``ssh node nvidia-smi ...`` prints exactly what a real node printed, with the node's faults. Everything
comes from files written at ``up`` (see :mod:`testbed.nodedata`); this module only selects, filters and
formats. Standard library only: it runs once per remote command and must start fast.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from cluster_accept.testbed import textops

DRIVER_FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
NO_DEVICES = "No devices were found\n"
HELP = (
    "NVIDIA System Management Interface -- v{version}\n\n"
    "Usage: nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...\n\n"
    "    -h,   --help                Print usage information and exit.\n"
    "    -L,   --list-gpus           Display a list of GPUs connected to the system.\n"
    "    -q,   --query               Display GPU or Unit info.\n"
    "    -i,   --id=                 Target a specific GPU.\n"
    "    -x,   --xml-format          Produce XML output.\n"
    "    -d,   --display=            Display only selected information: PERFORMANCE, CLOCK, ECC, ROW_REMAPPER,\n"
    "                                PAGE_RETIREMENT, POWER, COMPUTE (test-bed stand-in).\n"
    "    --query-gpu=                Information about GPU. Call --help-query-gpu for more info.\n"
    "    --format=                   csv, noheader, nounits.\n"
    "    nvlink                      -s, --status, -c, -e, -gt d|r [-i N] [-l L].\n"
    "    topo                        -m.\n"
)
DISPLAYS = {
    "PERFORMANCE": "q-performance.txt",
    "CLOCK": "q-clock.txt",
    "ECC": "q-ecc.txt",
    "ROW_REMAPPER": "q-row-remapper.txt",
    "PAGE_RETIREMENT": "q-page-retirement.txt",
    "POWER": "q-power.txt",
    "COMPUTE": "q-compute.txt",
}
QUERY_FILES = {
    "--query-remapped-rows": "query-remapped-rows.txt",
    "--query-retired-pages": "query-retired-pages.txt",
    "--query-compute-apps": "query-compute-apps.txt",
}
APP_ALIASES = {"used_memory": "used_gpu_memory"}  # a query name whose column nvidia-smi prints otherwise
VALUE_OPTIONS = {
    "-i": "id", "--id": "id", "-d": "display", "--display": "display", "--format": "format",
    "-l": "link", "--link": "link", "-gt": "throughput", "--getthroughput": "throughput",
    "--query-gpu": "query-gpu", **{k: k[2:] for k in QUERY_FILES},
}  # fmt: skip
FLAGS = {
    "-q": "query", "--query": "query", "-x": "xml", "--xml-format": "xml", "-L": "list", "--list-gpus": "list",
    "-h": "help", "--help": "help", "--help-query-gpu": "help-query-gpu", "--version": "version",
    "-s": "status", "-c": "capabilities", "--capabilities": "capabilities", "-e": "errors",
    "--error-counters": "errors", "-m": "matrix", "--matrix": "matrix",
}  # fmt: skip


class Exit(Exception):
    """Stop with ``text`` on stdout and exit ``code``."""

    def __init__(self, text: str, code: int):
        super().__init__(text)
        self.text, self.code = text, code


@dataclass
class Args:
    sub: str = ""
    flags: set[str] = field(default_factory=set)
    values: dict[str, str] = field(default_factory=dict)


def parse_args(argv: list[str]) -> Args:
    args = Args()
    rest = list(argv)
    if rest and rest[0] in ("nvlink", "topo"):
        args.sub = rest.pop(0)
    while rest:
        token = rest.pop(0)
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if args.sub == "nvlink" and name == "--status":
            args.flags.add("status-long")
        elif name in FLAGS and not eq:
            args.flags.add(FLAGS[name])
        elif name in VALUE_OPTIONS:
            if not eq:
                if not rest:
                    raise Exit(INVALID_ARGS, 2)
                value = rest.pop(0)
            args.values[VALUE_OPTIONS[name]] = value
        else:
            raise Exit(f"ERROR: Option {token} is not recognized. Please run 'nvidia-smi -h'.\n", 2)
    return args


class Node:
    """The node's data dir: served files and the ``--query-gpu`` field table.

    ``refused`` are ``--query-gpu`` names the simulated driver does not know (``behavior.json``'s
    ``refused_fields``): an older driver refuses ``clocks_event_reasons.active`` yet answers its older alias
    ``clocks_throttle_reasons.active``, so the names are refused as asked, not after alias resolution.
    """

    def __init__(
        self, data_dir: Path, refused: list[str] | None = None, loaded: dict[str, dict[str, str]] | None = None
    ):
        self.dir = data_dir
        self.refused = set(refused or ())
        self.loaded = loaded or {}  # GPU -> field answers while loaded (``behavior.json``'s ``under_load``)
        table = json.loads((data_dir / "fields.json").read_text(encoding="utf-8"))
        self.order: list[str] = table["order"]
        self.headers: dict[str, str] = table["headers"]
        self.values: dict[str, list[str]] = table["values"]
        self.aliases: dict[str, str] = table["aliases"]
        self.count = len(self.values[self.order[0]]) if self.order else 0

    def file(self, name: str) -> str:
        """A served file; while the GPUs are loaded, its ``-loaded`` variant where the node has one (the
        processes a co-tenant adds during the burn)."""
        loaded = self.dir / name.replace(".txt", "-loaded.txt")
        if self.loaded and loaded.exists():
            text = loaded.read_text(encoding="utf-8")
            return text + self._callers_workers() if name == "query-compute-apps.txt" else text
        return (self.dir / name).read_text(encoding="utf-8")

    def _callers_workers(self) -> str:
        """The burn's own worker processes as compute processes, one per GPU in start order: a real nvidia-smi
        lists them beside any other job's, which is how the burn knows the list shows PIDs at all."""
        parent, lines = os.getppid(), []
        try:
            command = Path(f"/proc/{parent}/cmdline").read_bytes()
        except OSError:
            return ""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
                forked = ppid == parent and (stat.parent / "cmdline").read_bytes() == command  # the workers
            except (OSError, ValueError, IndexError):
                continue
            if forked:
                lines.append(pid)
        return "".join(
            f"{self.values['uuid'][i % self.count]}, {pid}, python3, 1024 MiB\n" for i, pid in enumerate(sorted(lines))
        )

    def canonical(self, name: str) -> str | None:
        if name in self.refused:
            return None
        name = self.aliases.get(name, name)
        return name if name in self.headers else None

    def value(self, name: str, gpu: int) -> str:
        if name == "timestamp":
            return datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        return self.loaded.get(str(gpu), {}).get(name, self.values[name][gpu])

    def select(self, spec: str | None) -> list[int]:
        """``-i`` (index, UUID or PCI bus id; comma-separated) -> GPU indices, in the node's order."""
        if spec is None:
            return list(range(self.count))
        chosen: set[int] = set()
        for token in (t.strip() for t in spec.split(",")):
            for g in range(self.count):
                ids = {str(g), self.values.get("uuid", [""] * self.count)[g]}
                bus = self.values.get("pci.bus_id", [""] * self.count)[g].lower()
                if token in ids or (token and bus.endswith(token.lower())):
                    chosen.add(g)
                    break
            else:
                raise Exit(NO_DEVICES, 6)
        return sorted(chosen)

    def bus(self, gpu: int) -> str:
        return self.values["pci.bus_id"][gpu]


def _format(spec: str | None) -> tuple[bool, bool]:
    parts = {p.strip() for p in (spec or "").split(",") if p.strip()}
    if "csv" not in parts or parts - {"csv", "noheader", "nounits"}:
        raise Exit(INVALID_ARGS, 2)
    return "noheader" not in parts, "nounits" in parts


def _invalid_field(name: str) -> Exit:
    return Exit(f'Field "{name}" is not a valid field to query.\n\n', 2)


def query_gpu(node: Node, fields: str, fmt: str | None, gpus: list[int]) -> str:
    header, nounits = _format(fmt)
    names = [f.strip() for f in fields.split(",")]
    columns: list[str] = []
    for name in names:
        canonical = node.canonical(name) if name else None
        if canonical is None:
            raise _invalid_field(name)
        columns.append(canonical)
    units = [textops.without_unit(node.headers[c]) for c in columns]
    out: list[str] = []
    if header:
        out.append(", ".join(bare if nounits else node.headers[c] for c, (bare, _) in zip(columns, units, strict=True)))
    for g in gpus:
        cells = [node.value(c, g) for c in columns]
        if nounits:
            cells = [textops.strip_unit(v, u) for v, (_, u) in zip(cells, units, strict=True)]
        out.append(", ".join(cells))
    return "".join(line + "\n" for line in out)


def query_file(node: Node, name: str, fields: str, fmt: str | None, gpus: list[int]) -> str:
    """``--query-remapped-rows`` & co.: columns of the captured table, or GPU fields via the row's bus id."""
    header, nounits = _format(fmt)
    cells, rows = textops.csv_table(node.file(name))
    columns = {textops.without_unit(c)[0]: i for i, c in enumerate(cells)}
    buses = {node.bus(g).lower(): g for g in range(node.count)}
    wanted = {node.bus(g).lower() for g in gpus}
    bus_col = columns.get("gpu_bus_id")
    picks: list[tuple[str, int | str]] = []
    for f in (APP_ALIASES.get(f.strip(), f.strip()) for f in fields.split(",")):
        if f in columns:
            picks.append((cells[columns[f]], columns[f]))
        elif bus_col is not None and node.canonical(f) is not None:
            picks.append((f, node.canonical(f) or f))
        else:
            raise _invalid_field(f)
    out = [", ".join(textops.without_unit(h)[0] if nounits else h for h, _ in picks)] if header else []
    for row in rows:
        bus = row[bus_col].lower() if bus_col is not None else ""
        if bus_col is not None and bus not in wanted:
            continue
        line = []
        for head, pick in picks:
            value = row[pick] if isinstance(pick, int) else node.value(pick, buses[bus])
            line.append(textops.strip_unit(value, textops.without_unit(head)[1]) if nounits else value)
        out.append(", ".join(line))
    return "".join(line + "\n" for line in out)


def query_text(node: Node, displays: str | None, xml: bool, gpus: list[int]) -> str:
    keep = {node.bus(g) for g in gpus}
    if xml:
        return textops.xml_blocks(node.file("nvidia-smi-q-x.txt")).keep(lambda k: k in keep).join()
    if displays is None:
        return textops.q_blocks(node.file("nvidia-smi-q.txt")).keep(lambda k: k in keep).join()
    names = [d.strip().upper() for d in displays.split(",") if d.strip()]
    if not names or any(n not in DISPLAYS for n in names):
        raise Exit(INVALID_ARGS, 2)
    parts = [textops.q_blocks(node.file(DISPLAYS[n])).keep(lambda k: k in keep) for n in dict.fromkeys(names)]
    merged = parts[0]
    for part in parts[1:]:
        bodies = dict(part.blocks)
        merged = textops.Blocks(
            merged.head,
            [(k, t.rstrip("\n") + "\n" + bodies.get(k, "\n").split("\n", 1)[1]) for k, t in merged.blocks],
            merged.tail,
        )
    return merged.join()


def nvlink(node: Node, args: Args, gpus: list[int]) -> str:
    if "status" in args.flags or "status-long" in args.flags:
        name = "nvlink-status.txt" if "status-long" in args.flags else "nvlink-s.txt"
    elif "capabilities" in args.flags:
        name = "nvlink-c.txt"
    elif "errors" in args.flags:
        name = "nvlink-e.txt"
    elif args.values.get("throughput") in ("d", "r"):
        name = "nvlink-gt.txt" if args.values["throughput"] == "d" else "nvlink-gt-r.txt"
    else:
        raise Exit(INVALID_ARGS, 2)
    keep = {str(g) for g in gpus}
    blocks = textops.nvlink_blocks(node.file(name)).keep(lambda k: k in keep)
    link = args.values.get("link")
    if link is not None:
        kept = []
        for key, text in blocks.blocks:
            lines = text.splitlines(True)
            body: list[str] = []
            for x in lines[1:]:
                mine = x.strip().startswith((f"Link {link}:", f"Link {link},"))
                if mine or (not x.strip() and body and body[-1].strip()):
                    body.append(x)
            kept.append((key, lines[0] + "".join(body)))
        blocks = textops.Blocks(blocks.head, kept, blocks.tail)
    return blocks.join()


def version_text(node: Node) -> str:
    driver = node.values["driver_version"][0] if node.count else "N/A"
    cuda = "N/A"
    for part in node.file("nvidia-smi.txt").split("CUDA Version:")[1:2]:
        cuda = part.split()[0]
    return (
        f"NVIDIA-SMI version  : {driver}\nNVML version        : {driver.rsplit('.', 1)[0]}\n"
        f"DRIVER version      : {driver}\nCUDA Version        : {cuda}\n"
    )


def answer(node: Node, args: Args) -> str:
    """What ``nvidia-smi ARGS`` prints (exit 0), or raise :class:`Exit`."""
    if "help" in args.flags:
        return HELP.format(version=node.values["driver_version"][0] if node.count else "")
    if "help-query-gpu" in args.flags:
        return node.file("help-query-gpu.txt")
    if "version" in args.flags:
        return version_text(node)
    if node.count == 0:
        raise Exit(NO_DEVICES, 6)
    gpus = node.select(args.values.get("id"))
    if args.sub == "nvlink":
        return nvlink(node, args, gpus)
    if args.sub == "topo":
        if "matrix" not in args.flags:
            raise Exit(INVALID_ARGS, 2)
        return node.file("topo-m.txt")
    queries = [k for k in args.values if k == "query-gpu" or f"--{k}" in QUERY_FILES]
    if len(queries) > 1 or (queries and args.flags & {"query", "list"}):
        raise Exit(INVALID_ARGS, 2)
    if queries == ["query-gpu"]:
        return query_gpu(node, args.values["query-gpu"], args.values.get("format"), gpus)
    if queries:
        name = QUERY_FILES[f"--{queries[0]}"]
        return query_file(node, name, args.values[queries[0]], args.values.get("format"), gpus)
    if "list" in args.flags:
        keep = {f"GPU {g}: " for g in gpus}
        return "".join(x for x in node.file("nvidia-smi-L.txt").splitlines(True) if x.startswith(tuple(keep)))
    if "query" in args.flags:
        return query_text(node, args.values.get("display"), "xml" in args.flags, gpus)
    if args.flags or set(args.values) - {"id"}:
        raise Exit(INVALID_ARGS, 2)
    return textops.table_blocks(node.file("nvidia-smi.txt")).keep(lambda k: int(k) in gpus).join()


def _hang() -> int:
    """Sleep until whoever started us is gone (ssh session closed, timeout killed the parent)."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    return 1


def _garbage(seed: str) -> str:
    rng = random.Random(seed)
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 !#$%&()*+,-./:;<=>?@[]^_{|}~"
    return "".join("".join(rng.choice(chars) for _ in range(rng.randint(0, 90))) + "\n" for _ in range(24))


def called_by_burn() -> bool:
    """Whether the GPUs are under load: the caller is the burn probe, sampling while its workers load them."""
    try:
        return b"burn.py" in Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return False


def main(argv: list[str] | None = None, data_dir: str | Path | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(data_dir or os.environ.get("CLUSTER_ACCEPT_TESTBED_DATA", "."))
    behavior = json.loads((folder / "behavior.json").read_text(encoding="utf-8"))
    modes: list[str] = behavior.get("modes", [])
    if "nvidia_smi_hang" in modes:
        return _hang()
    if "nvidia_smi_fail" in modes:
        sys.stdout.write(DRIVER_FAILED)
        return 9
    try:
        loaded = behavior.get("under_load") if called_by_burn() else None
        text, code = answer(Node(folder, behavior.get("refused_fields"), loaded), parse_args(argv)), 0
    except Exit as stop:
        text, code = stop.text, stop.code
    if "garbage" in modes:
        text, code = _garbage(f"{behavior.get('seed', '')} {' '.join(argv)}"), 0
    if "truncated" in modes:  # cut mid-line, as when the tool dies while writing
        cut = len(text) // 2
        text = text[: cut - 1 if cut > 1 and text[cut - 1] == "\n" else cut]
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
