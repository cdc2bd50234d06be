"""Arming a running training job without touching its code: which environment variables each node's tasks need
so that PyTorch and NCCL keep the signals the watcher reads over SSH, and which signals a node cannot give, and why.

The job is armed through its environment only (a Slurm TaskProlog, ``srun --export`` or a pod's ``env``): the
names and the versions that read them are in ``docs/watch-signals.md``, each with the source it was read from.
Where the node's torch version is not known, both names of a renamed variable are set; a version that does not
read a variable ignores it. Every signal gets a :class:`SignalCoverage` row, armed or not, with the reason: the
watcher never stays silent about a signal it could not have.

Values are rendered into shell scripts, command lines and YAML, so every path must match a conservative
character set (letters, digits, ``_ . + - /``, absolute, no ``..``): anything else is refused with a
``ValueError`` rather than quoted, so that no value can carry shell syntax. A value may hold :data:`JOB_TOKEN`,
replaced by ``${SLURM_JOB_ID}`` in a TaskProlog (expanded by the prolog's shell) or by the job id given to
the other renderers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cluster_accept.watch.words import Signal, SignalCoverage

JOB_TOKEN = "{job}"
_PATH = re.compile(r"/[A-Za-z0-9_.+/-]*")
_JOB = re.compile(r"[A-Za-z0-9_.-]+")  # as the shim names the job's directory
_PYTHONPATH = "PYTHONPATH"

Version = tuple[int, int, int]

# Since which release each thing exists; docs/watch-signals.md gives the source of every line.
TORCH_FLIGHT_RECORDER: Version = (2, 2, 0)  # TORCH_NCCL_TRACE_BUFFER_SIZE, ProcessGroupNCCL only
TORCH_WORKER_SERVER: Version = (2, 4, 0)  # _WorkerServer; Flight Recorder as pickle only (dump_nccl_trace_pickle)
TORCH_FR_JSON_NCCL: Version = (2, 5, 0)  # handler dump_nccl_trace_json
TORCH_FR_RENAMED: Version = (2, 8, 0)  # TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE; Gloo recorded too
TORCH_FR_JSON_ANY: Version = (2, 10, 0)  # handler fr_trace_json, every backend
NCCL_RAS: Version = (2, 24, 0)
NCCL_RAS_JSON: Version = (2, 28, 7)
NCCL_RAS_JSON_FIXED: Version = (2, 29, 2)  # 2.28.7 and 2.28.9 omit a comma in each missing rank
NCCL_INSPECTOR: Version = (2, 28, 0)  # the plugin speaks profiler API v5 only
NCCL_INSPECTOR_NEW_HOME: Version = (2, 29, 7)  # ext-profiler/inspector moved to plugins/profiler/inspector
NCCL_DIAGNOSTICS: Version = (2, 31, 0)  # NCCL_RUN_RAS_DIAGNOSTICS, NCCL_RUN_DIAGNOSTICS; RAS's DIAGNOSTICS command
NEWEST: Version = (999, 0, 0)  # a version that was given but not understood is armed as the newest


@dataclass(frozen=True)
class NodeVersions:
    """What a node's job environment has: as its Python reports torch and NCCL (``None``: not there)."""

    node: str
    torch: str | None
    nccl: str | None
    inspector_plugin: str | None  # path of a built libnccl-profiler-inspector.so on the node
    compiler: bool  # the node can build the Inspector plugin itself


@dataclass(frozen=True)
class ArmSettings:
    """Where the job's signals go on each node, and how much of them to keep."""

    watch_dir: str  # on every node; per job, files go under <watch_dir>/<job>/
    shim_dir: str  # holds sitecustomize.py, which starts torch's worker server in every rank
    fr_buffer_entries: int = 2000  # Flight Recorder ring buffer, collectives per rank
    inspector_dump_interval_s: float = 5.0
    nccl_timing: bool = True  # TORCH_NCCL_ENABLE_TIMING: each collective's own GPU time
    dump_on_timeout: bool = True  # the Flight Recorder written to <watch_dir>/<job>/ on a watchdog timeout
    inspector_verbose: bool = True  # per-record enqueue and kernel times: a rank's arrival order needs them
    ras_port: int | None = None  # NCCL_RAS_ADDR=localhost:<port>; None keeps NCCL's 28028
    nccl_diagnostics: bool = False  # NCCL's own checks at each communicator's creation (2.31 on), off by default


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str  # may hold JOB_TOKEN
    signal: str  # the Signal value it serves


@dataclass(frozen=True)
class ArmPlan:
    """One node's arming: the variables in the order they are set, the directories that must exist before a
    rank starts, the Flight Recorder handler its worker server answers, and a coverage row for every signal."""

    node: str
    env: tuple[EnvVar, ...]
    directories: tuple[str, ...]
    coverage: tuple[SignalCoverage, ...]
    fr_handler: str | None = None  # 'fr_trace_json' or 'dump_nccl_trace_json'; None: no JSON over the socket

    def names(self) -> list[str]:
        return [var.name for var in self.env]


def parse_version(text: str | None) -> Version | None:
    """``'2.13.0+cpu'`` -> (2, 13, 0); ``'2.21.5'``; ``'(2, 28, 7)'``; None when absent; :data:`NEWEST` when
    given but not understood (arming then sets every name a newer release could read)."""
    if text is None or not text.strip():
        return None
    found = re.search(r"(\d+)\s*[.,]\s*(\d+)(?:\s*[.,]\s*(\d+))?", text)
    if found is None:
        return NEWEST
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def show(version: Version) -> str:
    return "a version not understood" if version == NEWEST else f"{version[0]}.{version[1]}.{version[2]}"


def _short(version: Version) -> str:
    return "an unknown version" if version == NEWEST else f"{version[0]}.{version[1]}"


def safe_path(path: str, what: str) -> str:
    """An absolute path of letters, digits and ``_ . + - /``, without a ``..`` part (trailing ``/`` dropped)."""
    if not _PATH.fullmatch(path) or ".." in path.split("/") or path.rstrip("/") == "":
        raise ValueError(
            f"{what} {path!r} is refused: only absolute paths of letters, digits and _ . + - / are accepted "
            "(no spaces, quotes, $ or ..), so that it can be written into a shell script unquoted"
        )
    return path.rstrip("/")


def safe_job(job: str) -> str:
    """A job's name as every renderer writes it, unquoted, into shell text, a command line or YAML, and as its
    directory's name: letters, digits and ``_ . -``, not ``.`` or ``..``. Anything else is refused, never
    quoted, so that no output can carry shell syntax (``$(…)``, a backtick, a ``;``, a quote, a line break
    that starts another assignment) nor name a directory outside the watch directory."""
    if not _JOB.fullmatch(job) or job in (".", ".."):
        raise ValueError(
            f"job id {job!r} is refused: only letters, digits and _ . - are accepted (not . or ..), "
            "as it is written unquoted into what arm prints and names the job's directory"
        )
    return job


def _check_settings(settings: ArmSettings) -> None:
    safe_path(settings.watch_dir, "watch_dir")
    safe_path(settings.shim_dir, "shim_dir")
    if settings.fr_buffer_entries < 0:
        raise ValueError(f"fr_buffer_entries must be 0 or more, not {settings.fr_buffer_entries}")
    if not settings.inspector_dump_interval_s > 0:
        raise ValueError(f"inspector_dump_interval_s must be above 0, not {settings.inspector_dump_interval_s}")
    if settings.ras_port is not None and not 0 < settings.ras_port < 65536:
        raise ValueError(f"ras_port must be a TCP port, not {settings.ras_port}")


@dataclass(frozen=True)
class _Node:
    """One node's versions, read once, and the settings: what every signal's arming looks at."""

    versions: NodeVersions
    settings: ArmSettings
    torch: Version | None
    nccl: Version | None

    @property
    def job_dir(self) -> str:
        return f"{self.settings.watch_dir.rstrip('/')}/{JOB_TOKEN}"


# One signal's arming: the variables it sets and its coverage detail; no variable when the signal is unavailable.
_Armed = tuple[list[EnvVar], bool, str]


def _flight_recorder(n: _Node) -> _Armed:
    if n.torch is None:
        return [], False, "no torch in the job's Python on this node"
    if n.torch < TORCH_FLIGHT_RECORDER:
        return [], False, f"torch {_short(n.torch)} has no Flight Recorder (it came in 2.2)"
    if n.nccl is None and n.torch < TORCH_FR_RENAMED:
        return [], False, f"torch {_short(n.torch)} records only NCCL collectives (Gloo since 2.8) and there is no NCCL"
    if n.settings.fr_buffer_entries == 0:
        return [], False, "not armed: fr_buffer_entries is 0"
    size = str(n.settings.fr_buffer_entries)
    fr = Signal.FLIGHT_RECORDER.value
    # ProcessGroupNCCL still reads the old name for its own buffer size (dump on timeout) after the rename.
    env = [EnvVar("TORCH_NCCL_TRACE_BUFFER_SIZE", size, fr)]
    if n.torch >= TORCH_FR_RENAMED:
        env.insert(0, EnvVar("TORCH_FR_BUFFER_SIZE", size, fr))
    if n.nccl is not None and n.settings.dump_on_timeout:
        prefix = f"{n.job_dir}/fr_rank_"
        env.append(EnvVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", fr))
        if n.torch >= TORCH_FR_RENAMED:
            env.append(EnvVar("TORCH_FR_DUMP_TEMP_FILE", prefix, fr))
        env.append(EnvVar("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix, fr))
    if n.torch >= TORCH_WORKER_SERVER:
        return env, True, f"armed: {size} entries per rank, read over the worker server"
    if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in {var.name for var in env}:
        return [], False, f"torch {_short(n.torch)} has no worker server and dump_on_timeout is off: nothing reads it"
    return env, True, f"armed: {size} entries per rank, dumped only on a watchdog timeout"


def _worker_server(n: _Node) -> tuple[_Armed, str | None]:
    if n.torch is None:
        return ([], False, "no torch in the job's Python on this node"), None
    if n.torch < TORCH_FLIGHT_RECORDER:
        return ([], False, f"torch {_short(n.torch)} has no worker server and no Flight Recorder"), None
    if n.torch < TORCH_WORKER_SERVER:
        detail = f"torch {_short(n.torch)} has no worker server: Flight Recorder only dumped on timeout"
        return ([], False, detail), None
    if n.torch < TORCH_FR_JSON_NCCL:
        detail = f"torch {_short(n.torch)}'s worker server gives the Flight Recorder only as a pickle"
        return ([], False, detail), None
    if n.torch >= TORCH_FR_JSON_ANY:
        handler = "fr_trace_json"
    elif n.nccl is not None:
        handler = "dump_nccl_trace_json"
    else:
        detail = f"torch {_short(n.torch)} serves the Flight Recorder as JSON for NCCL only (every backend from 2.10)"
        return ([], False, detail), None
    env = [EnvVar(_PYTHONPATH, safe_path(n.settings.shim_dir, "shim_dir"), Signal.WORKER_SERVER.value)]
    return (env, True, f"armed: the shim starts torch's worker server in every rank; handler {handler}"), handler


UNTIMED = (
    "not armed (nccl_timing off): a slow GPU is not seen, only a slow host; the timing's cost on step time is in "
    "docs/watch-signals.md"
)


def _nccl_timing(n: _Node) -> _Armed:
    if n.torch is None:
        return [], False, "no torch in the job's Python on this node"
    if n.nccl is None:
        return [], False, "no NCCL on this node: only NCCL collectives are timed"
    if n.torch < TORCH_FLIGHT_RECORDER:
        return [], False, f"torch {_short(n.torch)} has no Flight Recorder to carry the timing (it came in 2.2)"
    if not n.settings.nccl_timing:
        return [], False, UNTIMED
    return [EnvVar("TORCH_NCCL_ENABLE_TIMING", "1", Signal.NCCL_TIMING.value)], True, "armed: TORCH_NCCL_ENABLE_TIMING"


def _ras(n: _Node) -> _Armed:
    if n.nccl is None:
        return [], False, "no NCCL on this node"
    if n.nccl < NCCL_RAS:
        return [], False, f"NCCL {_short(n.nccl)} has no RAS (it came in 2.24)"
    env = [EnvVar("NCCL_RAS_ENABLE", "1", Signal.RAS.value)]
    port = n.settings.ras_port or 28028
    if n.settings.ras_port is not None:
        env.append(EnvVar("NCCL_RAS_ADDR", f"localhost:{port}", Signal.RAS.value))
    if n.nccl < NCCL_RAS_JSON:
        form = "text status (JSON from 2.28.7)"
    elif n.nccl < NCCL_RAS_JSON_FIXED:
        form = "JSON status (missing ranks' JSON lacks a comma before 2.29.2: repaired when read)"
    else:
        form = "JSON status"
    return env, True, f"armed: port {port}, {form}"


def _diagnostics(n: _Node) -> _Armed:
    """NCCL's checks at each communicator's creation: RAS's (the ranks' GPU, driver, ECC, NVLink and ``NCCL_*``
    settings compared) and the active ones (P2P between every GPU pair, network bandwidth between ranks). Off by
    default: the active ones move data at start-up; their report is printed to the job's own output (rank 0's
    process), which the watch does not read. RAS's diagnostics the watch asks on demand, armed or not."""
    if not n.settings.nccl_diagnostics:
        return [], False, "off (arm --nccl-diagnostics): the watch asks RAS's diagnostics on demand where NCCL has them"
    if n.nccl is None:
        return [], False, "no NCCL on this node"
    if n.nccl < NCCL_DIAGNOSTICS:
        return [], False, f"NCCL {_short(n.nccl)} has no diagnostics (they came in 2.31)"
    sig = Signal.NCCL_DIAGNOSTICS.value
    env = [EnvVar("NCCL_RUN_RAS_DIAGNOSTICS", "1", sig), EnvVar("NCCL_RUN_DIAGNOSTICS", "1", sig)]
    return env, True, "armed: RAS's and the active checks at each communicator's creation, in the job's output"


def _inspector(n: _Node) -> _Armed:
    if n.nccl is None:
        return [], False, "no NCCL on this node"
    if n.nccl < NCCL_INSPECTOR:
        return [], False, f"NCCL {_short(n.nccl)} has no Inspector (its profiler API v5 came in 2.28)"
    plugin = n.versions.inspector_plugin
    if plugin is None:
        if not n.versions.compiler:
            return [], False, "no Inspector build named and no compiler on the node"
        home = "plugins/profiler/inspector" if n.nccl >= NCCL_INSPECTOR_NEW_HOME else "ext-profiler/inspector"
        return [], False, f"no Inspector build named; the node can build one from NCCL {_short(n.nccl)}'s {home}"
    s, sig = n.settings, Signal.INSPECTOR.value
    interval_us = str(max(1, round(s.inspector_dump_interval_s * 1_000_000)))
    env = [
        EnvVar("NCCL_PROFILER_PLUGIN", safe_path(plugin, "inspector_plugin"), sig),
        EnvVar("NCCL_INSPECTOR_ENABLE", "1", sig),
        EnvVar("NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS", interval_us, sig),
        EnvVar("NCCL_INSPECTOR_DUMP_DIR", f"{n.job_dir}/inspector", sig),
    ]
    if s.inspector_verbose:
        env.append(EnvVar("NCCL_INSPECTOR_DUMP_VERBOSE", "1", sig))
    return env, True, f"armed: JSON lines every {s.inspector_dump_interval_s:g} s"


def arm_node(versions: NodeVersions, settings: ArmSettings, job: str = "") -> ArmPlan:
    """One node's plan; ``job`` only names the coverage rows (the variables carry :data:`JOB_TOKEN`)."""
    _check_settings(settings)
    n = _Node(versions, settings, parse_version(versions.torch), parse_version(versions.nccl))
    server, handler = _worker_server(n)
    armed = {
        Signal.FLIGHT_RECORDER: _flight_recorder(n),
        Signal.WORKER_SERVER: server,
        Signal.NCCL_TIMING: _nccl_timing(n),
        Signal.INSPECTOR: _inspector(n),
        Signal.RAS: _ras(n),
        Signal.NCCL_DIAGNOSTICS: _diagnostics(n),
    }
    env = [
        EnvVar("CA_WATCH_DIR", settings.watch_dir.rstrip("/"), ""),
        EnvVar("CA_WATCH_JOB", JOB_TOKEN, ""),
    ]
    for signal in Signal:
        env.extend(armed[signal][0])
    directories = [n.job_dir]
    if armed[Signal.INSPECTOR][1]:
        directories.append(f"{n.job_dir}/inspector")  # NCCL makes only the last level of its dump directory
    coverage = tuple(
        SignalCoverage(job=job, node=versions.node, signal=s.value, available=armed[s][1], detail=armed[s][2])
        for s in Signal
    )
    return ArmPlan(versions.node, tuple(env), tuple(directories), coverage, handler)


def arm(nodes: Sequence[NodeVersions], settings: ArmSettings, job: str = "") -> list[ArmPlan]:
    """Every node's plan: nodes of one job may differ (a node with another image, or without the plugin)."""
    return [arm_node(versions, settings, job) for versions in nodes]


# Renderers ---------------------------------------------------------------------------------------------------


def _checked(plan: ArmPlan) -> None:
    """Every value once more, so that a plan built by hand cannot carry shell syntax into a renderer."""
    for var in plan.env:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", var.name):
            raise ValueError(f"variable name {var.name!r} is refused")
        plain = var.value.replace(JOB_TOKEN, "job")
        if not re.fullmatch(r"[A-Za-z0-9_.+/:-]+", plain) or ".." in plain.split("/"):
            raise ValueError(f"value {var.value!r} of {var.name} is refused: only letters, digits and _ . + - / :")
    for directory in plan.directories:
        safe_path(directory.replace(JOB_TOKEN, "job"), "directory")


def taskprolog_script(plan: ArmPlan) -> str:
    """A Slurm TaskProlog (``TaskProlog=`` in slurm.conf, or ``srun --task-prolog=``) for the plan's node.

    slurmstepd sets a task's variable for each ``export NAME=value`` line the prolog prints (it does not unquote,
    so the printed line carries no quotes). The job's id is the task's ``$SLURM_JOB_ID``, expanded by this
    script's shell; a job without one, or with an unexpected one, is left unarmed. ``PYTHONPATH`` keeps the
    task's own value after the shim's directory. The directories are made here, before any rank starts, as the
    job's user: the job's directory is ``<job>`` under the watch directory when this user made it (never one
    another user prepared, nor a link), else ``<job>.<uid>``, as the shim chooses; with neither, the task is
    left unarmed and told why (a ``print`` line). The watch directory itself is root's to make (mode 1777):
    a user who made it could replace every other user's job directory in it."""
    _checked(plan)
    job = "${SLURM_JOB_ID}"
    lines = [
        "#!/bin/sh",
        f"# cluster-accept watch: arms the tasks of a job on {_comment(plan.node)} through their environment.",
        'case "${SLURM_JOB_ID:-}" in',
        "  ''|*[!A-Za-z0-9_.-]*) exit 0 ;;",
        "esac",
    ]
    homes = [d for d in plan.directories if d.endswith("/" + JOB_TOKEN)]
    directories = list(plan.directories)
    if homes:
        home = homes[0].replace(JOB_TOKEN, "${dir}")
        directories.remove(homes[0])
        base = homes[0][: -len(JOB_TOKEN) - 1]
        said = f"not armed: no directory of this user for the job in {base} (it must be root's, mode 1777)"
        lines += [
            "umask 077",
            'own() { mkdir "$1" 2>/dev/null; [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && chmod go-w "$1"; }',
            f'dir="{job}"',
            f'own "{home}" || {{ dir="{job}.$(id -u)"; own "{home}"; }} || {{',
            f'  echo "print cluster-accept watch: {said}"',
            "  exit 0",
            "}",
        ]
        job = "${dir}"
    for directory in directories:
        lines.append(f'mkdir "{directory.replace(JOB_TOKEN, job)}" 2>/dev/null')
    for var in plan.env:
        value = "${SLURM_JOB_ID}" if var.value == JOB_TOKEN else var.value.replace(JOB_TOKEN, job)
        if var.name == _PYTHONPATH:
            value += "${PYTHONPATH:+:${PYTHONPATH}}"
        lines.append(f'echo "export {var.name}={value}"')
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+:-]", "_", text)


def srun_export(plan: ArmPlan, job: str) -> str:
    """One ``srun`` argument, double-quoted for the shell that runs srun: ``"--export=ALL,NAME=value,..."``.
    ``PYTHONPATH`` keeps the caller's value after the shim's directory (expanded by that shell)."""
    _checked(plan)
    job = safe_job(job)
    parts = ["ALL"]
    for var in plan.env:
        value = var.value.replace(JOB_TOKEN, job)
        if var.name == _PYTHONPATH:
            value += "${PYTHONPATH:+:${PYTHONPATH}}"
        parts.append(f"{var.name}={value}")
    return '"--export=' + ",".join(parts) + '"'


def env_lines(plan: ArmPlan, job: str) -> str:
    """``NAME=value`` lines, to paste or to source (``set -a; . FILE``): every value of the plan checked
    (:func:`_checked`) and the job's name held to :func:`safe_job`, so that no line runs anything or sets a
    variable the plan does not name."""
    _checked(plan)
    job = safe_job(job)
    return "".join(f"{var.name}={var.value.replace(JOB_TOKEN, job)}\n" for var in plan.env)


def pod_env(plan: ArmPlan, job: str, pythonpath_tail: str = "") -> str:
    """The ``env:`` list of a container spec, as YAML (every value a quoted string: a job id of digits must
    stay a string). Kubernetes cannot append to a ``PYTHONPATH`` that the image sets, so give the image's value
    as ``pythonpath_tail`` (``:``-separated paths) or it is replaced by the shim's directory alone."""
    _checked(plan)
    job = safe_job(job)
    tail = [safe_path(part, "pythonpath_tail") for part in pythonpath_tail.split(":") if part]
    lines = []
    for var in plan.env:
        value = var.value.replace(JOB_TOKEN, job)
        if var.name == _PYTHONPATH:
            value = ":".join([value, *tail])
        lines.extend([f"- name: {var.name}", f'  value: "{value}"'])
    return "\n".join(lines) + "\n"
