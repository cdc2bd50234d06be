"""A profile's ``burn`` block: the burn-in, the silent-data-corruption check and DCGM's diagnostics.

A node that passes a one-minute benchmark can still fail a week into a job; the burn stage loads every GPU at
once for minutes, watching clocks, throttle reasons, XIDs and ECC counters, then checks that every GPU computes
bitwise the same product, and runs ``dcgmi diag`` where the node has DCGM. Strict like the rest of the profile:
a setting that would leave the burn unjudgeable is refused when loaded.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MIN_SAMPLES = 8  # fewer samples than this over a burn cannot tell its first part from its last
# The limits that judge the sustained load (not the silent-data check or DCGM, which run without it).
LOAD_LIMITS = ("throughput_drop_max_pct", "clock_drop_max_pct", "temp_spread_max_c", "temp_above_median_max_c")
# The thermal gate's defaults: the spread between a node's GPUs under sustained load, and one GPU's distance above
# its node's median (4 x H100 under a 3-minute burn spread 8 °C, none more than 3 °C above their median:
# bench/results/h100x4-hgx/).
TEMP_SPREAD_MAX_C = 10.0
TEMP_ABOVE_MEDIAN_MAX_C = 6.0


class BurnSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .inf and NaN are no setting

    minutes: Annotated[float, Field(ge=0, le=1440)] = Field(
        default=10.0, description="sustained load per node in acceptance (full) and in the burn suite; 0: none"
    )
    light_minutes: Annotated[float, Field(ge=0, le=1440)] = Field(
        default=2.0, description="sustained load in the light suite (scheduled checks of idle nodes); 0: none"
    )
    sample_interval_s: Annotated[float, Field(ge=0.2, le=60)] = Field(
        default=1.0, description="how often clocks, power, temperature, throttle reasons and ECC are sampled"
    )
    throughput_drop_max_pct: Annotated[float, Field(ge=0, le=100)] = Field(
        default=10.0, description="a GPU whose throughput in the burn's last part falls more below its first part fails"
    )
    clock_drop_max_pct: Annotated[float, Field(ge=0, le=100)] = Field(
        default=10.0,
        description="a GPU whose SM clock falls more than this under its first part or its node's other GPUs, "
        "with a thermal or power reason active, fails",
    )
    temp_spread_max_c: Annotated[float, Field(gt=0, le=100)] = Field(
        default=TEMP_SPREAD_MAX_C,
        description="the widest temperature spread between a node's GPUs under sustained load (late-part medians)",
    )
    temp_above_median_max_c: Annotated[float, Field(gt=0, le=100)] = Field(
        default=TEMP_ABOVE_MEDIAN_MAX_C,
        description="a GPU hotter than its node's median by more than this under sustained load fails (runs_hot)",
    )
    sdc: bool = Field(default=True, description="check that every GPU computes bitwise the same product")
    sdc_repeats: Annotated[int, Field(ge=1, le=100)] = 3
    dcgm_level: Literal[1, 2, 3, 4] | None = Field(
        default=None,
        description="run `dcgmi diag -r LEVEL -j` where the node has DCGM (1 quick … 4 extended; the light suite "
        "runs level 1); nodes without dcgmi get a skip row",
    )
    dcgm_timeout_s: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=3600.0, description="how long dcgmi diag may run on a node before it is killed"
    )

    def seconds(self, quick: bool) -> float:
        """The burn's length in the light suite (``quick``) or otherwise."""
        return 60.0 * (self.light_minutes if quick else self.minutes)

    def dcgm(self, quick: bool) -> int | None:
        """The DCGM level the suite runs: level 1 in the light suite, the profile's otherwise."""
        return None if self.dcgm_level is None else (1 if quick else self.dcgm_level)

    @property
    def runs(self) -> bool:
        """Whether the burn stage has anything to do on a node of this profile."""
        return self.minutes > 0 or self.light_minutes > 0 or self.sdc or self.dcgm_level is not None

    @model_validator(mode="after")
    def _enough_samples(self) -> BurnSettings:
        for key, minutes in (("minutes", self.minutes), ("light_minutes", self.light_minutes)):
            if 0 < minutes * 60 < MIN_SAMPLES * self.sample_interval_s:
                raise ValueError(
                    f"burn.{key} {minutes:g} gives fewer than {MIN_SAMPLES} samples at sample_interval_s "
                    f"{self.sample_interval_s:g}: burn longer or sample more often"
                )
        return self

    @model_validator(mode="after")
    def _load_limits_need_the_load(self) -> BurnSettings:
        """A drop limit judges the sustained load: one written for a burn that never loads the GPUs would judge
        nothing on every node, while the operator reads it as a promise."""
        written = [key for key in LOAD_LIMITS if key in self.model_fields_set]
        if written and self.minutes == 0 and self.light_minutes == 0:
            raise ValueError(
                f"burn.{', burn.'.join(written)} judge the sustained load, and burn.minutes and burn.light_minutes "
                "are 0: it never runs; leave them out, or burn for some minutes"
            )
        return self
