"""What ``launcher: slurm`` tells Slurm, and how it reads the answer back; pure (no Slurm here).

One ``srun`` step per group: one task per node (``--ntasks-per-node=1``), each running the same shell script
read from srun's standard input (``--input=all``). The script makes a private probe directory, writes the
probe files into it (base64, so the step needs no shared filesystem and no copy over SSH), prints a marker
naming its Slurm node, runs *that node's* command — the very ``torchrun`` line the SSH launcher runs, with
the node rank of the inventory's order — under ``timeout``, and prints its exit status. ``srun --label``
prefixes every line with the task number; the markers turn task numbers back into nodes, so a task that
never started, one stopped with the step and one that failed are told apart.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster_accept.inventory.slurm_settings import SrunSettings
from cluster_accept.remote.launch import FAILURE_GRACE_S

NODE_MARK = "@@cluster-accept-node "
EXIT_MARK = "@@cluster-accept-exit "
KILL_GRACE_S = 10
_LABELED = re.compile(r"^\s*(\d+): ?(.*)$")
_GRANTED = re.compile(r"Granted job allocation (\d+)")


def probe_script(files: Mapping[str, bytes], commands: Mapping[str, tuple[str, float | None]]) -> str:
    """The script every task runs: ``files`` (name -> content) in a fresh directory, then the command of its own
    Slurm node (``commands``: Slurm name -> (shell command, timeout in seconds))."""
    lines = [
        'd=$(mktemp -d "${TMPDIR:-/tmp}/cluster-accept-probe.XXXXXXXX") || exit 96',
        "trap 'rm -rf \"$d\"' EXIT",
    ]
    for name, content in files.items():
        encoded = base64.b64encode(content).decode()
        lines += [f"base64 -d > \"$d/{Path(name).name}\" <<'CA_FILE_END'", encoded, "CA_FILE_END"]
    lines += [f'echo "{NODE_MARK}$SLURMD_NODENAME"', 'export CA_PROBE_DIR="$d"', 'case "$SLURMD_NODENAME" in']
    for slurm_name, (command, timeout_s) in commands.items():
        limit = f"timeout -k {KILL_GRACE_S} {int(timeout_s)} " if timeout_s else ""
        lines.append(f"  {shlex.quote(slurm_name)}) {limit}sh -c {shlex.quote(command)}; code=$? ;;")
    lines += [
        '  *) echo "cluster-accept: $SLURMD_NODENAME is not in this run"; code=97 ;;',
        "esac",
        f"printf '\\n%s%s\\n' '{EXIT_MARK}' \"$code\"",  # on a line of its own, whatever came before
        # srun kills the step at a task's bad exit (--kill-on-bad-exit): a failed task waits first, so that its
        # peers, failing of the lost connection, end of themselves and say so (remote.rank_end)
        f'[ "$code" = 0 ] || sleep {FAILURE_GRACE_S}',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


@dataclass
class TaskOutput:
    """One task of the step, read back from srun's labelled output."""

    task: int
    slurm_node: str = ""
    lines: list[str] = field(default_factory=list)
    exit_code: int | None = None


def split_tasks(stdout: str) -> dict[str, TaskOutput]:
    """srun ``--label`` output -> Slurm node name -> what its task printed (markers removed) and its exit
    status; tasks that never printed their node marker are left out (they never started)."""
    tasks: dict[int, TaskOutput] = {}
    for line in stdout.split("\n"):  # only newlines end lines: a probe's carriage returns stay in its line
        found = _LABELED.match(line)
        if not found:
            continue
        task = tasks.setdefault(int(found.group(1)), TaskOutput(int(found.group(1))))
        text = found.group(2)
        if text.startswith(NODE_MARK) and not task.slurm_node:
            task.slurm_node = text[len(NODE_MARK) :].strip()
        elif text.startswith(EXIT_MARK):
            value = text[len(EXIT_MARK) :].strip()
            task.exit_code = int(value) if value.lstrip("-").isdigit() else None
        else:
            task.lines.append(text)
    return {t.slurm_node: t for t in tasks.values() if t.slurm_node}


def srun_errors_for(stderr: str, slurm_node: str) -> str:
    """srun's own error lines that name ``slurm_node`` (a task launch that failed there)."""
    named = re.compile(rf"(?<![\w.-]){re.escape(slurm_node)}(?![\w.-])")
    return "; ".join(
        line.strip() for line in stderr.splitlines() if line.lstrip().startswith("srun:") and named.search(line)
    )


def salloc_argv(
    nodelist: Sequence[str], settings: SrunSettings, name: str, gpus_per_node: int | None, salloc: str = "salloc"
) -> list[str]:
    """``salloc --no-shell`` for exactly these Slurm nodes, failing after ``allocation_wait_s``."""
    argv = [
        salloc, "--no-shell", f"--nodes={len(nodelist)}", f"--nodelist={','.join(nodelist)}",
        f"--job-name={name}", f"--time={settings.time_limit_min}", f"--immediate={settings.allocation_wait_s}",
    ]  # fmt: skip
    argv += ["--exclusive"] if settings.exclusive else []
    for option, value in (
        ("partition", settings.partition),
        ("account", settings.account),
        ("qos", settings.qos),
        ("reservation", settings.reservation),
    ):
        if value:
            argv.append(f"--{option}={value}")
    if gpus_per_node and settings.gpus_per_node:
        argv.append(f"--gpus-per-node={gpus_per_node}")
    return argv


def granted_job(salloc_stderr: str) -> str | None:
    """The job id salloc was granted, from its ``Granted job allocation N`` line."""
    found = _GRANTED.search(salloc_stderr)
    return found.group(1) if found else None


def srun_argv(
    job_id: str,
    nodelist: Sequence[str],
    settings: SrunSettings,
    time_limit_min: int | None,
    srun: str = "srun",
    job_name: str = "cluster-accept",
) -> list[str]:
    """One task per node of ``nodelist`` in job ``job_id``, the script on standard input, output labelled; the
    step is killed as soon as any task fails (its peers would wait for it until their own timeout)."""
    argv = [
        srun, f"--jobid={job_id}", f"--nodes={len(nodelist)}", f"--ntasks={len(nodelist)}", "--ntasks-per-node=1",
        f"--nodelist={','.join(nodelist)}", "--overlap", "--label", "--input=all", "--kill-on-bad-exit=1",
        "--export=ALL", "--quit-on-interrupt", f"--job-name={job_name}",
    ]  # fmt: skip
    if time_limit_min:
        argv.append(f"--time={time_limit_min}")
    return [*argv, *settings.srun_args, "/bin/sh", "-s"]
