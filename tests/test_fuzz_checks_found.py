"""What fuzzing the check parsers found, pinned: hostile numbers in real outputs are read, never raised."""

from __future__ import annotations

from cluster_accept.inventory.model import Profile
from tests.capture import NO_CLUSTER, noheader
from tests.test_fuzz_parsers import CHECKS, PROFILES, _seeds, sample_output


def _driver(machine: str) -> str:
    return sample_output("driver", machine)


def _nvlink(machine: str) -> str:
    return sample_output("nvlink", machine)


def _xid() -> str:
    return sample_output("xid", "xids")


def _infiniband() -> str:
    return sample_output("infiniband", "port_down")


def test_hostile_numbers_in_real_outputs_are_read_not_raised() -> None:
    """What fuzzing found, pinned: a 5000-digit number (``int`` refuses over 4300 digits) or '²' (which
    ``str.isdigit`` takes and ``int`` refuses) where an index, a count or an exit status is expected."""
    huge = "9" * 5000
    gpus = _seeds("gpu_count")[0][0]
    errors = {
        "gpu_count": [gpus.replace("0, NVIDIA", f"{huge}, NVIDIA"), gpus.replace("0, NVIDIA", "², NVIDIA")],
        "driver": [_driver("h200x4").replace("580.159.04\n", f"{huge}.1\n", 1)],
        "nvlink": [
            _nvlink("h200x4").replace("rc=0", "rc=²"),
            _nvlink("h200x4").replace("GPU 1:", f"GPU {huge}:"),
            _nvlink("h200x4").replace("Link 3:", f"Link {huge}:", 1),
            _nvlink("h200x4").replace("Errors: 0", f"Errors: {huge}", 1),
        ],
        "xid": [_xid().replace("### rc=0", f"### rc={huge}"), _xid().replace("lines=4", f"lines={huge}")],
        "infiniband": [_infiniband().replace("ports/1 4:", f"ports/{huge} 4:", 1)],
        "topology": [sample_output("topology", "h200x4").replace("GPU1", f"GPU{huge}")],
    }
    for name, texts in errors.items():
        for text in texts:
            model = CHECKS[name].parse(text, 0)
            assert model.error, (name, text[:80])
            assert [row.reason for row in CHECKS[name].evaluate(model, PROFILES[-1], NO_CLUSTER)] in (
                ["unparsable_output"],
                ["not_in_profile"],  # nvlink without an NVLink spec
            )
    # An exit status only tells a missing nvidia-smi (127): an unreadable one is not that, the versions still read.
    for rc in ("²", huge):
        model = CHECKS["driver"].parse(_driver("h200x4").replace("rc=0", f"rc={rc}"), 0)
        assert (model.error, model.failure, model.version) == (None, None, "580.159.04")
    # A 5000-digit uncorrected ECC count fails the GPU, and is no counter to compare with the last run.
    memory = CHECKS["memory"]
    model = memory.parse(noheader("h200x4", memory.module.FIELDS).replace("0, Enabled, 0,", f"0, Enabled, {huge},"), 0)
    assert sorted(memory.module.counters(model)) == [f"gpu{i}.uncorrected_ecc" for i in (1, 2, 3)]
    assert ("uncorrected_ecc", 0, "fail") in [
        (row.item, row.gpu, row.status.value) for row in memory.evaluate(model, Profile(), NO_CLUSTER)
    ]
    # An Xid line whose code is not a number is an unparsed Xid line: it fails the node.
    model = CHECKS["xid"].parse(_xid().replace("): 48,", f"): {huge},"), 0)
    assert model.error is None and len(model.unparsed) == 2
    assert "xid_unparsed" in [row.reason for row in CHECKS["xid"].evaluate(model, Profile(), NO_CLUSTER)]
