"""Checks of the [run] section: the run's name, and what numeric mode does not model."""

from simsp.scenario.checks.rule import check
from simsp.scenario.config import Scenario


def run_name(s: Scenario) -> None:
    """The name titles reports and names folders: printable, at most 200 characters."""
    check(s.run.name.isprintable() and len(s.run.name) <= 200, "run.name",
          "must be printable text of at most 200 characters")


def routing_model_mode(s: Scenario) -> None:
    """The MoE routing imbalance is meta mode's routing model (numeric mode routes the real
    tokens)."""
    check(s.model.moe_routing_imbalance == 0 or s.run.mode == "meta",
          "model.moe_routing_imbalance", "is meta mode's routing model (numeric mode routes "
          "the real tokens): use --mode meta")
