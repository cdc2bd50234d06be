"""The training probe's model shapes: the presets a profile names and the dimensions it may override."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    layers: int
    width: int
    heads: int
    seq_len: int
    micro_batch: int
    vocab: int = 50304  # GPT-2's 50,257 padded to a multiple of 64

    @property
    def tokens_per_step(self) -> int:
        """Tokens one rank trains on per step."""
        return self.micro_batch * self.seq_len


# Presets: the CPU test-bed's tiny model, GPT-2 small and medium shapes at sequence 2048, and GPT-3 XL's.
PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(layers=2, width=64, heads=4, seq_len=64, micro_batch=4, vocab=512),
    "125m": ModelShape(layers=12, width=768, heads=12, seq_len=2048, micro_batch=8),
    "350m": ModelShape(layers=24, width=1024, heads=16, seq_len=2048, micro_batch=8),
    "1.3b": ModelShape(layers=24, width=2048, heads=16, seq_len=2048, micro_batch=4),
}


def default_preset(device: str, quick: bool) -> str:
    """The preset a profile that names none runs: tiny on CPU, 125m for the light suite, 350m otherwise."""
    if device == "cpu":
        return "tiny"
    return "125m" if quick else "350m"
