"""Which policy applies to a pod: namespace globs, a LabelSelector, gpuOnly, opt-out, priority.

The namespace is always the admission request's: pods made by controllers often arrive
without ``metadata.namespace``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from fnmatch import translate
from functools import lru_cache
from typing import TYPE_CHECKING

from webhook.kube import pods, units
from webhook.kube.affinity import Requirement
from webhook.policy.model import DenyRule, GPUPolicy, LabelSelector, Match

if TYPE_CHECKING:
    from webhook.policy import PolicySet


def namespace_matches(namespace: str, include: tuple[str, ...], exclude: tuple[str, ...] = ()) -> bool:
    """Glob match (``ml-*``, ``team-?``) on the request namespace; excludes win."""
    if not include:
        return False
    if exclude and _globs(exclude).match(namespace):
        return False
    return _globs(include).match(namespace) is not None


@lru_cache(maxsize=1024)
def _globs(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One compiled, case-sensitive regex for a tuple of globs (policies are immutable, so cache)."""
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns))


def requirement_matches(requirement: Requirement, labels: dict[str, str]) -> bool:
    present = requirement.key in labels
    if requirement.operator == "In":
        return present and labels[requirement.key] in requirement.values
    if requirement.operator == "NotIn":
        return not present or labels[requirement.key] not in requirement.values
    if requirement.operator == "Exists":
        return present
    return not present  # DoesNotExist


def selector_matches(selector: LabelSelector, labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics: every requirement holds; the empty selector matches all."""
    return all(requirement_matches(r, labels) for r in selector.requirements())


def match_applies(match: Match, pod: pods.Pod, namespace: str, *, asks_for_gpus: bool | None = None) -> bool:
    """``asks_for_gpus`` may be passed in when known, so selecting among many policies reads the
    pod's containers once."""
    if not namespace_matches(namespace, match.namespaces, match.exclude_namespaces):
        return False
    if not selector_matches(match.pod_selector, pods.labels(pod)):
        return False
    if not match.gpu_only:
        return True
    return pods.asks_for_gpus(pod) if asks_for_gpus is None else asks_for_gpus


def select(policies: PolicySet, pod: pods.Pod, *, namespace: str, honor_skip: bool = True,
           asks_for_gpus: bool | None = None) -> GPUPolicy | None:
    """The highest-priority policy whose match applies, or None (also for opted-out pods).

    Policies are kept sorted by descending priority, and equal priorities that could both
    match are refused at load, so the first hit is the only answer. A policy in mode ``off``
    is as if absent: switching one off never changes which other policy a pod gets.
    ``honor_skip=False`` is for validation: the opt-out label skips shaping, never the limits.
    ``asks_for_gpus`` may be passed in by a caller that already knows it.
    """
    if honor_skip and pods.is_skipped(pod):
        return None
    gpu_pod = pods.asks_for_gpus(pod) if asks_for_gpus is None else asks_for_gpus
    return next((p for p in policies.policies
                 if p.mode != "off" and match_applies(p.match, pod, namespace, asks_for_gpus=gpu_pod)), None)


def deny_applies(rule: DenyRule, pod: pods.Pod, namespace: str) -> bool:
    return namespace_matches(namespace, rule.namespaces) and selector_matches(rule.pod_selector, pods.labels(pod))


def applicable_denies(policies: PolicySet, pod: pods.Pod, namespace: str) -> Iterator[tuple[GPUPolicy, DenyRule]]:
    """Each deny rule that applies to ``pod``, with its policy: of every policy not ``off`` whose
    namespaces and podSelector match, whatever its priority (a deny is never hidden by priority).

    The one home of that rule: validation denies by it, and mutation leaves a pod it will deny
    unshaped, so the pod's author reads the denial alone.
    """
    labels = pods.labels(pod)
    for policy in policies.policies:
        if policy.mode == "off" or not policy.deny or not namespace_matches(
                namespace, policy.match.namespaces, policy.match.exclude_namespaces) \
                or not selector_matches(policy.match.pod_selector, labels):
            continue
        for rule in policy.deny:
            if deny_applies(rule, pod, namespace):
                yield policy, rule


def gpu_names(policies: PolicySet, classes: units.DeviceClasses = units.ASSUMED) -> units.GpuNames:
    """Which resource names are GPU asks under ``policies`` in a cluster with ``classes``: the
    device plugin's, and the DRA extended-resource names of the NVIDIA classes, of every class a
    policy lists in ``claims.deviceClasses``, and of every known class that can select NVIDIA GPUs."""
    listed = frozenset(c for p in policies.policies for c in (p.claims.device_classes or ()))
    return units.gpu_names(classes, listed)
