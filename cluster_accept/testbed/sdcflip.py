"""Faults planted in the simulated GPUs' torch: one GPU's matrix products come back with one bit flipped (a silent
data corruption), or, from some time on, take longer (a co-tenant sharing that GPU); or every product of the
node takes longer (a node slower than its peers).

The test-bed's "GPUs" are CPU processes named ``gpu<k>`` by the burn probe. For a node with the ``sdc``,
``cotenant`` or ``slower`` fault the test-bed puts a ``sitecustomize`` on the node's ``PYTHONPATH`` that wraps
``torch.matmul`` once torch is imported: in the process of the planted GPU only for ``sdc`` and ``cotenant``, in
every process of the node for ``slower``. ``sdc``: a product returned as a new tensor has the lowest bit of its
first word flipped, as a GPU with a bad SM would return it, without any error. ``cotenant``: from some seconds
after its first product, each takes several times as long. ``slower``: each product, written into ``out=`` or
not, takes ``factor`` times its own time (the GPU bench's GEMM is ``torch.matmul(a, b, out=c)``; the training
probe's model, ``nn.Linear`` and ``scaled_dot_product_attention``, does not pass through ``torch.matmul`` and
keeps its speed). Nothing else on the node changes.
"""

from __future__ import annotations

from pathlib import Path

# Wraps torch.matmul with _wrap(torch, real) once torch has finished importing (each fault writes _wrap).
_HOOK = """
import builtins
import multiprocessing
import sys
import time

_import = builtins.__import__
_PLANTED = {name!r}


def _import_and_wrap(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    torch = sys.modules.get("torch")
    if name == "torch" and torch is not None and not hasattr(torch, "_testbed_fault"):
        spec = getattr(torch, "__spec__", None)
        if not getattr(spec, "_initializing", False) and hasattr(torch, "matmul"):  # once torch has finished
            torch.matmul = _wrap(torch, torch.matmul)
            torch._testbed_fault = True
    return module


builtins.__import__ = _import_and_wrap
"""

_FLIP = '''"""Test-bed fault ``sdc``: flips one bit of the products of the process named {name!r}."""
{hook}

def _wrap(torch, real):
    def matmul(*args, **kwargs):
        result = real(*args, **kwargs)
        if "out" not in kwargs and multiprocessing.current_process().name == _PLANTED:
            if result.dtype == torch.float32 and result.numel():
                result.view(-1).view(torch.int32)[0] ^= 1
        return result

    return matmul
'''

_SLOWER = '''"""Test-bed fault ``cotenant``: from {after_s}s after its first product, the process named {name!r} takes
{slowdown}x as long for each (another job shares its GPU)."""
{hook}
_first = []


def _wrap(torch, real):
    def matmul(*args, **kwargs):
        started = time.monotonic()
        result = real(*args, **kwargs)
        if multiprocessing.current_process().name == _PLANTED:
            _first.append(started) if not _first else None
            if started - _first[0] >= {after_s}:
                time.sleep(({slowdown} - 1) * (time.monotonic() - started))
        return result

    return matmul
'''


# Every process: the wait ends at ``factor`` times the product's own time, slept to within 0.3 ms and spun for
# the rest (a sleep alone overshoots by about 0.1 ms, most of the 0.15 ms that a 1 ms GEMM is to take longer).
_EVERY = '''"""Test-bed fault ``slower``: every product, in every process of the node, takes {factor}x as long."""
{hook}

def _wait_until(deadline):
    left = deadline - time.perf_counter()
    if left > 0.0005:
        time.sleep(left - 0.0003)
    while time.perf_counter() < deadline:
        pass


def _wrap(torch, real):
    def matmul(*args, **kwargs):
        started = time.perf_counter()
        result = real(*args, **kwargs)
        _wait_until(started + {factor} * (time.perf_counter() - started))
        return result

    return matmul
'''


def _write(directory: Path, template: str, gpu: int | None, **values: float) -> Path:
    name = f"gpu{gpu}" if gpu is not None else ""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sitecustomize.py"
    path.write_text(template.format(name=name, hook=_HOOK.format(name=name), **values), encoding="utf-8")
    return path


def write_slower(directory: Path, gpu: int, after_s: float, slowdown: float) -> Path:
    """``directory/sitecustomize.py`` slowing GPU ``gpu``'s products ``slowdown`` times from ``after_s`` seconds
    after its first; put ``directory`` on PYTHONPATH."""
    return _write(directory, _SLOWER, gpu, after_s=after_s, slowdown=slowdown)


def write_sitecustomize(directory: Path, gpu: int) -> Path:
    """``directory/sitecustomize.py`` flipping a bit of GPU ``gpu``'s products; put ``directory`` on PYTHONPATH."""
    return _write(directory, _FLIP, gpu)


def write_every_slower(directory: Path, factor: float) -> Path:
    """``directory/sitecustomize.py`` making every ``torch.matmul`` of every process of the node take ``factor``
    times as long; put ``directory`` on PYTHONPATH."""
    return _write(directory, _EVERY, None, factor=factor)
