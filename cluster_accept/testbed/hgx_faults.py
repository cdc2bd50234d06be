"""An HGX node's board on the test-bed, and its faults: NVSwitches on the PCI bus and Fabric Manager in a state,
NVSwitch errors (SXIDs) in the kernel log, PCIe AER counters. Kept beside :mod:`testbed.faults`, which lists
them in its plan; :mod:`testbed.pcisys` writes the board into the node's sysfs tree and its tools, and
:mod:`testbed.nodedata` what the GPUs and the kernel log say of it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictStr

from cluster_accept.testbed.fault_base import _Fault


class NvswitchBoard(_Fault):
    """The node is an HGX board: ``switches`` NVSwitches on the PCI bus (``visible`` of them answer) and
    ``nvidia-fabricmanager`` ``running`` at the driver's version (or ``version``), ``stopped``, ``failed`` or
    ``missing``. Where it does not run, each GPU's fabric state stays ``In Progress`` and every NVLink reads
    inactive, as on a real board."""

    kind: Literal["nvswitch_board"] = "nvswitch_board"
    switches: Annotated[int, Field(ge=1, le=16)] = 4
    visible: Annotated[int, Field(ge=0, le=16)] | None = None  # None: all of them
    fabric_manager: Literal["running", "stopped", "failed", "missing"] = "running"
    version: Annotated[StrictStr, Field(pattern=r"^\d+\.\d+(\.\d+)?$")] | None = None

    @property
    def fabric_up(self) -> bool:
        return self.fabric_manager == "running" and self.version is None


class Sxid(_Fault):
    """An NVSwitch error in the kernel log, as the nvidia-nvswitch driver writes it (its severity line, then its
    engine and data lines), stamped when it is planted."""

    kind: Literal["sxid"] = "sxid"
    code: Annotated[int, Field(ge=0)] = 20034
    switch: Annotated[int, Field(ge=0, le=15)] = 0
    fatal: bool = True


class PcieAer(_Fault):
    """A PCIe AER counter of GPU ``gpu`` (``aer_dev_<kind>`` in sysfs) set to ``value``; its link at another
    current speed or width than the maximum."""

    kind: Literal["pcie_aer"] = "pcie_aer"
    gpu: Annotated[int, Field(ge=0, le=63)] = 0
    severity: Literal["correctable", "nonfatal", "fatal"] = "correctable"
    counter: StrictStr = "BadTLP"
    value: Annotated[int, Field(ge=0)] = 1
