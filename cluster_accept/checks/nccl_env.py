"""The NCCL environment as a job on the node sees it: the session's variables, then NCCL's own config files.

A job started over SSH runs in a non-interactive ``sh -c`` of the user's session, so ``env`` there is what
the job inherits. NCCL then reads ``$NCCL_CONF_FILE`` (NCCL >= 2.23; when unset, ``~/.nccl.conf``) and
``/etc/nccl.conf``, setting each ``KEY=VALUE`` line without overwriting (``setenv(k, v, 0)``): the
environment wins over the user file, which wins over ``/etc/nccl.conf``, and inside one file the first line
of a key wins. Lines starting with ``#`` are comments; the key is everything before the first ``=``, taken
as it is, so ``NCCL_DEBUG = INFO`` sets a variable named ``NCCL_DEBUG `` that NCCL never reads.

Values of keys with secret names (``vocabulary.secrets``: TOKEN, KEY, SECRET, PASSWORD, PASSWD, AUTH, a PAT
word and more; not ``NCCL_IB_PKEY``, an InfiniBand partition key index) are masked on the node already, by
an awk program that applies the same rule, and shown here as that awk writes them; the whole output is masked
where it enters the controller (other values' secrets by shape: a URL's password, a token with a well-known
prefix), and a pinned value of the profile is masked here, in the same form, so that the two compare.

The files a job's user writes are read as :mod:`._conf_files` reads them (no link followed, no FIFO waited on,
another user's file not believed, 64 KiB at most): a file refused is a ``conf_unread`` warning, never silence.

Drift is judged for ``NCCL_*`` keys the profile does not pin (pinned keys are judged against the profile):
:func:`cluster_values` reports each key's effective value plus the node's sorted key set under
``nccl_keys``, so the majority key set tells a key that is set on a few nodes only, or missing on a few.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks._conf_files import CONF_READER, refusal
from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
    FindingKind,
    NodeModels,
    Profile,
    Reason,
    Status,
    SuggestedValues,
    always,
    dead,
    declare,
    error_row,
    fault,
    healthy,
)
from cluster_accept.vocabulary.secrets import (
    NOT_SECRET_NAMES,
    SECRET_NAME_ERE,
    is_secret_name,
    mask_secrets,
    mask_value,
)

NAME = "nccl_env"
MASK = "****"
UNSET = "<unset>"
KEYS_VALUE = "nccl_keys"  # cluster_values key holding the node's NCCL_* key set
_PREFIXES = ("NCCL", "UCX", "CUDA_VISIBLE", "NVSHMEM", "TORCH_NCCL")
_COLLECTED = re.compile(rf"^(?:{'|'.join(_PREFIXES)})[A-Za-z0-9_]*$")
ENV_SOURCE = "env"
ETC_SOURCE = "/etc/nccl.conf"
USER_SOURCE = "~/.nccl.conf"
_END = "### end"
END_MARK = _END  # the line that ends the environment sections (checks reading more after it split there)
_MARKS = {"### env": ENV_SOURCE, f"### {ETC_SOURCE}": ETC_SOURCE, f"### {USER_SOURCE}": USER_SOURCE}
_CONF_FILE_MARK = "### NCCL_CONF_FILE"
# awk on the node: mask the value of a secret-looking key (before anything leaves the node), by the rule of
# analysis.secrets (a POSIX ERE over the upper-cased key).
_KEPT = " && ".join(f'k != "{name}"' for name in sorted(NOT_SECRET_NAMES) if name.isupper())  # variables only
_MASK_AWK = (
    '{ i = index($0, "="); k = (i ? substr($0, 1, i - 1) : ""); '
    f"if (i && toupper(k) ~ /{SECRET_NAME_ERE}/ && {_KEPT}) "
    f'print k "={MASK}"; else print }}'
)
COMMAND = (
    CONF_READER + f"ca_mask='{_MASK_AWK}'; "
    "echo '### env'; "
    f"env | grep -E '^({'|'.join(_PREFIXES)})[A-Za-z0-9_]*=' | awk \"$ca_mask\"; "
    f"echo '### {ETC_SOURCE}'; ca_conf {ETC_SOURCE} 2>/dev/null | awk \"$ca_mask\"; "
    'if [ -n "${NCCL_CONF_FILE:-}" ]; then '
    f'echo \'{_CONF_FILE_MARK}\'; ca_conf "$NCCL_CONF_FILE" 2>/dev/null | awk "$ca_mask"; '
    f'else echo \'### {USER_SOURCE}\'; ca_conf "$HOME/.nccl.conf" 2>/dev/null | awk "$ca_mask"; fi; '
    f"echo '{_END}'"
)


REASONS = declare(
    Reason(
        "not_collected",
        Status.SKIP,
        "the profile pins a variable this check does not read from the node (not an NCCL-related prefix)",
    ),
    Reason(
        "missing",
        Status.FAIL,
        "a variable the profile pins is not set on the node: set it in the environment or /etc/nccl.conf",
        Action.FIX_CONFIG,
    ),
    Reason("secret_not_compared", Status.SKIP, "the value is masked on the node, so it is not compared"),
    Reason(
        "value_mismatch",
        Status.FAIL,
        "a variable has another value than the profile pins: set the NCCL environment the profile expects",
        Action.FIX_CONFIG,
    ),
    Reason(
        "conf_line_ignored",
        Status.WARN,
        "a config line NCCL never reads (spaces around '='): write it as KEY=value",
        Action.FIX_CONFIG,
    ),
    Reason(
        "conf_unread",
        Status.WARN,
        "an NCCL config file was not read: a link, not a regular file, owned by another user than the reader or root,"
        " or too long; NCCL may still read it, so its settings are unknown here",
        Action.FIX_CONFIG,
    ),
    Reason(
        "drift",
        Status.WARN,
        "an NCCL variable not pinned by the profile is set (or unset) differently from most nodes: align them",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
)


CONF_UNREAD_DETAIL = (
    "read without following links, only regular files of the reading user or root, bounded in size and time: "
    "replace it by a regular file of the job's user"
)


def is_secret(key: str) -> bool:
    return is_secret_name(key)


def _masked(key: str, value: str) -> str:
    """A node's value as the check shows it: a secret key's as the node's awk writes it, whatever the node printed
    (its output masked where it entered the controller already)."""
    return MASK if is_secret(key) else value


def _pinned(key: str, want: str) -> str:
    """The profile's pinned value (the inventory's text, not the node's) in the form a node's value takes (masked
    where it entered, then :func:`_masked`), so that the two compare."""
    return MASK if is_secret(key) else mask_secrets(want)


def _shown_pin(key: str, want: str) -> str:
    """The profile's pinned value as a row shows it: masked where it is written, by the vocabulary's rule for a
    value beside its name too (the inventory's text enters no row unmasked)."""
    return mask_value(key, _pinned(key, want))


def _mask_line(line: str) -> str:
    key, sep, _ = line.partition("=")
    return f"{key}={MASK}" if sep and is_secret(key) else line


@dataclass(frozen=True)
class Setting:
    value: str  # masked for secret keys
    source: str  # 'env', '/etc/nccl.conf', '~/.nccl.conf' or 'NCCL_CONF_FILE (<path>)'
    shadowed: tuple[tuple[str, str], ...] = ()  # (source, value) of lower-precedence settings of the key


@dataclass(frozen=True)
class NcclEnv:
    effective: dict[str, Setting] = field(default_factory=dict)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (source, line): keys NCCL never reads
    refused: list[tuple[str, str]] = field(default_factory=list)  # (source, why): a file the node did not read
    error: str | None = None
    raw: str = ""  # masked

    def nccl_keys(self) -> list[str]:
        return sorted(k for k in self.effective if k.startswith("NCCL_"))


def _conf(lines: list[str], source: str, ignored: list[tuple[str, str]]) -> dict[str, str]:
    """A config file as NCCL reads it: comments skipped, first line of a key wins, values taken as they are."""
    values: dict[str, str] = {}
    for line in lines:
        line = line.rstrip("\r")
        if line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key:
            continue
        if not _COLLECTED.fullmatch(key):
            if _COLLECTED.fullmatch(key.strip()):
                ignored.append((source, _mask_line(line)))
            continue
        values.setdefault(key, _masked(key, value))
    return values


def parse(stdout: str, exit_code: int | None = 0) -> NcclEnv:
    raw = "\n".join(_mask_line(line) for line in stdout.split("\n"))
    sections: dict[str, list[str]] = {}
    current: str | None = None
    ended = False
    for line in stdout.splitlines():
        if line in _MARKS or line == _CONF_FILE_MARK:
            current = _MARKS.get(line, _CONF_FILE_MARK)
            sections[current] = []
        elif line == _END:
            ended = True
            break
        elif current is None:
            if line.strip():
                return NcclEnv(error=f"unexpected line before the env section: {_mask_line(line)[:200]!r}", raw=raw)
        else:
            sections[current].append(line)
    if ENV_SOURCE not in sections:
        return NcclEnv(error="no env section in the output", raw=raw)
    if not ended:
        return NcclEnv(error="output truncated before the end marker", raw=raw)
    env: dict[str, str] = {}
    for line in sections[ENV_SOURCE]:
        key, sep, value = line.partition("=")
        if sep and _COLLECTED.fullmatch(key):
            env[key] = _masked(key, value)
    ignored: list[tuple[str, str]] = []
    user_source = USER_SOURCE
    if _CONF_FILE_MARK in sections:
        user_source = f"NCCL_CONF_FILE ({env.get('NCCL_CONF_FILE', '?')})"
        user = _conf(sections[_CONF_FILE_MARK], user_source, ignored)
    else:
        user = _conf(sections.get(USER_SOURCE, []), user_source, ignored)
    etc = _conf(sections.get(ETC_SOURCE, []), ETC_SOURCE, ignored)
    layers = [(ENV_SOURCE, env), (user_source, user), (ETC_SOURCE, etc)]
    refused = _refused({user_source: sections.get(_CONF_FILE_MARK, sections.get(USER_SOURCE, [])),
                        ETC_SOURCE: sections.get(ETC_SOURCE, [])})  # fmt: skip
    effective: dict[str, Setting] = {}
    for key in sorted(set(env) | set(user) | set(etc)):
        found = [(source, values[key]) for source, values in layers if key in values]
        effective[key] = Setting(found[0][1], found[0][0], tuple(found[1:]))
    return NcclEnv(effective=effective, ignored=ignored, refused=refused, raw=raw)


def _refused(sections: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(source, why) of each config file the node's reader refused (a link, a FIFO, another user's file)."""
    found = ((source, refusal(line)) for source, lines in sections.items() for line in lines)
    return [(source, why) for source, why in found if why is not None]


def cluster_values(model: NcclEnv) -> dict[str, str]:
    """Every effective NCCL_* value, plus the key set so that a key set (or missing) on few nodes shows."""
    if model.error:
        return {}
    keys = model.nccl_keys()
    values = {k: model.effective[k].value for k in keys}
    values[KEYS_VALUE] = ",".join(keys)
    return values


def _where(setting: Setting) -> str:
    text = f"from {setting.source}"
    if setting.shadowed:
        text += "; overrides " + ", ".join(f"{source}: {value!r}" for source, value in setting.shadowed)
    return text


def _pinned_rows(model: NcclEnv, profile: Profile) -> list[CheckRow]:
    rows: list[CheckRow] = []
    for key, want in profile.nccl_env.items():
        shown_want = _shown_pin(key, want)
        setting = model.effective.get(key)
        if not _COLLECTED.fullmatch(key):
            rows.append(
                CheckRow(
                    NAME,
                    key,
                    Status.SKIP,
                    "not_collected",
                    None,
                    shown_want,
                    f"only variables starting with {', '.join(_PREFIXES)} are read from the node",
                )
            )
        elif setting is None:
            rows.append(
                CheckRow(
                    NAME,
                    key,
                    Status.FAIL,
                    "missing",
                    None,
                    shown_want,
                    f"not set in the environment, {USER_SOURCE} or {ETC_SOURCE}",
                )
            )
        elif is_secret(key):
            rows.append(
                CheckRow(
                    NAME,
                    key,
                    Status.SKIP,
                    "secret_not_compared",
                    MASK,
                    MASK,
                    f"set {_where(setting)}; the value is masked, so it is not compared",
                )
            )
        elif setting.value != _pinned(key, want):
            rows.append(CheckRow(NAME, key, Status.FAIL, "value_mismatch", setting.value, shown_want, _where(setting)))
        else:
            rows.append(CheckRow(NAME, key, Status.PASS, "ok", setting.value, shown_want, _where(setting)))
    return rows


def _drift_rows(model: NcclEnv, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    mine = set(model.nccl_keys())
    majority_keys_text = cluster.majority_of(KEYS_VALUE)
    majority_keys = None if majority_keys_text is None else set(filter(None, majority_keys_text.split(",")))
    rows: list[CheckRow] = []
    for key in sorted((mine | (majority_keys or set())) - set(profile.nccl_env)):
        majority = cluster.majority_of(key)
        if key in mine:
            setting = model.effective[key]
            if majority_keys is not None and key not in majority_keys:
                expected = f"{UNSET} (majority)"
            elif majority is not None and majority != setting.value:
                expected = f"{majority} (majority)"
            else:
                continue
            rows.append(CheckRow(NAME, key, Status.WARN, "drift", setting.value, expected, _where(setting)))
        else:
            expected = f"{majority if majority is not None else '<set>'} (majority)"
            rows.append(CheckRow(NAME, key, Status.WARN, "drift", UNSET, expected, "not set on this node"))
    return rows


def evaluate(model: NcclEnv, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    rows = _pinned_rows(model, profile)
    for source, line in model.ignored:
        key = line.partition("=")[0].strip()
        rows.append(
            CheckRow(
                NAME,
                key,
                Status.WARN,
                "conf_line_ignored",
                line,
                f"{key}=<value>",
                f"{source}: NCCL takes the key as everything before '=', spaces included, so it never reads this line",
            )
        )
    for source, why in model.refused:
        rows.append(CheckRow(NAME, source, Status.WARN, "conf_unread", why, "a regular file", CONF_UNREAD_DETAIL))
    rows.extend(_drift_rows(model, profile, cluster))
    return rows


# Set by NVIDIA's containers to name the NCCL they ship: a version (the cuda check reports it), not a setting;
# pinned, it would fail every node at the next container upgrade.
_NOT_SETTINGS = frozenset({"NCCL_VERSION"})


def suggest_values(model: NcclEnv, others: NodeModels) -> SuggestedValues:
    """Every NCCL setting in effect, under ``nccl_env.<KEY>`` (``profile suggest``)."""
    keys = [key for key in model.nccl_keys() if key not in _NOT_SETTINGS]
    return {f"nccl_env.{key}": model.effective[key].value for key in keys}


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    job_view=True,
    environment=True,
    expectations=(Expectation("nccl_env", "preflight", NAME, always, per_item=lambda p: p.nccl_env),),
    samples=(
        healthy(
            "healthy",
            {"ok"},
            fixture="nccl_env/healthy.txt",
            profile={"nccl_env": {"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "WARN"}},
        ),
        fault("conf_line_ignored", {"conf_line_ignored"}, fixture="nccl_env/conf_line_ignored.txt"),
        dead("no_output", {"unparsable_output"}, text="", exit_code=127),
    ),
)
