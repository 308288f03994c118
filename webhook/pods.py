"""Named accessors over a Pod, which stays a plain dict so unknown fields round-trip.

The core reads pods only through these functions (never ad hoc ``.get`` chains), so the
rules for what counts as a GPU pod or a regular container live in one place.
"""

from __future__ import annotations

from typing import Any, Iterator

from webhook import names
from webhook.quantity import whole_count

Pod = dict[str, Any]
Container = dict[str, Any]


def metadata(pod: Pod) -> dict[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


def labels(pod: Pod) -> dict[str, str]:
    found = metadata(pod).get("labels")
    return found if isinstance(found, dict) else {}


def annotations(pod: Pod) -> dict[str, str]:
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


def nvidia_resources(container: Container) -> set[str]:
    """NVIDIA resource names a container asks for in requests or limits."""
    found: set[str] = set()
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return found
    for section in ("requests", "limits"):
        values = resources.get(section)
        if isinstance(values, dict):
            for name in values:
                if name.startswith(names.NVIDIA_RESOURCE_PREFIX) and names.is_nvidia_resource(name):
                    found.add(name)
    return found


def requested_nvidia_resources(pod: Pod) -> set[str]:
    """NVIDIA resources any container of the pod (init containers included) asks for."""
    found: set[str] = set()
    for _, container in all_containers(pod):
        found |= nvidia_resources(container)
    return found


def nvidia_count(container: Container, resource: str) -> int | None:
    """The count a container asks for a resource: the limit if set, else the request."""
    for section in ("limits", "requests"):
        value = resource_section(container, section).get(resource)
        if value is not None:
            return whole_count(value)
    return None


def asks_for_gpus(pod: Pod) -> bool:
    """True for a pod gpuOnly policies apply to: it requests an NVIDIA resource or carries the gpus label."""
    if requested_nvidia_resources(pod):
        return True
    label = labels(pod).get(names.GPUS_LABEL)
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
