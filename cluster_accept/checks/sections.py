"""Shared parsing helpers for nvidia-smi outputs.

``nvidia-smi`` reports a dead driver with a fixed message and exit code 9 whatever subcommand ran; every
check recognises it the same way, and declares its ``nvidia_smi_failed`` reason from here, so it lives here once.

Clusters run several driver branches at once (535, 550, 570, 580), and ``--query-gpu`` refuses the whole query
when one field is unknown to the installed driver (``Field "x" is not a valid field to query.``, exit 2).
:class:`GpuQuery` is a field list that still reads on older drivers: its node-side command asks with today's
names first and, only on that refusal, asks again with the names older drivers know (:data:`OLDER_NAMES`);
its reader says which name answered, and which fields the driver is too old to report.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import Action, Reason
from cluster_accept.vocabulary.text import quote

# ``nvidia_smi_failed`` as the checks declare it: the checks that judge the driver itself (gpu_count, driver)
# fail the node; the others skip, so one dead driver is not counted once per check.
NVIDIA_SMI_FAILED = Reason(
    "nvidia_smi_failed",
    Status.FAIL,
    "nvidia-smi fails: the driver is not loaded or not installed",
    Action.FIX_CONFIG,
)
NVIDIA_SMI_SKIPPED = Reason(
    "nvidia_smi_failed",
    Status.SKIP,
    "not judged: nvidia-smi fails on this node (gpu_count and driver report it)",
)

DRIVER_FAILURE_MARKERS = (
    "couldn't communicate with the NVIDIA driver",
    "NVIDIA-SMI has failed",
    "No devices were found",
)


def driver_failure(stdout: str, exit_code: int | None) -> str | None:
    """The failure line when nvidia-smi could not talk to the driver, else None."""
    for line in stdout.splitlines():
        if any(marker in line for marker in DRIVER_FAILURE_MARKERS):
            return line.strip()
    if exit_code == 127 or "command not found" in stdout:
        return "nvidia-smi not found on the node"
    return None


def small_int(text: str) -> int | None:
    """``text`` as an int when it is a plain decimal number of at most 18 digits (an exit status, a GPU index),
    else None: ``str.isdigit`` alone takes '²', which ``int`` refuses, and ``int`` refuses over 4300 digits."""
    text = text.strip()
    return int(text) if text.isdecimal() and len(text) <= 18 else None


def csv_rows(stdout: str, columns: int) -> list[list[str]] | None:
    """Rows of a ``--format=csv,noheader,nounits`` output, each with exactly ``columns`` cells; None if any
    non-empty line has another shape (truncated or garbage output)."""
    rows: list[list[str]] = []
    try:
        for record in csv.reader(io.StringIO(stdout), skipinitialspace=True):
            if not record or all(not cell.strip() for cell in record):
                continue
            if len(record) != columns:
                return None
            rows.append([cell.strip() for cell in record])
    except csv.Error:  # a field over the csv limit, a stray NUL or carriage return: not nvidia-smi's shape
        return None
    return rows


def query_gpu(stdout: str, fields: list[str]) -> list[dict[str, str]] | None:
    """Rows of ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` as dicts keyed by field;
    None when the output does not have that shape (truncated, garbage)."""
    rows = csv_rows(stdout, len(fields))
    if rows is None:
        return None
    return [dict(zip(fields, row, strict=True)) for row in rows]


def query_gpu_command(fields: list[str]) -> str:
    return f"nvidia-smi --query-gpu={','.join(fields)} --format=csv,noheader,nounits"


def not_available(value: str) -> bool:
    """nvidia-smi's ways of saying a field has no value on this GPU."""
    return value.strip() in {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}


def read_gpu_query(stdout: str, exit_code: int | None, fields: list[str]) -> tuple[list[dict[str, str]], str, str]:
    """The shared first half of every ``--query-gpu`` parser: (rows, failure, error).

    ``failure``: nvidia-smi could not talk to the driver; ``error``: output we cannot read (non-zero exit,
    cut mid-line, wrong shape, no GPU lines, a non-numeric index). When either is set, rows is empty.
    """
    failure = driver_failure(stdout, exit_code)
    if failure:
        return [], failure, ""
    if exit_code not in (0, None):
        return [], "", f"nvidia-smi exited {exit_code}"
    if stdout and not stdout.endswith("\n"):
        return [], "", "output ends mid-line (truncated)"
    rows = query_gpu(stdout, fields)
    if rows is None:
        return [], "", f"expected {len(fields)} columns per line: {','.join(fields)}"
    if not rows:
        return [], "", "no GPU lines in the output"
    for row in rows:
        if "index" in row and not row["index"].isdigit():
            return [], "", f"bad GPU index {row['index']!r}"
    return rows, "", ""


# What nvidia-smi prints (exit 2) when a --query-gpu field is unknown to the installed driver: one line,
# ``Field "clocks_event_reasons.active" is not a valid field to query.``, naming the first unknown field.
REFUSED_FIELD = "is not a valid field to query"
# First line of a query's output when the driver refused fields and older names were asked instead:
# ``### query-gpu fallback refused=<today's names> fields=<the list that answered>``.
FALLBACK_MARK = "### query-gpu fallback"

FIELD_NOT_IN_DRIVER = Reason(
    "field_not_in_driver",
    Status.SKIP,
    "not judged: the node's driver is too old for nvidia-smi to report this field (a later driver added it); "
    "upgrade the driver to have it judged",
    Action.FIX_CONFIG,
)

# --query-gpu fields the checks read that drivers still in service may not know, with the name those drivers
# answer to instead (None: --query-gpu has no older name; the field is then reported as not judged).
OLDER_NAMES: Mapping[str, str | None] = MappingProxyType(
    {
        # NVML renamed its clock "throttle" reasons to clock "event" reasons in R535 (nvmlClocksEventReason*,
        # the same bits); nvidia-smi took the new names then and keeps the old ones as aliases (580's
        # --help-query-gpu lists both), while drivers before the rename know only clocks_throttle_reasons.*.
        "clocks_event_reasons.active": "clocks_throttle_reasons.active",
        "clocks_event_reasons.supported": "clocks_throttle_reasons.supported",
        # Row remapping (Ampere and later) was long readable only through --query-remapped-rows: the
        # --query-gpu fields are recent (absent from the R525-era field list, present on 580).
        "remapped_rows.pending": None,
        "remapped_rows.failure": None,
        "remapped_rows.correctable": None,
        "remapped_rows.uncorrectable": None,
    }
)
_FIELD_NAME = re.compile(r"[A-Za-z0-9_.]+")


def _family(name: str, older: str) -> str:
    """``clocks_event_reasons`` for (``clocks_event_reasons.active``, ``clocks_throttle_reasons.active``): the
    renamed part of ``name``, without the dotted tail both names share."""
    new_parts, old_parts = name.split("."), older.split(".")
    while len(new_parts) > 1 and len(old_parts) > 1 and new_parts[-1] == old_parts[-1]:
        new_parts, old_parts = new_parts[:-1], old_parts[:-1]
    return ".".join(new_parts)


@dataclass(frozen=True)
class QueryAnswer:
    """A ``--query-gpu`` output read back under today's field names.

    ``rows`` are keyed by today's names; a field the driver is too old to report is in ``missing`` and in no
    row. ``answered`` maps each field the driver reported to the name it answered to (an older name after a
    refusal). ``failure``/``error`` as :func:`read_gpu_query` sets them; when either is set, rows is empty.
    """

    rows: list[dict[str, str]] = field(default_factory=list)
    failure: str = ""
    error: str = ""
    answered: Mapping[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # what the driver said it did not know, in the order it said so

    def name(self, field_name: str) -> str:
        """The name the driver answered ``field_name`` to (the name itself when it was asked by it)."""
        return self.answered.get(field_name, field_name)

    def note(self, field_name: str) -> str:
        """For a row's detail: ``driver before clocks_event_reasons`` when the field was read under its older
        name, why it was not read when missing, else ''."""
        if field_name in self.missing:
            return f"the node's driver predates {field_name}: its nvidia-smi refused the field"
        answered = self.name(field_name)
        return f"driver before {_family(field_name, answered)}" if answered != field_name else ""


class GpuQuery:
    """A ``--query-gpu`` field list that reads on the drivers clusters still run, not only the newest.

    :attr:`command` asks with today's names. Only when nvidia-smi answers that a field is not a valid field to
    query does it ask again, with that one field under its older name (:data:`OLDER_NAMES`) or without it
    when it has none, until the driver answers or refuses a field with no way back; then the output starts
    with a :data:`FALLBACK_MARK` line naming what was refused and the list that was asked. One refusal per
    field: a driver names only the first field it does not know, and fields renamed in different branches
    each fall back on their own. :meth:`read` is pure and accepts both shapes.
    """

    def __init__(self, fields: list[str], older: Mapping[str, str | None] = OLDER_NAMES):
        bad = [f for f in [*fields, *(o for o in older.values() if o)] if not _FIELD_NAME.fullmatch(f)]
        if bad:
            raise ValueError(f"not --query-gpu field names: {bad}")
        self.fields = tuple(fields)
        self.older: Mapping[str, str | None] = MappingProxyType({f: older[f] for f in fields if f in older})

    def _asked(self, variables: Mapping[str, str]) -> str:
        """Shell words making the field list: today's names, or ``${qN:+,$qN}`` for a field that may change."""
        parts = [f"${{{variables[f]}:+,${variables[f]}}}" if f in variables else f",{f}" for f in self.fields]
        return "".join(parts)

    @property
    def command(self) -> str:
        """The POSIX sh snippet the node runs; the plain query when no field has an older form."""
        if not self.older:
            return query_gpu_command(list(self.fields))
        variables = {f: f"q{i}" for i, f in enumerate(self.older)}
        start = "; ".join(f"{v}={f}" for f, v in variables.items())
        cases = " ".join(f"{f}) {variables[f]}={older or ''};;" for f, older in self.older.items())
        ask = query_gpu_command(['"$q"'])
        return (
            f"{start}; said=; while :; do q={self._asked(variables)}; q=${{q#,}}; "
            f'out=$({ask} 2>&1; printf x%s "$?"); rc=${{out##*x}}; out=${{out%x*}}; '
            f"case $out in *'{REFUSED_FIELD}'*) ;; *) break;; esac; "
            "bad=${out#*'Field \"'}; bad=${bad%%'\"'*}; "
            'case ",$said," in *",$bad,"*) break;; esac; '
            f"case $bad in {cases} *) break;; esac; said=$said,$bad; done; "
            f'[ -z "$said" ] || printf \'%s\\n\' "{FALLBACK_MARK} refused=${{said#,}} fields=$q"; '
            'printf %s "$out"; exit "$rc"'
        )

    def _fallback(self, mark: str) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]] | str:
        """(answered names, missing fields, refused fields) from a fallback mark line, or what is wrong with it."""
        match = re.fullmatch(re.escape(FALLBACK_MARK) + r" refused=(\S*) fields=(\S+)", mark.strip())
        if match is None:
            return f"unexpected fallback line {quote(mark)}"
        refused = tuple(r for r in match.group(1).split(",") if r in self.older)
        asked = match.group(2).split(",")
        answered: dict[str, str] = {}
        missing: list[str] = []
        for name in self.fields:
            older = self.older.get(name)
            if asked[len(answered) : len(answered) + 1] in ([name], [older]):
                answered[name] = asked[len(answered)]
            elif name in self.older and older is None:
                missing.append(name)
            else:
                return f"fallback fields {quote(match.group(2))} do not match {','.join(self.fields)}"
        if len(answered) != len(asked):
            return f"fallback fields {quote(match.group(2))} do not match {','.join(self.fields)}"
        return answered, tuple(missing), refused

    def read(self, stdout: str, exit_code: int | None) -> QueryAnswer:
        """:func:`read_gpu_query` for either shape of :attr:`command`'s output; rows keyed by today's names."""
        first, newline, rest = stdout.partition("\n")
        if not first.startswith(FALLBACK_MARK):
            rows, failure, error = read_gpu_query(stdout, exit_code, list(self.fields))
            return QueryAnswer(rows, failure, error, {f: f for f in self.fields})
        found = self._fallback(first)
        if isinstance(found, str):
            return QueryAnswer(error=found)
        answered, missing, refused = found
        rows, failure, error = read_gpu_query(rest if newline else "", exit_code, list(answered.values()))
        if error and refused:
            error = f"{error} (after the driver refused {', '.join(refused)})"
        back = {asked: name for name, asked in answered.items()}
        keyed = [{back[asked]: value for asked, value in row.items()} for row in rows]
        return QueryAnswer(keyed, failure, error, answered, missing, refused)


def marked_sections(text: str, required: frozenset[str]) -> dict[str, list[str]] | None:
    """``text`` cut at its ``### <name>`` lines into name -> the lines under it, up to ``### end``; None when the
    output stops before ``### end`` (cut off) or lacks one of the ``required`` sections. Lines before the first
    marker are not a section's."""
    found: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("### "):
            current = line[4:].strip()
            if current == "end":
                return found if required <= set(found) else None
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return None
