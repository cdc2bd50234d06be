"""pandas and pyarrow's Parquet reader, imported where they are first used rather than where they are named.

A node checking itself at every job start (``cluster-accept check --local``, a Slurm prolog) loads the checks, the
inventory and the probes' declarations, and judges a few dozen rows: importing pandas (and numpy, pyarrow) for that
is about 0.6 s of a two-second budget. The modules that use frames name pandas through this module; the first
attribute read imports it, and from then on reads go straight to the module's own names.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any


class _OnFirstUse(ModuleType):
    """A stand-in for a module, which imports it on the first attribute read and takes on its names."""

    def __getattr__(self, name: str) -> Any:
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)
        return getattr(module, name)


if TYPE_CHECKING:
    import pandas as pandas
    import pyarrow.parquet as parquet
else:
    pandas = _OnFirstUse("pandas")
    parquet = _OnFirstUse("pyarrow.parquet")
