"""One iteration's run in three parts: what every rank program reads (RunInputs, frozen), what
each rank program changes (its RankState, training/pipeline/steps.py), and what the programs
record for after the run (RunResults). `Run` holds the three once the iteration is over.
"""

from dataclasses import dataclass, field

import numpy as np

from simsp.scenario.config import Scenario
from simsp.training.driver.world import World


@dataclass(frozen=True)
class NumericData:
    """Numeric mode's data: the global batch, the full parameters, and a perturbation of the
    embedding output (finite differences, training/driver/gradcheck.py)."""

    tokens: np.ndarray  # (s, B)
    targets: np.ndarray  # (s, B)
    params: dict  # canonical name -> full parameter (model/params.py shapes)
    embedding_delta: np.ndarray | None = None  # (s, B, h) added to the embedding output


@dataclass(frozen=True)
class RunInputs:
    """What every rank program of one iteration reads; none reassigns it. The world is the
    simulated cluster the programs act on (its clock, links, ranks and p2p mailbox move as
    they run); `layers` runs each layer step (LayerTemplates remember what they record)."""

    sc: Scenario
    world: World
    plans: dict  # rank -> StagePlan (training/pipeline/plan.py)
    shortcuts: object  # the Shortcuts verdict this run takes (which scale shortcuts)
    layers: object  # model/replay.py DirectLayers, or LayerTemplates under shortcuts.templates
    data: NumericData | None = None  # numeric mode only
    # training/pipeline/step_replay.py StepReplays of the replicas placed unlike replica 0
    # (shortcuts/plan.py step_replay_why_not), else None
    replays: object = None

    @property
    def replayed(self) -> frozenset:
        """The simulated ranks that replay their steps (timing only: their ledgers partial,
        untraced; the reports show replica 0's rank of their stage in their place)."""
        return frozenset() if self.replays is None else self.replays.ranks

    def rank_of(self, tp: int, dp: int, pp: int, cp: int = 0) -> int:
        """The global rank at these coordinates (cluster/grid.py)."""
        return self.world.grid.rank_of(tp, dp, pp, cp)

    @property
    def total_steps(self) -> int:
        """Schedule steps of all simulated ranks in this iteration (the progress bar's total)."""
        return sum(len(self.plans[rank].steps) for rank in self.world.ranks)


@dataclass
class RunResults:
    """What the rank programs record, each entry written once, read after the run."""

    losses: dict = field(default_factory=dict)  # (dp, micro_batch, cp) -> summed token loss
    mtp_losses: dict = field(default_factory=dict)  # (dp, micro_batch, depth) -> masked sum
    embedding_grads: dict = field(default_factory=dict)  # (tp, dp, mb, cp) -> (s_l, b, h) grad
    steps: dict = field(default_factory=dict)  # rank -> [(kind, mb, chunk, begin_s, end_s)]
    end_s: dict = field(default_factory=dict)  # rank -> time its program finished
    on_step: object = None  # optional callback(now_s) after every schedule step (progress)
    pairing: set = field(default_factory=set)  # ranks inside a paired step: traced after it

    def record_step(self, r, kind: str, mb: int, chunk: int, begin_s: float) -> None:
        """A schedule step's busy interval: from its input's arrival to its end."""
        now = r.env.now
        self.steps.setdefault(r.rank, []).append((kind, mb, chunk, begin_s, now))
        if r.trace is not None and r.rank not in self.pairing:
            r.trace.add_span(r.rank, "schedule", f"{kind}{mb}.{chunk}", begin_s, now)
        if self.on_step is not None:
            self.on_step(now)

    def trace_steps(self, r, first: int) -> None:
        """Trace the rank's steps from index `first` (a paired step's, once made disjoint)."""
        if r.trace is not None:
            for kind, mb, chunk, begin_s, end_s in self.steps[r.rank][first:]:
                r.trace.add_span(r.rank, "schedule", f"{kind}{mb}.{chunk}", begin_s, end_s)


@dataclass(frozen=True)
class Run:
    """A finished iteration: its inputs, every simulated rank's final state (parameters,
    gradients, buckets or FSDP units, offload), and its results."""

    inputs: RunInputs
    states: dict  # rank -> RankState
    results: RunResults

    @property
    def loss(self) -> float | None:
        """Mean token loss over the global batch (numeric mode)."""
        losses = self.results.losses
        if not losses or None in losses.values():
            return None
        m, p = self.inputs.sc.model, self.inputs.sc.parallel
        return sum(losses.values()) / (m.seq_length * p.global_batch)

    @property
    def objective(self) -> float | None:
        """What backward differentiates: the loss plus the MoE layers' aux losses and the
        multi-token prediction losses, each scaled as its gradient is (docs/moe.md,
        docs/mtp.md); the loss itself without either."""
        loss = self.loss
        if loss is None:
            return loss
        m, B = self.inputs.sc.model, self.inputs.sc.parallel.global_batch
        if m.num_experts is not None:
            loss += sum(r.moe_aux_loss for r in self.inputs.world.ranks.values())
        for (_dp, _mb, k), masked in self.results.mtp_losses.items():  # depth k: s − k − 1
            loss += m.mtp_loss_scaling_factor / m.mtp_num_layers * masked / (
                (m.seq_length - k - 1) * B)
        return loss
