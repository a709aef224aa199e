"""The scale-out fabric of a system as data: rail-optimised leaves per scalable unit, a spine
tier, a core tier above a size, the leaves' oversubscription (docs/hardware.md#fabric).

NVIDIA's DGX SuperPOD reference architectures build the compute fabric from scalable units (SU)
of nodes: one leaf switch per rail per SU, leaves under spines, and above a size spines under a
core tier (DGX SuperPOD B200 RA, "DGX SuperPOD Architecture", Table 3: 2 to 8 SUs two-tier,
16 SUs and more three-tier). A system profile's `[fabric]` table gives these numbers with their
sources; a cluster without a system keeps simsp's historical fabric (DEFAULT).
"""

from dataclasses import dataclass, replace

FABRIC_KEYS = ("nodes_per_leaf", "switch_radix", "two_tier_max_units", "units_per_pod",
               "oversubscription", "core_oversubscription", "sharp_generation")
# key -> (integer?, most allowed, least allowed)
FABRIC_LIMITS = {"nodes_per_leaf": (True, 4096, 1), "switch_radix": (True, 4096, 2),
                 "two_tier_max_units": (True, 4096, 1), "units_per_pod": (True, 4096, 1),
                 "oversubscription": (False, 64, 1), "core_oversubscription": (False, 64, 1),
                 "sharp_generation": (True, 16, 1)}


@dataclass(frozen=True)
class Fabric:
    """A rail-optimised fat tree: `nodes_per_leaf` nodes per scalable unit (one leaf per rail),
    leaves under one spine up to `two_tier_max_units` units (None: always), above that pods of
    `units_per_pod` units under a core; leaf uplinks carry downlinks / `oversubscription`, a
    pod spine's bundle to the core its leaves' uplinks / `core_oversubscription`."""

    nodes_per_leaf: int = 20
    switch_radix: int | None = None  # ports per switch (None: not given)
    two_tier_max_units: int | None = None
    units_per_pod: int | None = None
    oversubscription: float = 1.0
    core_oversubscription: float = 1.0  # a pod spine's ports down : up (to the core)
    # the switches' in-network reduction (NVIDIA SHARP) generation; None: none. NCCL's CollNet
    # runs over it under --use-sharp (engine/collectives/collnet.py, docs/nccl.md)
    sharp_generation: int | None = None
    sources: tuple = ()  # ((key, source), ...) as the profile gives them

    def units(self, nodes: int) -> int:
        """Scalable units (leaf groups) a cluster of `nodes` nodes spans."""
        return -(-nodes // self.nodes_per_leaf)

    def three_tier(self, nodes: int) -> bool:
        """Does a cluster of `nodes` nodes need the core tier?"""
        return self.two_tier_max_units is not None and self.units(nodes) > self.two_tier_max_units

    def pod_of(self, unit: int, nodes: int) -> int | None:
        """The pod (spine group) of scalable unit `unit`; None in a two-tier fabric."""
        return unit // self.units_per_pod if self.three_tier(nodes) else None

    def uplinks_can_bind(self, nodes: int) -> str:
        """Why a link above the leaves can bind (empty: none can). A link is redundant in
        max-min fair sharing where every flow crossing it also crosses one of a set of links
        whose capacities sum to no more than its own: its load is then at most theirs, so it
        cuts no allocation the others allow, and the fair allocation (a function of the
        feasible set) is the same without it. A leaf's uplink bundle at 1:1 is so against the
        leaf's NICs (every route through it starts or ends on one of them); a pod spine's
        bundle to the core at core 1:1 against the pod's leaf uplinks (every route through it
        climbs or descends one of them), whatever the leaves' ratio (docs/hardware.md#fabric)."""
        if self.oversubscription != 1:
            return f"the leaves' uplinks are oversubscribed {self.oversubscription:g}:1"
        if self.three_tier(nodes) and self.core_oversubscription != 1:
            return (f"the pods' uplinks to the core tier are oversubscribed "
                    f"{self.core_oversubscription:g}:1 ({self.units(nodes)} scalable units "
                    f"need the core tier)")
        return ""

    def switch_counts(self, nodes: int, rails: int) -> dict:
        """Leaf, spine and core switches of a full fabric of `nodes` nodes with `rails` NICs
        each, every switch of `switch_radix` ports, half down and half up at 1:1 (the SuperPOD
        RA's Table 3 counts); empty without a radix."""
        if self.switch_radix is None:
            return {}
        leaves = self.units(nodes) * rails
        uplinks = round(leaves * self.switch_radix / (1 + self.oversubscription))
        if not self.three_tier(nodes):
            return {"leaf": leaves, "spine": -(-uplinks // self.switch_radix), "core": 0}
        spines = -(-uplinks // (self.switch_radix // 2))  # half down, half up
        core_ports = spines * (self.switch_radix // 2) / self.core_oversubscription
        return {"leaf": leaves, "spine": spines, "core": -(-round(core_ports) // self.switch_radix)}


DEFAULT = Fabric()  # simsp's historical fabric: 20 nodes per leaf (DGX A100 SuperPOD), one spine


def with_oversubscription(fabric: Fabric, ratio: float | None) -> Fabric:
    """The fabric with a scenario's oversubscription override (None: the profile's)."""
    return fabric if ratio is None else replace(fabric, oversubscription=float(ratio))
