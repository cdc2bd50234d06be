"""Faults planted in the simulated GPUs' torch: one GPU's matrix products come back with one bit flipped (a silent
data corruption), or, from some time on, take longer (a co-tenant sharing that GPU).

The test-bed's "GPUs" are CPU processes named ``gpu<k>`` by the burn probe. For a node with the ``sdc`` fault the
test-bed puts a ``sitecustomize`` on the node's ``PYTHONPATH`` that wraps ``torch.matmul`` once torch is
imported: in the process of the planted GPU, a product returned as a new tensor has the lowest bit of its first
word flipped, as a GPU with a bad SM would return it, without any error. Nothing else on the node changes.
"""

from __future__ import annotations

from pathlib import Path

_TEMPLATE = '''"""Test-bed fault ``sdc``: flips one bit of the products of the process named {name!r}."""
import builtins
import multiprocessing
import sys

_import = builtins.__import__


def _wrap(torch):
    real = torch.matmul

    def matmul(*args, **kwargs):
        result = real(*args, **kwargs)
        if "out" not in kwargs and multiprocessing.current_process().name == {name!r}:
            if result.dtype == torch.float32 and result.numel():
                result.view(-1).view(torch.int32)[0] ^= 1
        return result

    torch.matmul = matmul
    torch._testbed_sdc = True


def _import_and_wrap(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    torch = sys.modules.get("torch")
    if name == "torch" and torch is not None and not hasattr(torch, "_testbed_sdc"):
        spec = getattr(torch, "__spec__", None)
        if not getattr(spec, "_initializing", False) and hasattr(torch, "matmul"):  # once torch has finished
            _wrap(torch)
    return module


builtins.__import__ = _import_and_wrap
'''


_SLOWER = '''"""Test-bed fault ``cotenant``: from {after_s}s after its first product, the process named {name!r} takes
{slowdown}x as long for each (another job shares its GPU)."""
import builtins
import multiprocessing
import sys
import time

_import = builtins.__import__
_first = []


def _wrap(torch):
    real = torch.matmul

    def matmul(*args, **kwargs):
        started = time.monotonic()
        result = real(*args, **kwargs)
        if multiprocessing.current_process().name == {name!r}:
            _first.append(started) if not _first else None
            if started - _first[0] >= {after_s}:
                time.sleep(({slowdown} - 1) * (time.monotonic() - started))
        return result

    torch.matmul = matmul
    torch._testbed_cotenant = True


def _import_and_wrap(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    torch = sys.modules.get("torch")
    if name == "torch" and torch is not None and not hasattr(torch, "_testbed_cotenant"):
        spec = getattr(torch, "__spec__", None)
        if not getattr(spec, "_initializing", False) and hasattr(torch, "matmul"):  # once torch has finished
            _wrap(torch)
    return module


builtins.__import__ = _import_and_wrap
'''


def write_slower(directory: Path, gpu: int, after_s: float, slowdown: float) -> Path:
    """``directory/sitecustomize.py`` slowing GPU ``gpu``'s products ``slowdown`` times from ``after_s`` seconds
    after its first; put ``directory`` on PYTHONPATH."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sitecustomize.py"
    path.write_text(_SLOWER.format(name=f"gpu{gpu}", after_s=after_s, slowdown=slowdown), encoding="utf-8")
    return path


def write_sitecustomize(directory: Path, gpu: int) -> Path:
    """``directory/sitecustomize.py`` flipping a bit of GPU ``gpu``'s products; put ``directory`` on PYTHONPATH."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sitecustomize.py"
    path.write_text(_TEMPLATE.format(name=f"gpu{gpu}"), encoding="utf-8")
    return path
