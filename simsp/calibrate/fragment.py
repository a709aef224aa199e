"""The `[cluster]` TOML fragment a calibration writes: every link field, with what was fitted.

Paste it into a scenario without a [cluster] section (or copy its keys into the scenario's
[cluster] section); `simsp run` then simulates on the measured cluster.
"""

from simsp.calibrate.fit import TierFit
from simsp.calibrate.layout import Measurement
from simsp.calibrate.link_model import BANDWIDTH_FIELDS, LINK_FIELDS
from simsp.scenario.config import Cluster
from simsp.io_out import comment_text

TIER_TITLE = {"intra": "intra-node tier, NVLink", "inter": "inter-node tier, InfiniBand"}


def describe_run(m: Measurement) -> str:
    """'all_reduce, 8 ranks on 1 node (intra-node tier)'."""
    nodes = f"{m.nodes} node" + ("s" if m.nodes > 1 else "")
    return f"{m.collective}, {m.ranks} ranks on {nodes} ({TIER_TITLE[m.tier]})"


def status_of(name: str, fits: list[TierFit]) -> str:
    """How a field got its value: fitted, at its bound, not identifiable, or held."""
    for fit in fits:
        if name in fit.fitted:
            return f"fitted ({TIER_TITLE[fit.tier]})"
        if name in fit.at_bound:
            return "held at its bound (the fit pushed past it)"
        if name in fit.not_identifiable:
            return "held (no effect on these runs: not identifiable)"
    if name == "transfer_overhead_us":
        return "held (per-step cost on every hop: collinear with the per-hop latency in a tier)"
    tier = "one-node" if name.startswith("nvlink") else "multi-node"
    return f"held at simsp's value (no {tier} run given)"


def fragment_text(base: Cluster, links: dict, fits: list[TierFit],
                  measurements: list[Measurement]) -> str:
    """The TOML text: comments naming the runs and each field's status, then [cluster]."""
    lines = ["# simsp calibrate nccl-tests: link calibration fitted to"]
    lines += [f"#   {comment_text(m.path)}: {describe_run(m)}" for m in measurements]
    lines += ["# Efficiencies are fractions of the bandwidths below (per GPU / per NIC, per "
              "direction)."]
    lines += [f"#   {name}: {status_of(name, fits)}" for name in LINK_FIELDS]
    lines.append("[cluster]")
    lines += [f"{name} = {_toml_float(getattr(base, name))}" for name in BANDWIDTH_FIELDS]
    lines += [f"{name} = {_toml_float(links[name])}" for name in LINK_FIELDS]
    return "\n".join(lines) + "\n"


def _toml_float(value: float) -> str:
    """A TOML float with 7 significant digits ('0.78', '2.0', '1.234567e-05')."""
    text = f"{float(value):.7g}"
    return text if any(c in text for c in ".en") else text + ".0"
