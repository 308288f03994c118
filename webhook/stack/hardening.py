"""NVIDIA's hardening against GPU access by pods that ask for none, read from the chart's values. Pure.

NVIDIA's CUDA images set ``NVIDIA_VISIBLE_DEVICES=all``. A container runtime that honours that
variable in an unprivileged container gives a pod that asked for no GPU every GPU of its node
(NVIDIA/k8s-device-plugin#61, NVIDIA/gpu-operator#700); an admission webhook cannot see an image's
environment, so the fix belongs to the stack. NVIDIA's documented hardening is two settings:

* the container toolkit ignores the variable in unprivileged containers
  (``ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false``, the toolkit's
  ``accept-nvidia-visible-devices-envvar-when-unprivileged``) and accepts a device list passed as
  volume mounts (``ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS=true``);
* the device plugin passes the list that way (``DEVICE_LIST_STRATEGY=volume-mounts``), so pods
  that did ask still get their GPUs.

The chart has no dedicated keys for them at any release we pin (v25.10.1, v26.3.3, v26.7.0): they
are entries of ``toolkit.env`` and ``devicePlugin.env``, which the operator applies after its own
defaults, the CDI device-list strategy included (controllers/object_controls.go TransformToolkit and
TransformDevicePlugin, the same order at all three tags), so for a repeated name the last entry wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.stack.compat import Check

NAME = "device-hardening"
TOOLKIT_ENV: tuple[tuple[str, str], ...] = (
    ("ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED", "false"),
    ("ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "true"),
)
DEVICE_LIST_STRATEGY = "DEVICE_LIST_STRATEGY"
VOLUME_MOUNTS = "volume-mounts"
SOURCE = ("NVIDIA/k8s-device-plugin#61, NVIDIA/gpu-operator#700; the toolkit's "
          "accept-nvidia-visible-devices-envvar-when-unprivileged")
FIX = ("in manifests/gpu-operator/values.yaml keep toolkit.env "
       "[{name: ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED, value: \"false\"}, "
       "{name: ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS, value: \"true\"}] and devicePlugin.env "
       "[{name: DEVICE_LIST_STRATEGY, value: volume-mounts}]")


def component_env(values: Mapping[str, Any], component: str) -> dict[str, str]:
    """``<component>.env`` as the operator applies it: in order, a later entry of one name winning."""
    section = values.get(component)
    entries = section.get("env") if isinstance(section, Mapping) else None
    found: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            found[entry["name"]] = str(entry.get("value", ""))
    return found


def _enabled(values: Mapping[str, Any], component: str) -> bool:
    section = values.get(component)
    return not (isinstance(section, Mapping) and section.get("enabled") is False)


def gaps(values: Mapping[str, Any]) -> list[str]:
    """What of the hardening ``values`` leave out, one phrase each (empty: all of it is set)."""
    found: list[str] = []
    if _enabled(values, "toolkit"):
        toolkit = component_env(values, "toolkit")
        for name, wanted in TOOLKIT_ENV:
            if toolkit.get(name, "").lower() != wanted:
                have = f"{name}={toolkit[name]!r}" if name in toolkit else f"no {name}"
                found.append(f"toolkit.env has {have}, not {wanted!r}")
    if _enabled(values, "devicePlugin"):
        strategy = component_env(values, "devicePlugin").get(DEVICE_LIST_STRATEGY)
        if strategy is None or VOLUME_MOUNTS not in [s.strip() for s in strategy.split(",")]:
            have = f"{DEVICE_LIST_STRATEGY}={strategy!r}" if strategy is not None else f"no {DEVICE_LIST_STRATEGY}"
            found.append(f"devicePlugin.env has {have}, not {VOLUME_MOUNTS!r}")
    return found


def toolkit_ignores_visible_devices(values: Mapping[str, Any] | None) -> bool:
    """Whether an unprivileged container's ``NVIDIA_VISIBLE_DEVICES`` reaches no GPU under ``values``
    (False when the values are unknown or the toolkit is not the operator's: nothing proves it)."""
    if values is None or not _enabled(values, "toolkit"):
        return False
    return component_env(values, "toolkit").get(TOOLKIT_ENV[0][0], "").lower() == TOOLKIT_ENV[0][1]


def check_device_hardening(values: Mapping[str, Any] | None, before: Mapping[str, Any] | None = None) -> Check:
    """Warn (never refuse: it is a site's choice) when the values leave the hardening out, and say
    whether this change is what removed it."""
    if values is None:
        return Check(name=NAME, ok=True, skipped=True, reason="values.yaml not read: the hardening was not checked")
    missing = gaps(values)
    host = [c for c in ("toolkit", "devicePlugin") if not _enabled(values, c)]
    if not missing:
        where = (f" ({' and '.join(host)} not the operator's: set the same in the host's configuration)"
                 if host else "")
        return Check(name=NAME, ok=True, source=SOURCE,
                     reason="pods that ask for no GPU get none from NVIDIA_VISIBLE_DEVICES: toolkit ignores it "
                            f"unprivileged, device plugin passes {VOLUME_MOUNTS}{where}")
    removed = before is not None and not gaps(before)
    cause = "this change removes NVIDIA's hardening" if removed else "NVIDIA's hardening is not set"
    return Check(name=NAME, ok=True, source=SOURCE, fix=FIX,
                 reason=f"{cause}: {'; '.join(missing)}",
                 warning=f"{cause} ({'; '.join(missing)}): a pod that asks for no GPU but whose image sets "
                         f"NVIDIA_VISIBLE_DEVICES=all (NVIDIA's CUDA images do) sees every GPU of its node. "
                         f"Fix: {FIX}")
