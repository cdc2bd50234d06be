"""NCCL settings known to cripple or misroute a job, named wherever they are set, whatever the profile lists.

A leftover ``NCCL_P2P_DISABLE=1`` in ``/etc/nccl.conf`` makes NCCL use shared memory instead of NVLink inside
a node (all-reduce at ~25 GB/s instead of ~360 on 4 x H200); ``NCCL_SOCKET_IFNAME=bond0`` on a node without
``bond0`` fails every multi-node job at initialisation. Neither shows as anything but a slow or failed
collective later, so preflight names them first, with the file or environment that set them. The environment
and NCCL's config files are read as :mod:`cluster_accept.checks.nccl_env` reads them; beside them, what the
node has: network interfaces and their state, InfiniBand ports and their state, GPUs, active NVLinks.

The built-in rules are one table (:data:`RULES`); a profile adds its own (``nccl_harmful``). Every node gets a
row: the harmful settings found, or one ``ok`` row saying how many settings were read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cluster_accept.checks import nccl_env
from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
    Profile,
    Reason,
    Status,
    always,
    dead,
    declare,
    error_row,
    fault,
    healthy,
)

NAME = "nccl_harmful"
_FACTS_END = "### facts end"
COMMAND = (
    nccl_env.COMMAND + "; echo '### net'; "
    'for d in /sys/class/net/*; do [ -e "$d" ] && echo "${d##*/} $(cat "$d/operstate" 2>/dev/null)"; done; '
    "echo '### hca'; "
    'for p in /sys/class/infiniband/*/ports/*; do [ -e "$p/state" ] && '
    'h=${p%/ports/*} && echo "${h##*/} ${p##*/} $(cat "$p/state" 2>/dev/null)"; done; '
    "echo '### gpus'; nvidia-smi -L 2>/dev/null | grep -c '^GPU'; "
    "echo '### nvlink'; nvidia-smi nvlink -s 2>/dev/null | grep -c 'GB/s'; "
    f"echo '{_FACTS_END}'"
)
_FACT_SECTIONS = ("### net", "### hca", "### gpus", "### nvlink")


@dataclass(frozen=True)
class NodeFacts:
    """The NCCL settings a job sees, and what the node has for them to name."""

    env: nccl_env.NcclEnv
    interfaces: dict[str, str] = field(default_factory=dict)  # name -> operstate ('up', 'down', 'unknown')
    hca_ports: dict[str, str] = field(default_factory=dict)  # 'mlx5_0:1' -> '4: ACTIVE'
    gpus: int | None = None
    nvlinks_active: int | None = None
    error: str | None = None

    @property
    def raw(self) -> str:
        """The whole output, secrets masked (the environment parser masks every line it keeps)."""
        return self.env.raw

    def setting(self, key: str) -> nccl_env.Setting | None:
        return self.env.effective.get(key)


def _count(lines: list[str]) -> int | None:
    text = "".join(lines).strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else None


def parse(stdout: str, exit_code: int | None = 0) -> NodeFacts:
    env = nccl_env.parse(stdout, exit_code)
    if env.error:
        return NodeFacts(env, error=env.error)
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in stdout.split(nccl_env.END_MARK, 1)[1].splitlines():
        if line in _FACT_SECTIONS:
            current = line
            sections[current] = []
        elif line == _FACTS_END:
            break
        elif current is not None and line.strip():
            sections[current].append(line)
    else:
        return NodeFacts(env, error="output truncated before the end of the node's facts")
    interfaces = dict((line.split(" ", 1) + [""])[:2] for line in sections.get("### net", []))
    hcas = {}
    for line in sections.get("### hca", []):
        hca, _, rest = line.partition(" ")
        port, _, state = rest.partition(" ")
        hcas[f"{hca}:{port}"] = state
    gpus, nvlinks = _count(sections.get("### gpus", [])), _count(sections.get("### nvlink", []))
    return NodeFacts(env, interfaces, hcas, gpus, nvlinks)


# --- the rules: each looks at one variable's effective value and says what is wrong with it, or nothing ---


def _truthy(value: str) -> bool:
    digits = value.strip().lstrip("-")  # NCCL reads an integer: any non-zero one switches it on
    return digits.isascii() and digits.isdigit() and digits.strip("0") != ""


def _has_nvlink(facts: NodeFacts, profile: Profile) -> bool:
    expects_p2p = (profile.probes.expected_transport.intra_node or "").startswith(("P2P", "NVLS"))
    return bool(facts.nvlinks_active) or expects_p2p or bool(profile.nvlink and profile.nvlink.links_per_gpu)


def _expects_net(profile: Profile) -> str | None:
    """The network plug-in the profile expects between nodes (``IB`` for ``NET/IB``), if any."""
    inter = profile.probes.expected_transport.inter_node or ""
    parts = inter.split("/")
    return parts[1] if parts[0] == "NET" and len(parts) > 1 else None


def _p2p_disable(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    if _truthy(value) and _has_nvlink(facts, profile):
        return "NCCL uses shared memory (SHM) instead of NVLink P2P between the GPUs of a node: ~10x slower"
    return None


def _p2p_level(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    if value.strip().upper() in ("LOC", "0") and _has_nvlink(facts, profile):
        return "P2P only within one GPU: NCCL uses shared memory (SHM) instead of NVLink between GPUs"
    return None


def _shm_disable(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    if not _truthy(value):
        return None
    p2p_off = _truthy(getattr(facts.setting("NCCL_P2P_DISABLE"), "value", "0")) or (
        getattr(facts.setting("NCCL_P2P_LEVEL"), "value", "").upper() in ("LOC", "0")
    )
    if p2p_off:
        return "with P2P off too, NCCL sends between the GPUs of a node over sockets (NET/Socket): ~100x slower"
    return None


def _ib_disable(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    if _truthy(value) and _expects_net(profile) == "IB":
        return "NCCL cannot use InfiniBand: it falls back to TCP sockets between nodes (NET/Socket)"
    return None


def _net(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    expected = _expects_net(profile)
    if expected is not None and value.strip().lower() != expected.lower():
        return f"forces NCCL's network to {value.strip()!r} where the profile expects NET/{expected}"
    return None


def _forced(what: str) -> Callable[[str, NodeFacts, Profile], str | None]:
    def rule(value: str, facts: NodeFacts, profile: Profile) -> str | None:
        return f"forces NCCL's {what} for every size and topology: usually a tuning leftover; unset it"

    return rule


def _debug(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    if value.strip().upper() in ("INFO", "TRACE"):
        return "every job logs NCCL's initialisation (TRACE: every operation): noise and slower start-up"
    return None


def _name_patterns(value: str) -> tuple[list[str], bool, bool]:
    """NCCL's interface/HCA list: ``^`` excludes, ``=`` matches exactly, otherwise by prefix."""
    text = value.strip()
    exclude, text = text.startswith("^"), text.lstrip("^")
    exact, text = text.startswith("="), text.lstrip("=")
    return [p.strip() for p in text.split(",") if p.strip()], exclude, exact


def _matches(name: str, pattern: str, exact: bool) -> bool:
    return name == pattern if exact else name.startswith(pattern)


def _socket_ifname(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    patterns, exclude, exact = _name_patterns(value)
    if exclude or not patterns:
        return None
    named = [i for i in facts.interfaces if any(_matches(i, p, exact) for p in patterns)]
    if not named:
        have = ", ".join(sorted(facts.interfaces)) or "none"
        return f"no interface matches {value.strip()!r} on this node (it has {have}): every multi-node job fails"
    if not any(facts.interfaces[i] in ("up", "unknown") for i in named):
        states = ", ".join(f"{i} {facts.interfaces[i]}" for i in named)
        return f"the interfaces it names are down ({states}): every multi-node job fails"
    return None


def _ib_hca(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    patterns, exclude, exact = _name_patterns(value)
    if exclude or not patterns:
        return None
    wanted = [p.partition(":") for p in patterns]
    ports = {
        port: state
        for port, state in facts.hca_ports.items()
        if any(
            _matches(port.partition(":")[0], h, exact) and (not n or port.partition(":")[2] == n) for h, _, n in wanted
        )
    }
    if not ports:
        have = ", ".join(sorted(facts.hca_ports)) or "no InfiniBand device"
        return f"no HCA port matches {value.strip()!r} on this node ({have}): NCCL falls back to sockets or fails"
    if not any("ACTIVE" in state for state in ports.values()):
        states = ", ".join(f"{p} {s}" for p, s in sorted(ports.items()))
        return f"no port it names is ACTIVE ({states}): NCCL falls back to sockets or fails"
    return None


def _visible_devices(value: str, facts: NodeFacts, profile: Profile) -> str | None:
    if profile.probes.cuda_visible_devices is not None:
        return None  # the operator partitions the node on purpose
    listed = [d for d in value.split(",") if d.strip() and d.strip() != "-1"]
    present = facts.gpus or (profile.gpu.count if profile.gpu else None)
    if present is not None and len(listed) < present:
        return f"a job sees {len(listed)} of the node's {present} GPUs"
    return None


@dataclass(frozen=True)
class Rule:
    key: str
    code: str
    check: Callable[[str, NodeFacts, Profile], str | None]
    expected: str  # what a safe setting is


RULES: tuple[Rule, ...] = (
    Rule("NCCL_P2P_DISABLE", "p2p_disabled", _p2p_disable, "unset or 0 on NVLink nodes"),
    Rule("NCCL_P2P_LEVEL", "p2p_level_low", _p2p_level, "unset, or NVL or higher on NVLink nodes"),
    Rule("NCCL_SHM_DISABLE", "shm_disabled", _shm_disable, "unset or 0"),
    Rule("NCCL_IB_DISABLE", "ib_disabled", _ib_disable, "unset or 0 where NET/IB is expected"),
    Rule("NCCL_NET", "net_forced", _net, "unset, or the expected network"),
    Rule("NCCL_ALGO", "algo_forced", _forced("algorithm"), "unset"),
    Rule("NCCL_PROTO", "proto_forced", _forced("protocol"), "unset"),
    Rule("NCCL_SOCKET_IFNAME", "socket_ifname_missing", _socket_ifname, "an interface the node has, up"),
    Rule("NCCL_IB_HCA", "ib_hca_missing", _ib_hca, "an HCA port the node has, active"),
    Rule("CUDA_VISIBLE_DEVICES", "gpus_hidden", _visible_devices, "unset, or every GPU of the node"),
    Rule("NCCL_DEBUG", "debug_logging", _debug, "unset, WARN or VERSION"),
)

_FIX = "unset it where it is set (see the detail), or set it right for this node"
REASONS = declare(
    Reason("p2p_disabled", Status.FAIL, f"NCCL_P2P_DISABLE turns NVLink P2P off: {_FIX}", Action.FIX_CONFIG),
    Reason("p2p_level_low", Status.FAIL, f"NCCL_P2P_LEVEL keeps NCCL off NVLink: {_FIX}", Action.FIX_CONFIG),
    Reason("shm_disabled", Status.FAIL, f"NCCL_SHM_DISABLE with P2P off leaves sockets: {_FIX}", Action.FIX_CONFIG),
    Reason("ib_disabled", Status.FAIL, f"NCCL_IB_DISABLE turns InfiniBand off: {_FIX}", Action.FIX_CONFIG),
    Reason("net_forced", Status.FAIL, f"NCCL_NET forces another network than expected: {_FIX}", Action.FIX_CONFIG),
    Reason("algo_forced", Status.WARN, f"NCCL_ALGO overrides NCCL's tuning: {_FIX}", Action.FIX_CONFIG),
    Reason("proto_forced", Status.WARN, f"NCCL_PROTO overrides NCCL's tuning: {_FIX}", Action.FIX_CONFIG),
    Reason(
        "socket_ifname_missing",
        Status.FAIL,
        f"NCCL_SOCKET_IFNAME names no interface of the node that is up: {_FIX}",
        Action.FIX_CONFIG,
    ),
    Reason("ib_hca_missing", Status.FAIL, f"NCCL_IB_HCA names no active HCA port: {_FIX}", Action.FIX_CONFIG),
    Reason("gpus_hidden", Status.FAIL, f"CUDA_VISIBLE_DEVICES hides GPUs from jobs: {_FIX}", Action.FIX_CONFIG),
    Reason(
        "debug_logging", Status.WARN, f"NCCL_DEBUG left at INFO/TRACE in the job environment: {_FIX}", Action.FIX_CONFIG
    ),
    Reason("site_rule", Status.FAIL, "a setting the profile's nccl_harmful refuses (see why)", Action.FIX_CONFIG),
    Reason(
        "site_rule_warn", Status.WARN, "a setting the profile's nccl_harmful warns about (see why)", Action.FIX_CONFIG
    ),
)


def _where(setting: nccl_env.Setting) -> str:
    return f"set in {setting.source}" if setting.source != nccl_env.ENV_SOURCE else "set in the job environment"


def _built_in_rows(facts: NodeFacts, profile: Profile) -> list[CheckRow]:
    rows = []
    for rule in RULES:
        setting = facts.setting(rule.key)
        if setting is None or nccl_env.is_secret(rule.key):
            continue
        said = rule.check(setting.value, facts, profile)
        if said is not None:
            status = REASONS[rule.code].severity
            observed = f"{rule.key}={setting.value}"
            rows.append(
                CheckRow(NAME, rule.key, status, rule.code, observed, rule.expected, f"{_where(setting)}: {said}")
            )
    return rows


def _site_rows(facts: NodeFacts, profile: Profile) -> list[CheckRow]:
    rows = []
    for rule in profile.nccl_harmful:
        setting = facts.setting(rule.key)
        if setting is None or (rule.values is not None and setting.value not in rule.values):
            continue
        code, status = ("site_rule", Status.FAIL) if rule.severity == "fail" else ("site_rule_warn", Status.WARN)
        expected = "unset" if rule.values is None else f"not {', '.join(rule.values)}"
        observed = f"{rule.key}={setting.value}"
        rows.append(CheckRow(NAME, rule.key, status, code, observed, expected, f"{_where(setting)}: {rule.why}"))
    return rows


def evaluate(facts: NodeFacts, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if facts.error:
        return [error_row(NAME, "unparsable_output", facts.error, facts.env.raw)]
    rows = _built_in_rows(facts, profile) + _site_rows(facts, profile)
    if rows:
        return rows
    read = len(facts.env.effective)
    rules = len(RULES) + len(profile.nccl_harmful)
    said = f"{read} settings read, none harmful"
    return [CheckRow(NAME, "settings", Status.PASS, "ok", said, "no harmful setting", f"{rules} rules applied")]


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    job_view=True,
    environment=True,
    expectations=(Expectation("harmful NCCL settings", "preflight", NAME, always),),
    samples=(
        healthy("h200x4", {"ok"}, fixture="nccl_harmful/h200x4.txt"),
        healthy("h100x1", {"ok"}, fixture="nccl_harmful/h100x1.txt"),
        fault("nvls_forced", {"p2p_disabled"}, fixture="nccl_harmful/nvls_forced.txt"),
        dead("no_output", {"unparsable_output"}, text="", exit_code=127),
    ),
)
