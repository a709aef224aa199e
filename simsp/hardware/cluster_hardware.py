"""What a cluster takes from its GPU and system profiles: the [cluster] values they imply, the
scale-out fabric, the host CPU vendor and the NVSwitch generation."""

from simsp.hardware.fabric import DEFAULT, Fabric, with_oversubscription
from simsp.hardware.profile_file import load_profile
from simsp.hardware.profiles import gpu_profile, system_profile

# without a system: the DGX that pairs with the GPU's NVLink (DGX A100: AMD EPYC 7742; DGX H100
# and DGX B200: Intel Xeon Platinum 8480C / 8570, the DGX user guides)
CPU_BY_NVLINK = {3: "amd", 4: "intel", 5: "intel"}


def fabric_of(cluster) -> Fabric:
    """The fabric of a cluster: its system's (DEFAULT without one), with the scenario's
    cluster.fabric_oversubscription override."""
    fabric = system_profile(cluster.system).fabric if cluster.system else DEFAULT
    return with_oversubscription(fabric, getattr(cluster, "fabric_oversubscription", None))


def system_cluster_fields(name: str) -> dict:
    """The [cluster] values a system implies: its GPU, NVLink domain, NVLink and NIC speeds."""
    system = system_profile(name)
    return {"gpu": system.gpu, "gpus_per_node": system.gpus_per_nvlink_domain,
            "nvlink_bandwidth_GBps": gpu_profile(system.gpu).nvlink_GBps,
            "ib_bandwidth_GBps": system.ib_bandwidth_GBps}


def gpu_cluster_fields(name: str) -> dict:
    """The [cluster] values a GPU implies: its NVLink speed per direction."""
    return {"nvlink_bandwidth_GBps": gpu_profile(name).nvlink_GBps}


def cpu_vendor(cluster) -> str:
    """The host CPU vendor of a cluster: its system's, else the DGX's that pairs with its GPU."""
    if cluster.system:
        stated = load_profile("system", cluster.system).value("cpu_vendor")
        if stated:
            return str(stated)
    return CPU_BY_NVLINK.get(gpu_profile(cluster.gpu).nvlink_generation, "intel")


def nvswitch_generation(cluster) -> int:
    """The NVSwitch generation of a cluster: its system's, else the one that pairs with its GPU's
    NVLink (NVLink 3 -> NVSwitch 2 in DGX A100, 4 -> 3 in DGX H100, 5 -> 4 in DGX B200)."""
    if cluster.system:
        return system_profile(cluster.system).nvswitch_generation
    return gpu_profile(cluster.gpu).nvlink_generation - 1
