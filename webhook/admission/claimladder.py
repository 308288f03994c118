"""Right-sizing through DRA: an ask becomes one ResourceClaim whose sub-requests are the ladder. Pure.

A policy with ``rightsizing.through: dra`` does not pick a rung itself. Its fitting rungs become
the ``firstAvailable`` sub-requests of one request, in the ladder's order (smallest first), and
kube-scheduler's DynamicResources plugin takes, on each node, the first sub-request that node can
satisfy (k8s.io/dynamic-resource-allocation structured allocator, ``firstAvailable``), then scores
nodes. So no inventory is needed: a rung no node has is skipped by the scheduler, not guessed by us.

Each rung, on the devices NVIDIA's DRA driver publishes (kubernetes-sigs/dra-driver-nvidia-gpu):

- a MIG profile: DeviceClass ``mig.nvidia.com``, selector ``profile == "<profile>"`` (the
  attribute of ``mig.go``'s devices, static or dynamic MIG) and the device's ``memory`` capacity at
  least the ask;
- a share (a ``nvidia.com/gpu.shared`` rung): DeviceClass ``gpu.nvidia.com`` on a device with
  ``allowMultipleAllocations`` (the driver's ConsumableShares, ``consumable_shares.go``) and
  ``capacity.requests.memory`` of the ask: the scheduler keeps the sum of the shares' memory within
  the device's, which time-slicing never did. The rung's own ``memory`` is the most a share may
  take (a larger ask skips it, as with the device plugin);
- a whole GPU (an ``nvidia.com/gpu`` rung): DeviceClass ``gpu.nvidia.com`` with at least the
  asked memory and no capacity request. On a shareable device the driver's ``memory`` policy
  (``--consumable-shares=memory``) makes an empty request take the device's whole memory (its
  ``requestPolicy.default``), so a whole GPU is only given where no share is.

The policy's GPU requirements (products, families, minMemoryMiB) go on every sub-request as the
CEL selectors :func:`required_selectors` writes, so the template passes the
policy's own claim rules; a MIG rung smaller than ``minMemoryMiB`` can never match and is left out.
A ``gpugate.io/gpu-fraction`` ask without memory is sized against the ladder's whole GPU (the
share asks that fraction of its memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from webhook import names
from webhook.admission.rightsizing import fitting_rungs, largest
from webhook.kube import claims, rightsizedclaims, units
from webhook.kube.claims import Claim, ClaimRequest, DeviceAsk
from webhook.kube.demand import Size
from webhook.policy.model import GPUPolicy, RightSizing, Rung


def required_selectors(policy: GPUPolicy) -> tuple[str, ...]:
    """The policy's GPU requirements as CEL selectors (the node-affinity requirements' DRA twins)."""
    gpu = policy.gpu
    out = []
    if gpu.products:
        out.append(claims.product_selector(gpu.products))
    if gpu.families:
        out.append(claims.family_selector(gpu.families))
    if gpu.min_memory_mib:
        out.append(claims.memory_selector(gpu.min_memory_mib))
    return tuple(out)


MIB = 2**20
MAX_SUB_REQUESTS = 8
"""resource.k8s.io/v1 FirstAvailableDeviceRequestMaxSize: more sub-requests are refused by the API server."""
REQUEST_NAME = "gpu"


@dataclass(frozen=True, slots=True)
class ClaimLadder:
    """The template a pod's ask becomes, and what the pod's author is told."""

    template: Claim
    rungs: tuple[str, ...]
    """Sub-request names, in order: ``mig-3g-40gb``, ``share``, ``gpu``."""
    why: str

    @property
    def name(self) -> str:
        return str(self.template["metadata"]["name"])


def profile_selector(profile: str) -> str:
    return (f'device.driver == "{names.DRA_DRIVER}" && '
            f'device.attributes["{names.DRA_DRIVER}"].{names.DRA_PROFILE_ATTRIBUTE} == "{profile}"')


def memory_quantity(size: int) -> str:
    """Bytes as a quantity the API server stores as written: ``20Gi``, ``20480Mi``, else plain bytes."""
    for unit, factor in (("Gi", 2**30), ("Mi", MIB)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def sub_request_name(rung: Rung) -> str:
    """A DNS label, as a sub-request name must be: ``mig-3g-40gb``, ``share``, ``gpu``."""
    if rung.mig:
        return "mig-" + rung.mig.replace(".", "-")
    return "share" if units.is_shared(rung.resource) else REQUEST_NAME


def memory_asked(ask: Size, sizing: RightSizing) -> int | None:
    """The memory the claim must hold: the ask's, else its fraction of the ladder's whole GPU."""
    if ask.memory_bytes is not None:
        return ask.memory_bytes
    if ask.fraction is None:
        return None
    whole = next((r for r in sizing.ladder if units.is_plugin_gpu(r.resource)), largest(sizing.ladder))
    return math.ceil(whole.memory_bytes * ask.fraction / MIB) * MIB


def ladder(ask: Size, sizing: RightSizing, *, selectors: tuple[str, ...] = (), min_memory_mib: int | None = None,
           labels: dict[str, str] | None = None) -> ClaimLadder | str:
    """The template for ``ask``; a str is the denial when no rung of the ladder is large enough.

    ``selectors`` are the policy's CEL requirements (added to every sub-request), ``labels`` the
    template's labels (the pod's profile, so the policy that shaped the pod also judges the claim)."""
    fitting = fitting_rungs(ask, sizing)
    if isinstance(fitting, str):
        return fitting
    memory = memory_asked(ask, sizing)
    notes: list[str] = []
    subs: list[DeviceAsk] = []
    for rung in fitting:
        if rung.mig and min_memory_mib is not None and rung.memory_bytes < min_memory_mib * MIB:
            notes.append(f"{rung.name} left out: below the policy's minMemoryMiB {min_memory_mib}")
            continue
        if rung.mig is None and not units.pooled(rung.resource):
            notes.append(f"{rung.name} left out: not a DRA rung (a MIG profile, {names.SHARED_GPU_RESOURCE} or "
                         f"{names.GPU_RESOURCE})")
            continue
        if units.is_shared(rung.resource) and memory is None:
            notes.append("the share left out: a share is sized in memory and the ask gives none")
            continue
        subs.append(_sub_request(rung, memory, selectors))
    if len(subs) > MAX_SUB_REQUESTS:
        notes.append(f"{', '.join(_short(s) for s in subs[MAX_SUB_REQUESTS:])} left out: a request holds at most "
                     f"{MAX_SUB_REQUESTS} sub-requests")
        subs = subs[:MAX_SUB_REQUESTS]
    if not subs:
        return (f"asks {ask.describe()}; no rung of the policy's ladder that fits can be asked through DRA "
                f"({'; '.join(notes)})")
    request = claims.render_request(ClaimRequest(name=REQUEST_NAME, first_available=tuple(subs)))
    spec = {"devices": {"requests": [request]}}
    made = rightsizedclaims.template(labels or {}, spec)
    rungs = tuple(_short(s) for s in subs)
    smaller = [r.name for r in sizing.ladder[:sizing.ladder.index(fitting[0])]]
    too_small = f" ({', '.join(smaller)} too small)" if smaller else ""
    left_out = f"; {'; '.join(notes)}" if notes else ""
    why = (f"the scheduler takes the first of {', '.join(rungs)} that a node can give{too_small}{left_out}")
    return ClaimLadder(template=made, rungs=rungs, why=why)


def _sub_request(rung: Rung, memory: int | None, selectors: tuple[str, ...]) -> DeviceAsk:
    own: list[str] = []
    capacity: tuple[tuple[str, str], ...] = ()
    if rung.mig:
        device_class = names.DRA_MIG_CLASS
        own.append(profile_selector(rung.mig))
        if memory is not None:
            own.append(claims.memory_selector(math.ceil(memory / MIB)))
    elif units.is_shared(rung.resource):
        device_class = names.DRA_GPU_CLASS
        own.append(names.DRA_SHARE_SELECTOR)
        assert memory is not None
        capacity = ((names.DRA_MEMORY_CAPACITY, memory_quantity(memory)),)
    else:
        device_class = names.DRA_GPU_CLASS
        if memory is not None:
            own.append(claims.memory_selector(math.ceil(memory / MIB)))
    every = tuple(own) + tuple(s for s in selectors if s not in own)
    return DeviceAsk(name=f"{REQUEST_NAME}/{sub_request_name(rung)}", device_class=device_class,
                     selectors=every, capacity=capacity, sub_request=True)


def _short(ask: DeviceAsk) -> str:
    return ask.name.rsplit("/", 1)[-1]
