"""A cluster made of pools of different GPU kinds (``MixedCluster``): each pool a built-in or custom
``ClusterSpec`` (GPU, node, NVLink, its own network) and a node count, plus the network between pools.

YAML (``--cluster FILE.yaml`` with a top-level ``pools:`` list)::

    name: h100-a100
    description: 32 DGX H100 next to 32 DGX A100 on one InfiniBand fabric
    pools:
      - cluster: dgx-h100          # a built-in name, a cluster YAML path, or an inline ClusterSpec mapping
        nodes: 32
      - cluster: dgx-a100-80g
        nodes: 32
    network:                        # between pools; optional (default below)
      nic_bandwidth_bytes_per_s: 25.0e+9
      latency_s: 5.0e-6
      bus_efficiency: 0.96
      source: one HDR 200 Gb/s port at the A100 end of every cross-pool transfer

On the command line the same pools are ``--cluster dgx-h100:32,dgx-a100-80g:32`` (``name:nodes``).

**Default network between pools.** A GPU of one pool talks to a GPU of the other through its own NIC and the
peer's (rail-optimised fabric, one NIC per GPU, as every built-in cluster file states), so a transfer between
pools cannot run faster than the slower end: the default is the pool whose NIC reaches the lower achievable rate
(line rate x its measured NCCL bus efficiency, both from its cluster file), with the larger of the two per-hop
latencies. Give ``network`` when the pools sit on different fabrics joined by fewer links.

Units as in ``cluster_specs.spec``: bytes/s per GPU per direction, seconds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ClusterSpecError
from .spec import ClusterSpec, NetworkSpec


class InterPoolNetwork(BaseModel):
    """The network between two pools: per-GPU bandwidth per direction, its achievable fraction, per-hop latency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nic_bandwidth_bytes_per_s: float = Field(gt=0, description="line rate per GPU per direction across pools, bytes/s")
    latency_s: float = Field(gt=0, description="per-hop latency across pools, seconds")
    bus_efficiency: float = Field(gt=0, le=1, description="achievable fraction of the line rate (NCCL busbw / line)")
    source: str = Field(min_length=1, description="where the values came from")

    @property
    def achievable_bytes_per_s(self) -> float:
        return self.nic_bandwidth_bytes_per_s * self.bus_efficiency


class Pool(BaseModel):
    """One pool: a homogeneous cluster spec and how many of its nodes the job may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: ClusterSpec
    num_nodes: int = Field(gt=0)

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.cluster.node.gpus_per_node


class MixedCluster(BaseModel):
    """Pools of (possibly) different GPUs and the network between them (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    pools: tuple[Pool, ...] = Field(min_length=1)
    network: InterPoolNetwork

    @model_validator(mode="after")
    def _distinct(self) -> "MixedCluster":
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools: a cluster is named twice ({', '.join(names)}); give each pool once with "
                             f"its node count")
        vendors = {p.cluster.gpu.vendor for p in self.pools}
        if len(vendors) > 1:
            by = ", ".join(f"{p.name} {p.cluster.gpu.vendor}" for p in self.pools)
            raise ValueError(f"pools: GPUs of different vendors ({by}): one training job runs one collective library "
                             f"(NCCL or RCCL) and one kernel stack; plan each vendor's pools apart")
        return self

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)

    def link_cluster(self, pool: int) -> ClusterSpec:
        """Pool ``pool``'s cluster with its scale-out network replaced by the network between pools: the spec the
        communication model (``cost_models.comm.collective_time``) times a cross-pool transfer on."""
        c = self.pools[pool].cluster
        net = NetworkSpec(nic_bandwidth_bytes_per_s=self.network.nic_bandwidth_bytes_per_s,
                          latency_s=self.network.latency_s, nvlink_latency_s=c.network.nvlink_latency_s,
                          source=self.network.source)
        cal = c.calibration.model_copy(update={"network_bus_efficiency": self.network.bus_efficiency})
        return c.model_copy(update={"network": net, "calibration": cal})


def default_network(pools: list[Pool] | tuple[Pool, ...]) -> InterPoolNetwork:
    """The slower end's NIC (module docstring): the pool with the lowest achievable NIC rate, the largest latency."""
    slow = min(pools, key=lambda p: (p.cluster.network.nic_bandwidth_bytes_per_s
                                     * p.cluster.calibration.network_bus_efficiency, p.name))
    lat = max(p.cluster.network.latency_s for p in pools)
    n = slow.cluster.network
    return InterPoolNetwork(
        nic_bandwidth_bytes_per_s=n.nic_bandwidth_bytes_per_s, latency_s=lat,
        bus_efficiency=slow.cluster.calibration.network_bus_efficiency,
        source=(f"default: the slower end of a cross-pool transfer, {slow.name}'s NIC "
                f"{n.nic_bandwidth_bytes_per_s / 1e9:g} GB/s per GPU per direction at its measured NCCL bus efficiency "
                f"{slow.cluster.calibration.network_bus_efficiency:g} (cluster file {slow.name}); latency the larger "
                f"of the pools' ({lat * 1e6:g} us)"))


def mixed_cluster(pools: list[tuple[ClusterSpec, int]], network: InterPoolNetwork | None = None,
                  name: str | None = None, description: str = "") -> MixedCluster:
    """A ``MixedCluster`` of (cluster spec, node count) pairs; ``network`` defaults to ``default_network``.

    Raises:
        ClusterSpecError: no pool, a non-positive node count, or a cluster named twice (one line).
    """
    if not pools:
        raise ClusterSpecError("pools: give at least one pool (cluster and node count)")
    try:
        ps = tuple(Pool(cluster=c, num_nodes=n) for c, n in pools)
    except ValidationError:
        bad = next(n for _, n in pools if isinstance(n, bool) or not isinstance(n, int) or n < 1)
        raise ClusterSpecError(f"pools: node count {bad!r} must be a positive integer") from None
    net = network or default_network(ps)
    try:
        return MixedCluster(name=name or "+".join(f"{p.name}:{p.num_nodes}" for p in ps), description=description,
                            pools=ps, network=net)
    except ValidationError as e:
        raise ClusterSpecError(_one_error(e)) from None


def _one_error(e: ValidationError) -> str:
    err = e.errors()[0]
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    loc = ".".join(str(x) for x in err.get("loc", ()))
    return f"field '{loc}': {msg}" if loc else msg


def is_pools_file(ref: str | Path) -> bool:
    """Whether ``ref`` names a YAML file whose top level has a ``pools:`` list (a mixed cluster)."""
    p = Path(str(ref)).expanduser()
    try:
        if p.suffix.lower() not in (".yaml", ".yml") or not p.is_file():
            return False
        data = _read_guarded(p)
    except (OSError, ClusterSpecError, yaml.YAMLError):  # e.g. a name too long for the file system
        return False  # the cluster loader reports it, in one line
    return isinstance(data, dict) and "pools" in data


def _read_guarded(p: Path) -> Any:
    """``p`` parsed through the input guard every spec file goes through (size, UTF-8, depth, alias expansion)."""
    from .input_guard import parse, read_text
    from .loaders import MAX_FILE_BYTES
    return parse(read_text(p, MAX_FILE_BYTES, ClusterSpecError, "cluster file"), "yaml", f"cluster file '{p}'",
                 ClusterSpecError)


def load_mixed_cluster_file(path: str | Path) -> MixedCluster:
    """Load a mixed-cluster YAML (module docstring). Each pool's ``cluster`` is a built-in name, a cluster YAML
    path (relative paths are read next to the file) or an inline ``ClusterSpec`` mapping; ``nodes`` its node count.

    Raises:
        ClusterSpecError: unreadable or malformed file, unknown pool cluster, bad node count, bad network (one line
            naming the file and the field).
    """
    from .loaders import _parse, load_cluster
    p = Path(path).expanduser()
    try:
        data = _read_guarded(p)
    except yaml.YAMLError as e:
        raise ClusterSpecError(f"cluster file '{p}': malformed YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict) or not isinstance(data.get("pools"), list) or not data["pools"]:
        raise ClusterSpecError(f"{p}: field 'pools' must be a non-empty list of {{cluster, nodes}} entries")
    unknown = sorted(set(data) - {"name", "description", "pools", "network"})
    if unknown:
        raise ClusterSpecError(f"{p}: unknown field(s) {', '.join(unknown)} (allowed: name, description, pools, "
                               f"network)")
    pairs: list[tuple[ClusterSpec, int]] = []
    for i, entry in enumerate(data["pools"]):
        if not isinstance(entry, dict) or set(entry) != {"cluster", "nodes"}:
            raise ClusterSpecError(f"{p}: pools[{i}] must have exactly the fields 'cluster' and 'nodes'")
        ref: Any = entry["cluster"]
        if isinstance(ref, dict):
            spec = _parse(ref, f"{p}: pools[{i}].cluster")
        elif isinstance(ref, str):
            local = p.parent / ref
            spec = load_cluster(local if local.is_file() else ref)
        else:
            raise ClusterSpecError(f"{p}: pools[{i}].cluster must be a cluster name, a path or a mapping")
        nodes = entry["nodes"]
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ClusterSpecError(f"{p}: pools[{i}].nodes {nodes!r} must be a positive integer")
        pairs.append((spec, nodes))
    net = None
    if data.get("network") is not None:
        try:
            net = InterPoolNetwork.model_validate(data["network"])
        except ValidationError as e:
            raise ClusterSpecError(f"{p}: network: {_one_error(e)}") from None
    return mixed_cluster(pairs, net, name=data.get("name") or p.stem, description=str(data.get("description", "")))


def parse_pools(value: str) -> list[tuple[str, int]]:
    """``"dgx-h100:32,dgx-a100-80g:32"`` -> ``[("dgx-h100", 32), ("dgx-a100-80g", 32)]`` (``name:nodes`` entries).

    Raises:
        ClusterSpecError: an empty entry, an entry without ``:nodes``, or a node count that is not a positive integer.
    """
    out = []
    for e in (x.strip() for x in str(value).split(",")):
        name, sep, nodes = e.rpartition(":")
        if not e or not sep or not name.strip() or not nodes.strip().isdigit() or int(nodes) < 1:
            raise ClusterSpecError(f"--cluster {value!r}: a pool is NAME:NODES with a positive node count, "
                                   f"e.g. dgx-h100:32,dgx-a100-80g:32")
        out.append((name.strip(), int(nodes)))
    return out


def load_mixed_cluster(ref: str | Path | MixedCluster | list[tuple[Any, int]],
                       network: InterPoolNetwork | None = None) -> MixedCluster:
    """A mixed cluster from a ``name:nodes,...`` string, a YAML file with ``pools:``, a list of (cluster, nodes)
    pairs (each cluster a name, path or ``ClusterSpec``), or a ``MixedCluster`` (returned as is)."""
    from .loaders import load_cluster
    if isinstance(ref, MixedCluster):
        return ref
    if isinstance(ref, (list, tuple)):
        pairs = [(c if isinstance(c, ClusterSpec) else load_cluster(c), n) for c, n in ref]
        return mixed_cluster(pairs, network)
    if is_pools_file(ref):
        mc = load_mixed_cluster_file(ref)
        return mc if network is None else mc.model_copy(update={"network": network})
    return mixed_cluster([(load_cluster(n), k) for n, k in parse_pools(str(ref))], network)
