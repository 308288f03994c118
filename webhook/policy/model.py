"""GPUPolicy as typed, frozen values: parsed once at load, trusted on the request path."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from webhook import durations, names
from webhook.kube.affinity import Requirement
from webhook.kube.inventory import MAX_AGE_SECONDS
from webhook.kube.tolerations import Toleration as Toleration  # a policy's tolerations: the one toleration type

Mode = Literal["enforce", "audit", "off"]
Strategy = Literal["pack", "spread", "none"]
AvoidCongested = Literal["required", "preferred", "no"]
TopologyMode = Literal["required", "preferred"]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes LabelSelector; the empty selector matches every pod.

    Its requirements are :class:`webhook.kube.affinity.Requirement`, the one selector requirement
    (key, operator, values), as Kubernetes' ``labels.Requirement`` serves label and node selectors
    alike; here the schema admits only In, NotIn, Exists and DoesNotExist."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()
    _folded: tuple[Requirement, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        # Folded once: every admission asks every policy's selector.
        folded = tuple(Requirement(k, "In", (v,)) for k, v in self.match_labels)
        object.__setattr__(self, "_folded", folded + self.match_expressions)

    def requirements(self) -> tuple[Requirement, ...]:
        """matchLabels folded into In requirements, as the API server does."""
        return self._folded


@dataclass(frozen=True, slots=True)
class Match:
    namespaces: tuple[str, ...] = ("*",)
    exclude_namespaces: tuple[str, ...] = ()
    pod_selector: LabelSelector = field(default_factory=LabelSelector)
    gpu_only: bool = True
    """Only pods that request an NVIDIA resource or carry gpugate.io/gpus; false also shapes CPU pods."""


@dataclass(frozen=True, slots=True)
class GPUSpec:
    resource: str = names.GPU_RESOURCE
    default: int | None = None
    """Count injected for a gpus label without a value, or for every matched pod when gpuOnly is false."""
    max: int | None = None
    allowed_resources: tuple[str, ...] = ()
    """NVIDIA resources allowed besides ``resource``; anything else is denied by validation."""
    fail_requests_greater_than_one: bool = True
    """Deny asking a shared (time-sliced/MPS) resource more than once: replicas of one GPU add no compute."""
    products: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    min_memory_mib: int | None = None

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset((self.resource, *self.allowed_resources))


@dataclass(frozen=True, slots=True)
class ClaimRules:
    """``spec.claims``: what a policy admits of DRA claims beyond ``spec.gpu``'s limits."""

    device_classes: tuple[str, ...] | None = None
    """DeviceClasses allowed; None: those that ``spec.gpu``'s resources map to."""
    max_per_claim: int | None = None
    """Devices one claim may ask; None: ``spec.gpu.max``."""
    allow_allocation_mode_all: bool = False
    allow_admin_access: bool = False


@dataclass(frozen=True, slots=True)
class Topology:
    key: str = names.NVIDIA_CLIQUE_LABEL
    mode: TopologyMode = "preferred"


@dataclass(frozen=True, slots=True)
class Placement:
    strategy: Strategy = "none"
    avoid_congested: AvoidCongested = "no"
    topology: Topology | None = None


@dataclass(frozen=True, slots=True)
class Disruption:
    """``spec.disruption``: whether the balancer's rebalancer may move the matched pods, and how often."""

    movable: bool = False
    max_moves_per_hour: int | None = None
    """Evictions of the namespace's pods in any hour; None: only the balancer's cluster budget."""
    min_runtime_seconds: int = 0


@dataclass(frozen=True, slots=True)
class Rung:
    """One step of a right-sizing ladder: a GPU resource and what one unit of it gives."""

    name: str
    """How messages name it: the MIG profile ("2g.20gb") or the resource."""
    memory_bytes: int
    compute: float
    """Share of a whole GPU's compute, (0, 1]."""
    resource: str | None = None
    """The resource asked, for a plain rung (nvidia.com/gpu.shared, nvidia.com/gpu)."""
    mig: str | None = None
    """The MIG profile for a MIG rung; asked as nvidia.com/mig-<profile> (mixed strategy) or as
    nvidia.com/gpu on nodes whose slices are that size (single strategy)."""


MigStrategy = Literal["single", "mixed"]
Through = Literal["devicePlugin", "dra"]


@dataclass(frozen=True, slots=True)
class RightSizing:
    ladder: tuple[Rung, ...]
    mig_strategy: MigStrategy = "single"
    """How MIG slices are advertised when the inventory does not say (the GPU Operator's default)."""
    max_inventory_age_seconds: int = MAX_AGE_SECONDS
    through: Through = "devicePlugin"
    """``dra``: the ladder becomes one ResourceClaim whose ``firstAvailable`` sub-requests are its
    rungs (webhook/admission/claimladder.py), and the real scheduler picks the first a node can give."""


@dataclass(frozen=True, slots=True)
class DenyRule:
    message: str
    namespaces: tuple[str, ...] = ("*",)
    pod_selector: LabelSelector = field(default_factory=LabelSelector)


IdleAction = Literal["report", "annotate", "evict"]


@dataclass(frozen=True, slots=True)
class IdleRules:
    """``spec.idle``: when a matched pod's GPUs count as idle, and what the balancer may do about it.

    The defaults are the policy's when it says nothing, and every GPU pod's when no policy matches
    it: report only (an Event, a metric, ``gpugate usage --idle``), never a change to the pod."""

    action: IdleAction = "report"
    threshold: float = 0.05
    """DCGM activity (0..1) the pod's GPUs stayed under: 5 % is the engine waking for a health check."""
    after: str = "2h"
    """How long they stayed under it (a Prometheus duration): two hours is a notebook left open over
    lunch, not a slow batch."""
    exclude: LabelSelector | None = None
    """Pods that opt out of annotate and evict (reported only), besides those labelled
    ``gpugate.io/no-reclaim: "true"``; None: no others."""

    @property
    def after_seconds(self) -> int:
        return durations.seconds(self.after)


@dataclass(frozen=True, slots=True)
class GPUPolicy:
    name: str
    source: str
    """Where the policy was read from ("policies/training.yaml, document 1"), for messages."""
    priority: int = 0
    mode: Mode = "enforce"
    match: Match = field(default_factory=Match)
    gpu: GPUSpec = field(default_factory=GPUSpec)
    tolerations: Literal["auto", "none"] | tuple[Toleration, ...] = "auto"
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    placement: Placement = field(default_factory=Placement)
    deny: tuple[DenyRule, ...] = ()
    rightsizing: RightSizing | None = None
    claims: ClaimRules = field(default_factory=ClaimRules)
    idle: IdleRules = field(default_factory=IdleRules)
    disruption: Disruption = field(default_factory=Disruption)


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """Which policy, at which revision of the set, shaped a pod (the gpugate.io/policy annotation)."""

    name: str
    revision: str

    def __str__(self) -> str:
        return f"{self.name}@{self.revision}"


def revision_of(encoded: list[tuple[str, bytes]]) -> str:
    """A short hash of file names (without folders) and bytes: any edit gives a new revision."""
    digest = hashlib.sha256()
    for name, data in sorted(encoded):
        digest.update(name.rsplit("/", 1)[-1].encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class PolicySet:
    """An immutable, ordered set of policies; ``revision`` is a hash of the files' content."""

    policies: tuple[GPUPolicy, ...]
    revision: str

    @classmethod
    def empty(cls) -> PolicySet:
        return cls(policies=(), revision=revision_of([]))

    def get(self, name: str) -> GPUPolicy | None:
        return next((p for p in self.policies if p.name == name), None)
