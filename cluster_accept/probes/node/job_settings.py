"""Node-side: the settings a probe's job runs with, and where each is set, as one JSON line.

A slow figure is often a setting, not the hardware: ``NCCL_P2P_LEVEL=LOC`` left in ``/etc/nccl.conf``, a
thread count or an instruction-set cap in the job's environment. The controller can name a setting as a
suspect, and measure again without it, only if the run said what it ran with. This prints, before the probe
starts and in the same environment (inside the operator's container when there is one), every variable of
the libraries a probe goes through (NCCL, torch, OpenMP, MKL, oneDNN, gloo, CUDA, UCX …) with its source:

- the environment, which wins;
- then NCCL's own files as NCCL reads them (``setenv(k, v, 0)``: the first to set a key wins):
  ``$NCCL_CONF_FILE`` when set, else ``~/.nccl.conf``; then ``/etc/nccl.conf``.

Values of variables with secret-looking names are not printed; one JSON line per setting, fields "name", "value",
"source" ("key" reads as a secret to the masking every output passes through). Only the standard library is needed.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

PREFIXES = (
    "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "KMP_", "GOMP_", "MKL_", "ONEDNN_", "DNNL_", "OPENBLAS_", "ATEN_",
    "GLOO_", "TP_", "CUDA_", "CUBLAS", "CUDNN_", "NVIDIA_TF32", "UCX_", "NVSHMEM_", "LD_PRELOAD",
)  # fmt: skip
# The project's rule for a secret name (vocabulary/secrets.py SECRET_NAME_ERE, NOT_SECRET_NAMES; a test holds the
# two the same): this script ships alone and imports nothing of the package.
_WORDS = "TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|COOKIE|AUTH|AUTHORIZATION"
SECRET_NAME_ERE = f"({_WORDS})S?([^A-Z]|$)|(^|[^A-Z])(PASS|PAT)S?([^A-Z]|$)|[^A-Z]PWD([^A-Z]|$)"
NOT_SECRET_NAMES = frozenset({"NCCL_IB_PKEY", "UCX_IB_PKEY"})
SECRET = re.compile(SECRET_NAME_ERE)
MASK = "****"
ETC_FILE = "/etc/nccl.conf"
USER_FILE = "~/.nccl.conf"


def watched(key: str) -> bool:
    return key.startswith(PREFIXES)


def _value(key: str, value: str) -> str:
    return MASK if key not in NOT_SECRET_NAMES and SECRET.search(key.upper()) else value


CONF_BYTES = 65536  # an NCCL config file is a few hundred bytes: read to here, never more


def read_conf(path: str) -> tuple[str, str]:
    """(text, why not) of a config file a job's user may have written: never through a link, only a regular file
    of this user or root (a FIFO would hold the probe, ``/dev/zero`` fill its memory), at most
    :data:`CONF_BYTES`. A file that does not exist is ("", "")."""
    try:
        fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "", ""
    except OSError as exc:
        return "", "a link: not followed" if exc.errno == errno.ELOOP else f"unreadable: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "", "not a regular file"
        if info.st_uid not in (os.getuid(), 0):
            return "", f"owned by uid {info.st_uid}, neither the reading user nor root"
        return os.read(fd, CONF_BYTES).decode("utf-8", errors="replace"), ""
    finally:
        os.close(fd)


def conf_lines(path: str) -> list[tuple[str, str]]:
    """``KEY=VALUE`` lines of an NCCL config file, as NCCL reads them (``#`` comments; the key is everything
    before the first ``=``); none when the file cannot be read, or is refused by :func:`read_conf`."""
    found = []
    for line in read_conf(path)[0].splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#") and key:
            found.append((key, value))
    return found


def conf_files() -> list[tuple[str, str]]:
    """NCCL's files in the order NCCL reads them: (name as reported, path)."""
    user = os.environ.get("NCCL_CONF_FILE") or ""
    first = (user, user) if user else (USER_FILE, USER_FILE)
    return [first, (ETC_FILE, ETC_FILE)]


def settings() -> list[dict[str, str]]:
    """Every watched setting in effect, with its source; a key set in several places once, where it wins."""
    found: dict[str, dict[str, str]] = {}
    for key, value in sorted(os.environ.items()):
        if watched(key):
            found[key] = {"name": key, "value": _value(key, value), "source": "env"}
    for name, path in conf_files():
        for key, value in conf_lines(path):
            if key not in found:
                found[key] = {"name": key, "value": _value(key, value), "source": name}
            else:
                found[key].setdefault("also", name)
    return list(found.values())


if __name__ == "__main__":
    # one line per setting: where a value looks like a secret to the controller's masking, only its line is cut
    for setting in settings():
        print(json.dumps({"info": "settings", "setting": setting}), flush=True)
    for name, path in conf_files():  # a file left unread is said, so that its settings are known to be unknown
        why = read_conf(path)[1]
        if why:
            print(json.dumps({"info": "settings", "refused": {"source": name, "why": why}}), flush=True)
