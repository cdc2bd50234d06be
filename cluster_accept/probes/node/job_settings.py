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

import json
import os
import re

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


def conf_lines(path: str) -> list[tuple[str, str]]:
    """``KEY=VALUE`` lines of an NCCL config file, as NCCL reads them (``#`` comments; the key is everything
    before the first ``=``); none when the file cannot be read."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
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
