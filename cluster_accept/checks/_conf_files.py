"""How a check's command reads an NCCL config file a job's user can write (``~/.nccl.conf``, ``$NCCL_CONF_FILE``)
and the one root keeps (``/etc/nccl.conf``). Not a check (discovery skips ``_`` modules).

Behind ``probes.command_prefix`` the command runs as the job's user, whose home and ``NCCL_CONF_FILE`` the user
chooses: a link to ``/dev/zero`` would feed the masking ``awk`` one endless line, a FIFO would hold the check
until its timeout. So the reader never follows a link, reads only a regular file owned by the reading user or
by root, at most :data:`CONF_BYTES` of it, within :data:`CONF_SECONDS`; a file it refuses is not silently
empty: one ``#!refused <why>`` line stands in its place, a comment to NCCL's syntax that the check's parser
turns into a row."""

from __future__ import annotations

CONF_BYTES = 65536  # an NCCL config file is a few hundred bytes; a file past this is read to here and said so
CONF_SECONDS = 5
REFUSED_MARK = "#!refused "

# POSIX sh: ``ca_conf PATH`` prints the file's lines, or one refused line, or nothing when it does not exist.
CONF_READER = (
    "ca_conf() { "
    f'if [ -L "$1" ]; then echo "{REFUSED_MARK}a link: not followed"; '
    'elif [ ! -e "$1" ]; then :; '
    f'elif [ ! -f "$1" ]; then echo "{REFUSED_MARK}not a regular file"; '
    'elif [ ! -O "$1" ] && [ "$(stat -c %u -- "$1" 2>/dev/null)" != 0 ]; then '
    f'echo "{REFUSED_MARK}owned by uid $(stat -c %u -- "$1" 2>/dev/null), neither the reading user nor root"; '
    f'else timeout {CONF_SECONDS} head -c {CONF_BYTES} -- "$1" | awk 1; '
    f'[ "$(stat -c %s -- "$1" 2>/dev/null || echo 0)" -gt {CONF_BYTES} ] '
    f'&& echo "{REFUSED_MARK}longer than {CONF_BYTES} bytes: read to there"; '
    "fi; }; "
)


def refusal(line: str) -> str | None:
    """Why the reader refused a file, from its stand-in line; None for any other line."""
    return line[len(REFUSED_MARK) :].strip() if line.startswith(REFUSED_MARK) else None
