"""The interpreter the probes will run (``probes.python``): there, with torch, built for the node's driver.

Checked in preflight, before any probe runs, because a probe that cannot start fails with a traceback on every
GPU and says nothing an operator can act on. Each way it goes wrong is its own reason with its action:

- ``python_missing``: ``probes.python`` names no interpreter on the node (a typo, a venv not on this node);
- ``torch_missing`` / ``torch_broken``: torch is not installed there, or does not import;
- ``torch_no_cuda``: a CPU-only build of torch on a node the profile probes with CUDA;
- ``cuda_driver_too_old``: torch was built for a CUDA major version newer than the driver supports
  (``nvidia-smi``'s ``CUDA Version``); a newer *minor* version runs through CUDA's minor-version compatibility
  and is only a warning (``cuda_minor_newer``);
- ``cuda_unavailable``: a CUDA build that still sees no GPU (torch's own warning says why).

torch's version and CUDA build are read from ``torch/version.py`` without importing it (a tenth of a second);
on a CUDA profile torch is also imported and asked for its GPUs, since only that finds a broken install. Runs
behind ``probes.command_prefix`` (the container the probes run in), as the probes do.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from cluster_accept.checks.contract import (
    KEPT_ANSWER,
    NOT_FOUND,
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
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

NAME = "probe"
TIMEOUT_S = 90.0  # importing torch on a loaded node can take tens of seconds
_MARK = "### probe-python "
_DRIVER_CUDA = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")
_CUDA = re.compile(r"(\d+)\.(\d+)")
# Where a node's own check (check --local, at every job start) keeps the last good answer of torch's import: the
# import and CUDA start take seconds, and a prolog has about two. The answer is taken again only while nothing it
# rests on changed: the interpreter, torch's files, every shared library the answered import had mapped (torch's
# own and those it loads from elsewhere: CUDA's pip packages, the driver's libcuda, libstdc++ …, each by its size,
# mtime and inode), every Python module's file the import loaded from outside torch's folder (typing_extensions,
# sympy, numpy, the standard library …: a pure-Python dependency removed or replaced breaks torch's import as a
# library does; a stat a file), the loader's cache, the loaded driver, the boot, the GPU device nodes and the
# variables that pick GPUs, libraries and modules. What is read back is held to the exact shape written (a file of
# another shape, an earlier version's without its modules among them, is removed and torch imported afresh: a bad
# file never fails the node by itself); a file another user could have written is ignored. A run from the
# controller never sets it: every run imports torch afresh. An answer taken from it is said in a row of its own
# (``kept_answer``): such a check did not import torch again, so it lifts no drain for it.
IMPORT_CACHE_ENV = "CA_IMPORT_CACHE"
# Reads torch's version file without importing torch; with argv[1] == 'import', imports it and asks CUDA (or takes
# the answer kept under $CA_IMPORT_CACHE when nothing it rests on changed).
_SCRIPT = """
import importlib.util, json, os, re, stat, sys, time, warnings
out = {"python": sys.version.split()[0], "executable": sys.executable}
LIMIT = 1 << 20
def stamp(path):
    try:
        s = os.stat(path)
        return [s.st_mtime_ns, s.st_size, s.st_ino]
    except OSError:
        return None
def text(path):
    try:
        with open(path) as f:
            return f.read(4096)
    except OSError:
        return None
def mine(st):
    return st.st_uid == os.getuid() and not st.st_mode & 0o022
def home(path):
    st = os.lstat(os.path.dirname(path))
    return stat.S_ISDIR(st.st_mode) and mine(st)
def fingerprint(where):
    gpus = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    names = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")
    files = [stamp(os.path.join(where, f)) for f in ("version.py", "__init__.py", "lib")]
    return {"exe": os.path.realpath(sys.executable), "exe_file": stamp(sys.executable), "where": where,
            "torch": files, "loader": stamp("/etc/ld.so.cache"), "driver": text("/proc/driver/nvidia/version"),
            "boot": text("/proc/sys/kernel/random/boot_id"), "devices": gpus,
            "env": {k: os.environ.get(k) for k in names}}
def library(path):
    s = os.stat(path)
    return [path, s.st_size, s.st_mtime_ns, s.st_ino]
def loaded():
    libs = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.rstrip("\\n").split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/") or parts[5].startswith(("/dev/", "/memfd:")):
                continue
            if ".so" not in os.path.basename(parts[5]) or parts[5] in libs:
                continue
            if parts[5].endswith(" (deleted)"):
                return None
            libs[parts[5]] = library(parts[5])
    return sorted(libs.values())
def modules(where):
    inside, files = os.path.join(where, ""), {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path) or path.startswith(inside) or path in files:
            continue
        try:
            files[path] = library(path)
        except OSError:
            continue
    return sorted(files.values())
def exact(value, kind):
    return type(value) is kind
def well_formed(kept):
    if not (exact(kept, dict) and sorted(kept) == ["answer", "at", "key", "libs", "modules"]):
        return False
    answer, libs = kept["answer"], kept["libs"]
    if not (exact(answer, dict) and sorted(answer) == ["cuda_available", "cuda_devices", "warnings"]):
        return False
    said, devices = answer["warnings"], answer["cuda_devices"]
    if not (answer["cuda_available"] is True and exact(devices, int) and 0 < devices <= 4096
            and exact(said, list) and len(said) <= 3 and all(exact(w, str) and len(w) <= 500 for w in said)):
        return False
    if not (exact(kept["at"], str) and re.fullmatch(r"\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ", kept["at"])):
        return False
    return exact(kept["key"], dict) and stamps(libs) and stamps(kept["modules"])
def stamps(files):
    return exact(files, list) and len(files) <= 100000 and all(
        exact(lib, list) and len(lib) == 4 and exact(lib[0], str) and lib[0].startswith("/")
        and all(exact(n, int) for n in lib[1:]) for lib in files)
def unchanged(libs):
    for lib in libs:
        try:
            if library(lib[0]) != lib:
                return False
        except OSError:
            return False
    return True
def recall(path, key):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not (mine(os.fstat(fd)) and home(path)):
            return None
        data = f.read(LIMIT + 1)
    try:
        kept = json.loads(data.decode()) if len(data) <= LIMIT else None
    except (ValueError, RecursionError):
        kept = None
    if not well_formed(kept):
        os.unlink(path)
        return None
    if json.dumps(kept["key"], sort_keys=True) != json.dumps(key, sort_keys=True):
        return None
    if not (unchanged(kept["libs"]) and unchanged(kept["modules"])):
        return None
    return dict(kept["answer"], cached_at=kept["at"])
def remember(path, key, answer, libs, mods):
    os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
    if not home(path):
        return
    tmp = path + "." + str(os.getpid())
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        json.dump({"key": key, "libs": libs, "modules": mods, "answer": answer, "at": at}, f)
    os.replace(tmp, path)
def cached(step, *args):
    try:
        return step(*args)
    except Exception:
        return None
try:
    spec = importlib.util.find_spec("torch")
except Exception as exc:
    spec, out["torch_error"] = None, f"{type(exc).__name__}: {exc}"
if spec is not None and spec.submodule_search_locations:
    where = list(spec.submodule_search_locations)[0]
    out["torch_path"] = where
    scope = {}
    try:
        exec(open(where + "/version.py").read(), scope)
        out["torch"], out["cuda_build"] = scope.get("__version__"), scope.get("cuda")
    except Exception as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    cache = os.environ.get("CA_IMPORT_CACHE")
    key = cached(fingerprint, where) if cache and sys.argv[1:] == ["import"] else None
    seen = cached(recall, cache, key) if key else None
    if seen is not None and "torch_error" not in out:
        out.update(seen)
    elif sys.argv[1:] == ["import"] and "torch_error" not in out:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                import torch
                out["cuda_available"] = torch.cuda.is_available()
                out["cuda_devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
            except Exception as exc:
                out["torch_error"] = f"{type(exc).__name__}: {exc}"
        out["warnings"] = [str(w.message)[:500] for w in caught][:3]
        good = key and out.get("cuda_available") is True and "torch_error" not in out
        libs, mods = (cached(loaded), cached(modules, where)) if good else (None, None)
        if libs is not None and mods is not None:
            answer = {k: out[k] for k in ("cuda_available", "cuda_devices", "warnings")}
            cached(remember, cache, key, answer, libs, mods)
print(json.dumps(out))
"""
COMMAND = "python3 -c SCRIPT"  # the shape; each profile's interpreter is in command_for(profile)

REASONS = declare(
    Reason(
        "python_missing",
        Status.FAIL,
        "probes.python names no interpreter on the node: set it to the Python that has torch (a venv's bin/python3)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "torch_missing",
        Status.FAIL,
        "torch is not installed for probes.python: install a build for the node's driver (pip install torch) "
        "or point probes.python at the interpreter that has it",
        Action.FIX_CONFIG,
    ),
    Reason(
        "torch_broken",
        Status.FAIL,
        "torch is there but does not import: reinstall it (the error names the missing library)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "torch_no_cuda",
        Status.FAIL,
        "a CPU-only build of torch on a CUDA node: install a CUDA build (e.g. pip install torch from the cu12x index)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "cuda_driver_too_old",
        Status.FAIL,
        "torch is built for a newer CUDA than the driver supports: install a torch built for the driver's CUDA, "
        "or upgrade the driver",
        Action.FIX_CONFIG,
    ),
    Reason(
        "cuda_minor_newer",
        Status.WARN,
        "torch's CUDA minor version is newer than the driver's: it runs through minor-version compatibility, but "
        "kernels that need PTX JIT compilation fail; match them when you can",
        Action.FIX_CONFIG,
    ),
    Reason(
        "cuda_unavailable",
        Status.FAIL,
        "a CUDA build of torch that sees no GPU: read torch's warning (driver, CUDA_VISIBLE_DEVICES, device nodes)",
        Action.CHECK_NODE,
    ),
    Reason(
        KEPT_ANSWER,
        Status.PASS,
        "torch's answer was taken as an earlier check of the node got it (nothing it rests on changed): torch was "
        "not imported again, so a drain for the interpreter stays until a check imports it",
    ),
    Reason("cuda_unknown", Status.SKIP, "the driver's CUDA version is unknown (nvidia-smi fails or prints none)"),
    Reason("cpu_device", Status.SKIP, "the profile probes on the CPU (probes.device: cpu): CUDA is not needed"),
)


def command_for(profile: Profile) -> str:
    """The node-side command for ``profile``'s interpreter: whether it exists, torch's version and build, and on
    a CUDA profile the driver's CUDA version and whether torch sees the GPUs."""
    python = shlex.quote(profile.probes.python)
    cuda = profile.probes.device == "cuda"
    smi = "nvidia-smi 2>/dev/null | grep -m1 -o 'CUDA Version: *[0-9.]*'; " if cuda else ""
    # from /: ``-c`` puts the working directory first on sys.path, and a job's user may own the one it starts in
    run = f"(cd / && {python} -c {shlex.quote(_SCRIPT)}{' import' if cuda else ''}) 2>&1"
    return (
        f"{smi}if command -v {python} >/dev/null 2>&1; then printf '{_MARK}found\\n'; {run}; "
        f"else printf '{_MARK}missing\\n'; fi"
    )


@dataclass(frozen=True)
class ProbePython:
    found: bool = False
    info: dict[str, object] | None = None  # what the interpreter printed
    driver_cuda: tuple[int, int] | None = None
    error: str | None = None
    raw: str = ""


def parse(stdout: str, exit_code: int | None) -> ProbePython:
    driver = _DRIVER_CUDA.search(stdout.partition(_MARK)[0])
    driver_cuda = (int(driver.group(1)), int(driver.group(2))) if driver else None
    _, mark, rest = stdout.partition(_MARK)
    if not mark:
        return ProbePython(driver_cuda=driver_cuda, error="no answer from the interpreter check", raw=stdout)
    state, _, body = rest.partition("\n")
    if state.strip() == "missing":
        return ProbePython(found=False, driver_cuda=driver_cuda, raw=stdout)
    for line in reversed(body.splitlines()):
        if line.startswith("{"):
            try:
                info = json.loads(line)
            except ValueError:
                break
            if isinstance(info, dict):
                return ProbePython(found=True, info=info, driver_cuda=driver_cuda, raw=stdout)
    return ProbePython(found=True, driver_cuda=driver_cuda, error="the interpreter printed no report", raw=stdout)


def _text(info: dict[str, object], key: str) -> str | None:
    value = info.get(key)
    return str(value) if value is not None else None


def _cuda_row(info: dict[str, object], driver: tuple[int, int] | None) -> CheckRow:
    build = _text(info, "cuda_build")
    if build is None:
        return CheckRow(NAME, "cuda", Status.FAIL, "torch_no_cuda", f"torch {info.get('torch')} (CPU build)", "CUDA")
    match = _CUDA.match(build)
    wanted = f"<= {driver[0]}.{driver[1]} (the driver's CUDA)" if driver else None
    built = (int(match.group(1)), int(match.group(2))) if match else None
    if driver is not None and built is not None and built[0] > driver[0]:
        return CheckRow(NAME, "cuda", Status.FAIL, "cuda_driver_too_old", f"torch built for CUDA {build}", wanted)
    if info.get("cuda_available") is False:  # judged even where nvidia-smi is absent (inside a container)
        said = "; ".join(str(w) for w in info.get("warnings") or []) or "torch.cuda.is_available() is False"  # type: ignore[attr-defined]
        return CheckRow(NAME, "cuda", Status.FAIL, "cuda_unavailable", f"CUDA {build}, no GPU seen", wanted, said)
    if driver is None or built is None:
        return CheckRow(NAME, "cuda", Status.SKIP, "cuda_unknown", build, None)
    if built > driver:
        return CheckRow(NAME, "cuda", Status.WARN, "cuda_minor_newer", f"torch built for CUDA {build}", wanted)
    devices = info.get("cuda_devices")
    detail = f"torch sees {devices} GPUs" if devices is not None else ""
    if info.get("cached_at"):
        detail += f" (as torch's import answered at {info['cached_at']}: the install, driver and boot are unchanged)"
    return CheckRow(NAME, "cuda", Status.PASS, "ok", f"CUDA {build}", wanted, detail)


def evaluate(model: ProbePython, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    python = profile.probes.python
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if not model.found or model.info is None:
        return [CheckRow(NAME, "python", Status.FAIL, "python_missing", "not found", python)]
    info = model.info
    rows = [
        CheckRow(NAME, "python", Status.PASS, "ok", f"Python {info.get('python')}", python, str(info.get("executable")))
    ]
    error = _text(info, "torch_error")
    if info.get("torch") is None and error is None:
        rows.append(CheckRow(NAME, "torch", Status.FAIL, "torch_missing", "not installed", f"torch for {python}"))
        return rows
    if error is not None:
        reason = "torch_missing" if "No module named 'torch'" in error else "torch_broken"
        rows.append(CheckRow(NAME, "torch", Status.FAIL, reason, _text(info, "torch"), "torch imports", error))
        return rows
    rows.append(CheckRow(NAME, "torch", Status.PASS, "ok", f"torch {info['torch']}", None, str(info.get("torch_path"))))
    if profile.probes.device != "cuda":
        rows.append(CheckRow(NAME, "cuda", Status.SKIP, "cpu_device", _text(info, "cuda_build"), None))
    else:
        rows.append(_cuda_row(info, model.driver_cuda))
    if info.get("cached_at"):  # what the rows say rests on an earlier import: no retest (checks.base.retested)
        why = "torch was not imported again: nothing its import rests on changed since"
        said = f"as answered at {info['cached_at']}"
        rows.append(CheckRow(NAME, "import", Status.PASS, KEPT_ANSWER, said, None, why))
    return rows


def cluster_values(model: ProbePython) -> dict[str, str]:
    if model.info is None:
        return {}
    return {"torch": str(model.info.get("torch")), "torch_cuda": str(model.info.get("cuda_build"))}


def suggest_values(model: ProbePython, others: NodeModels) -> SuggestedValues:
    """The probes' Python and what its torch is (``profile suggest``)."""
    info = model.info
    if not model.found or info is None:
        return {"probes.python": NOT_FOUND}
    torch, build = info.get("torch"), info.get("cuda_build")
    if info.get("torch_error") or torch is None:
        said = "no torch" if torch is None else f"torch {torch} does not import"
    else:
        said = f"torch {torch}, " + (f"CUDA {build}" if build else "CPU build")
    return {"probes.python": str(info.get("executable") or ""), "probes.torch": said}


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    command_for=command_for,
    timeout_s=TIMEOUT_S,
    job_view=True,
    expectations=(Expectation("probes.python", "preflight", NAME, always),),
    samples=(
        healthy("h100x1_cuda_profile", {"ok"}, fixture="probe_python/h100x1_cuda_profile.txt"),
        fault("cpu_torch_cuda_profile", {"torch_no_cuda"}, fixture="probe_python/cpu_torch_cuda_profile.txt"),
        dead("torch_missing", {"torch_missing"}, fixture="probe_python/torch_missing.txt"),
        dead("python_missing", {"python_missing"}, fixture="probe_python/python_missing.txt"),
    ),
)
