"""What the key bias costs: parameters, optimizer memory and time (notebook 06, `make bench`).

The study is split along its layers:

- `keybias.studies.cost.memory`: exact counts of what b_k occupies, checked against real modules;
- `keybias.studies.cost.traffic`: the kernels and bytes removing b_k takes out of one step,
  counted (not timed): the bound on the saving;
- `keybias.studies.cost.measure`: transformer blocks at BERT-base and GPT-2 small sizes with and
  without b_k, timed interleaved against an identical control (returns DataFrames);
- `keybias.studies.cost.stats`: paired ratio estimators and bootstrap intervals (pure);
- `keybias.studies.cost.judge`: the byte model of the removed work, the GPU prediction, claims and
  macros (pure: DataFrames in, so tests can hand it doctored data);
- `keybias.studies.cost.show`: the paper's tables and the figure.

This module declares the notebook's parameters, its typed config `CostConfig` and the
machine-specific outputs; the full
benchmark runs from the command line (`make bench`, `keybias.studies.cost.bench`).
"""

from __future__ import annotations

import dataclasses

from keybias.studies.config import StudyConfig
from keybias.studies.cost.measure import (
    ATTENTIONS,
    BLOCKS,
    CLOCKS,
    MIN_REPS,
    PASSES,
    check_settings,
)
from keybias.studies.params import Param, ParameterError

PARAMETERS = {
    "blocks": Param(str, many=True, choices=tuple(BLOCKS), help="transformer blocks timed (tiny is a test size)"),
    "seq_lens": Param(int, many=True, positive=True, help="sequence lengths (keys and queries)"),
    "batch": Param(int, positive=True, help="batch size"),
    "attentions": Param(str, many=True, choices=ATTENTIONS, help="self or cross attention"),
    "passes": Param(str, many=True, choices=PASSES, help="inference (forward) and/or a training step"),
    "min_reps": Param(int, minimum=MIN_REPS, help="interleaved repetitions per configuration, at least (run even past the budget)"),
    "max_reps": Param(int, minimum=MIN_REPS, help="repetitions per configuration, at most"),
    "budget_seconds": Param(float, positive=True,
                            help="wall-clock timing budget of all configurations together (past min_reps)"),
    "target_half_width": Param(float, minimum=0.0, maximum=1.0,
                               help="stop once the control's interval half-width is this small (0: never early)"),
    "warmup": Param(int, minimum=1, help="warm-up steps per implementation"),
    "min_rep_seconds": Param(float, minimum=0.0, help="each repetition loops a step until this long"),
    "threads": Param(int, positive=True, help="CPU threads (set with torch.set_num_threads, pinned and recorded)"),
    "clock": Param(str, choices=tuple(CLOCKS), help="process CPU time (robust to a shared machine) or wall time"),
    "optimizer": Param(str, choices=("adam", "sgd_momentum"), help="optimizer of the training step"),
    "n_boot": Param(int, minimum=200, help="bootstrap resamples per interval"),
    "seed": Param(int, minimum=0, help="base seed of weights, inputs, order and bootstrap (per-configuration seeds derive from it)"),
    "architecture_check": Param(str, choices=("transformers", "torch"),
                                help="real modules the counts are checked against (transformers models, or torch.nn blocks)"),
    "byte_margin": Param(float, minimum=0.001, maximum=1.0,
                         help="margin of the byte model's test, as a share of the pass (fixed before the run)"),
}

@dataclasses.dataclass(frozen=True)
class CostConfig(StudyConfig):
    """Every setting of notebook 06, validated once against `PARAMETERS` (and the repetition
    settings against each other); defaults = the smoke profile."""

    PARAMETERS = PARAMETERS
    STUDY = "06_cost"

    blocks: tuple[str, ...] = ("tiny",)
    seq_lens: tuple[int, ...] = (16,)
    batch: int = 2
    attentions: tuple[str, ...] = ("self", "cross")
    passes: tuple[str, ...] = ("inference", "training")
    min_reps: int = 30
    max_reps: int = 30
    budget_seconds: float = 5.0
    target_half_width: float = 0.0
    warmup: int = 2
    min_rep_seconds: float = 0.0
    threads: int = 1
    clock: str = "process"
    optimizer: str = "adam"
    n_boot: int = 500
    seed: int = 0
    architecture_check: str = "torch"
    # the smoke profile times a tiny block whose steps last a fraction of a millisecond: its timing
    # resolves nothing, so its margin is the whole pass (the claims run the code, not the science)
    byte_margin: float = 1.0

    def check(self) -> None:
        try:
            check_settings(min_reps=self.min_reps, max_reps=self.max_reps, budget_seconds=self.budget_seconds,
                           target_half_width=self.target_half_width)
        except ValueError as exc:
            raise ParameterError(f"{self.STUDY}: {exc}") from exc
        for name in ("blocks", "seq_lens", "attentions", "passes"):
            if not getattr(self, name):
                raise ParameterError(f"{self.STUDY}.{name} must name at least one value")


# Outputs whose values depend on the machine (timings); verification against committed
# results must skip them. Paths relative to results/.
MACHINE_SPECIFIC_OUTPUTS = [
    "machine/cost_*",
    "figures/cost_time_saving.pdf",
    "figures/cost_time_saving.png",
    "tables/cost_timing*.tex",
    "macros/06_cost_machine.tex",  # timings, load and resolution; macros/06_cost.tex holds the counts
    "steps/06_cost.json",
    # timings never live under data/: a stale copy there must never be compared
    "data/cost_timing*.csv",
    "data/cost_bench*",
]

# `make bench`: every block, both sequence lengths, both attentions, both passes.
FULL_BENCH = dict(blocks=["BERT-base", "GPT-2 small"], seq_lens=[128, 512], batch=8, attentions=list(ATTENTIONS),
                  passes=list(PASSES), min_reps=30, max_reps=400, budget_seconds=7200.0, target_half_width=0.008,
                  warmup=3, min_rep_seconds=0.0, optimizer="adam", n_boot=4000, seed=0, clock="process")
QUICK_BENCH = dict(FULL_BENCH, blocks=["tiny"], seq_lens=[16], batch=2, max_reps=30, budget_seconds=5.0,
                   target_half_width=0.0, n_boot=500)
