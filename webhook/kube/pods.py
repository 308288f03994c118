"""Named accessors over a Pod, which stays a plain dict so unknown fields round-trip.

The core reads pods only through these functions (never ad hoc ``.get`` chains), so the
rules for what counts as a GPU pod or a regular container live in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook import names
from webhook.kube.quantity import QuantityError, count_problem, whole_count
from webhook.kube.units import is_gpu_resource

Pod = dict[str, Any]
Container = dict[str, Any]
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Phases of a pod that has ended: it holds no device and is admitted no more."""
__all__ = ["Pod", "Container", "QuantityError"]  # re-exported: the error effective_requests raises


def metadata(pod: Pod) -> dict[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


def labels(pod: Pod) -> dict[str, str]:
    found = metadata(pod).get("labels")
    return found if isinstance(found, dict) else {}


def annotations_of(pod: Pod) -> dict[str, str]:
    found = metadata(pod).get("annotations")
    return found if isinstance(found, dict) else {}


def display_name(pod: Pod) -> str:
    """The pod's name, or its generateName prefix for controller-made pods."""
    meta = metadata(pod)
    return str(meta.get("name") or meta.get("generateName") or "<unnamed>")


def spec(pod: Pod) -> dict[str, Any]:
    found = pod.get("spec")
    return found if isinstance(found, dict) else {}


def containers(pod: Pod) -> list[Container]:
    """Regular containers: the only ones GPU requests are injected into."""
    found = spec(pod).get("containers")
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def init_containers(pod: Pod) -> list[Container]:
    found = spec(pod).get("initContainers")
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def long_running_containers(pod: Pod) -> list[Container]:
    """Containers that hold their resources for the pod's whole life: the regular ones, and init
    containers with ``restartPolicy: Always`` (sidecars), whose GPUs add to the regular ones'."""
    sidecars = [c for c in init_containers(pod) if c.get("restartPolicy") == "Always"]
    return sidecars + containers(pod)


def all_containers(pod: Pod) -> Iterator[tuple[str, Container]]:
    """Every container with its kind ('container' or 'initContainer')."""
    for container in init_containers(pod):
        yield "initContainer", container
    for container in containers(pod):
        yield "container", container


def resource_section(container: Container, section: str) -> dict[str, Any]:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return {}
    found = resources.get(section)
    return found if isinstance(found, dict) else {}


def gpu_resources(container: Container) -> set[str]:
    """GPU resource names (whole, shared, MIG) a container asks for in requests or limits."""
    found: set[str] = set()
    resources = container.get("resources")
    if type(resources) is not dict:
        return found
    for section in (resources.get("requests"), resources.get("limits")):
        if type(section) is dict:
            for name in section:
                # Most keys are cpu and memory: the kinds' lookup is cached per name.
                if is_gpu_resource(name):
                    found.add(name)
    return found


def named_gpu_resources(pod: Pod) -> set[str]:
    """GPU resources any container of the pod (init containers included) names, "0" included: an
    explicit count the webhook keeps, so no policy default is added beside it."""
    found: set[str] = set()
    for container in init_containers(pod):
        found |= gpu_resources(container)
    for container in containers(pod):
        found |= gpu_resources(container)
    return found


def requested_gpu_resources(pod: Pod) -> set[str]:
    """GPU resources any container of the pod (init containers included) asks for: one written as
    0 in requests and limits asks for none, so ``nvidia.com/gpu: "0"`` is not a GPU pod. A value
    that is not a count is an ask, for validation to judge."""
    found: set[str] = set()
    for _, container in all_containers(pod):
        for name in gpu_resources(container):
            if any(whole_count(resource_section(container, section).get(name, 0)) != 0
                   for section in ("requests", "limits")):
                found.add(name)
    return found


def count_problems(pod: Pod) -> list[str]:
    """Each GPU quantity of the pod that is not a whole count of devices, as "<kind> 'NAME' asks
    RESOURCE: VALUE, which <why>" (``quantity.count_problem``); empty when every count is whole."""
    out = []
    for kind, container in all_containers(pod):
        for name in sorted(gpu_resources(container)):
            for section in ("limits", "requests"):
                value = resource_section(container, section).get(name)
                problem = None if value is None else count_problem(value)
                if problem is not None:
                    out.append(f"{kind} '{container.get('name')}' asks {name}: {value}, which {problem}")
                    break
    return out


def container_request(container: Container, resource: str) -> Any:
    """The raw quantity a container requests: ``requests`` if given, else ``limits``.

    The API server defaults a missing request to its limit before anything stores or schedules
    the pod, so a pod the webhook sees before that defaulting counts the same as after it.
    """
    value = resource_section(container, "requests").get(resource)
    return value if value is not None else resource_section(container, "limits").get(resource)


def gpu_count(container: Container, resource: str) -> int | None:
    """The whole count a container asks for a GPU resource (None when absent or not a whole number)."""
    value = container_request(container, resource)
    return None if value is None else whole_count(value)


Amount = Callable[[str, Any], int]
"""Turns (resource name, raw quantity) into the integer the caller counts in; raises QuantityError."""


def gpu_amount(resource: str, value: Any) -> int:
    count = whole_count(value)
    if count is None:
        raise QuantityError(f"{resource}: {value!r} is not a whole number of devices")
    return count


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value


def _container_amounts(container: Container, include: Callable[[str], bool], amount: Amount,
                       defaults: Mapping[str, int], bucket: Callable[[str], str] | None = None) -> dict[str, int]:
    keys = {k for section in ("requests", "limits") for k in resource_section(container, section) if include(k)}
    if bucket is None:
        found = {key: amount(key, container_request(container, key)) for key in keys}
    else:
        found = {}
        for key in keys:
            _add(found, {bucket(key): amount(key, container_request(container, key))})
    for key, value in defaults.items():
        if not found.get(key):
            found[key] = value
    return found


def effective_requests(pod: Pod, *, include: Callable[[str], bool] = is_gpu_resource,
                       amount: Amount = gpu_amount, defaults: Mapping[str, int] | None = None,
                       bucket: Callable[[str], str] | None = None) -> dict[str, int]:
    """What the pod asks of a node, by Kubernetes' own rule, for the resources ``include`` selects.

    The rule of ``k8s.io/component-helpers/resource`` ``PodRequests`` (v0.36): regular containers
    and sidecars (init containers with ``restartPolicy: Always``) run together and add up; each
    plain init container runs alone beside the sidecars declared before it; the pod needs the
    larger of the two, plus ``spec.overhead``. The webhook's validation, the balancer's node
    accounting and the replay's scheduler model all call this, so they agree on every pod.
    A quantity ``amount`` cannot read raises QuantityError naming the resource. ``defaults`` fills
    a container's missing or zero request, as kube-scheduler's scoring does for cpu and memory
    (``NonMissingContainerRequests``). ``bucket`` adds several resources up under one key (every GPU
    name as GPU units, say) before the rule, so an init container's peak is the peak of their sum.
    """
    fill = defaults or {}
    total: dict[str, int] = {}
    for container in containers(pod):
        _add(total, _container_amounts(container, include, amount, fill, bucket))
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for container in init_containers(pod):
        own = _container_amounts(container, include, amount, fill, bucket)
        if container.get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            running = dict(sidecars)
        else:
            running = dict(own)
            _add(running, sidecars)
        for key, value in running.items():
            peak[key] = max(peak.get(key, 0), value)
    for key, value in peak.items():
        total[key] = max(total.get(key, 0), value)
    overhead = spec(pod).get("overhead")
    if isinstance(overhead, dict):
        for k, v in overhead.items():
            if include(k):
                _add(total, {bucket(k) if bucket else k: amount(k, v)})
    return {key: value for key, value in total.items() if value > 0}


def gpu_requests(pod: Pod) -> dict[str, int]:
    """The pod's effective GPU requests per resource (whole GPUs, shares, MIG slices)."""
    return effective_requests(pod)


def asks_for_gpus(pod: Pod) -> bool:
    """True for a pod gpuOnly policies apply to: it requests a GPU resource, or asks with a gpugate label
    (a GPU count, or GPU memory or a GPU fraction to be right-sized)."""
    return bool(requested_gpu_resources(pod)) or labels_ask_for_gpus(pod)


def labels_ask_for_gpus(pod: Pod) -> bool:
    """The label half of ``asks_for_gpus``, for a caller that has read the pod's GPU requests itself."""
    pod_labels = labels(pod)
    if pod_labels.get(names.GPU_MEMORY_LABEL) or pod_labels.get(names.GPU_FRACTION_LABEL):
        return True
    label = pod_labels.get(names.GPUS_LABEL)
    return label is not None and whole_count(label) != 0  # "0" asks for none; a bad value is judged


def is_skipped(pod: Pod) -> bool:
    return labels(pod).get(names.SKIP_LABEL) == "true"


def group_of(pod: Pod) -> tuple[str, str] | None:
    """The (label, value) naming the distributed job the pod belongs to, if any."""
    pod_labels = labels(pod)
    for label in names.JOB_LABELS:
        value = pod_labels.get(label)
        if value:
            return label, value
    return None
