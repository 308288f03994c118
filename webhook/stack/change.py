"""A planned stack change as every rule sees it, and what a rule is. Pure.

``webhook.stack.checks`` holds the ordered list of rules; the rules live in ``compat`` and in the
preflight modules (``consumers``, ``nodestates``, ``crdstate``, ``dracutover``, ``hardening``),
which take a ``Change`` and so import it from here, not from the list that imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.stack.clusterstate import ClusterSnapshot
from webhook.stack.compat import Check
from webhook.stack.model import Pool, Stack
from webhook.stack.releases import Matrix, Release

ExistingDrivers = Mapping[str, Mapping[str, Any]]
"""NVIDIADriver objects already in Git (and so in the cluster), by CR name."""

UPGRADE, SYNC, PROMOTE, ROLLBACK = "upgrade", "sync", "promote", "rollback"


@dataclass(frozen=True)
class Waivers:
    """What the user accepted on the command line (each an ``--allow-...`` flag); all off by default.

    A waived rule still runs: its check passes with a warning that names the flag, and the commit says so.
    """

    unvalidated_driver: bool = False
    """--allow-unvalidated-driver: a driver outside the target release's validated branches."""
    unlisted_driver: bool = False
    """--allow-unlisted-driver: a driver version not in the list of published driver images."""
    driver_downgrade: bool = False
    """--allow-driver-downgrade: a pool moves to an older driver."""
    operator_downgrade: bool = False
    """--allow-operator-downgrade: a rollback lowers the GPU Operator (and its CRDs)."""


NO_WAIVERS = Waivers()
"""Nothing waived: every rule is held to the letter (the default of every planner)."""


@dataclass(frozen=True, kw_only=True)
class ChangeContext:
    """What the rules read besides the two stacks. Each part is None when it was not read, and a
    rule that needs it says it did not run (SKIP) rather than pass on nothing."""

    values: Mapping[str, Any] | None = None
    """The chart values (values.yaml) as the change leaves them; the keys gpugate derives from
    stack.yaml (versions, upgrade policy) may lag, no rule reads those from here."""
    values_before: Mapping[str, Any] | None = None
    """The chart values before the change (HEAD's)."""
    cluster: ClusterSnapshot | None = None
    """The cluster as read with --kube (or a recorded --cluster-state)."""
    chart_crds_applied: bool | None = None
    """Whether the gpu-operator Application applies the chart's crds/ (Argo CD renders with
    --include-crds unless ``helm.skipCrds``); None when the Application was not read."""
    application: str = "gpu-operator"
    """The name of that Application (its CRDs' Argo CD tracking names it)."""
    chart_crds: Mapping[str, Mapping[str, Any]] | None = None
    """Release -> CRD name -> ``crdstate.CRDShape``: the CRDs each known chart release ships."""


NO_CONTEXT = ChangeContext()
"""Nothing read beyond the stacks: every rule that needs more says so."""


@dataclass(frozen=True, kw_only=True)
class Change:
    """A planned change as every check sees it."""

    action: str
    matrix: Matrix
    release: Release
    """The matrix entry of ``final``'s operator version."""
    current: Stack
    final: Stack
    pools: tuple[str, ...] = ()
    """Pools whose driver the driver rules look at (the planner's choice: changed, or all on an operator move)."""
    existing: ExistingDrivers = field(default_factory=dict)
    waivers: Waivers = NO_WAIVERS
    scope: Check | None = None
    """The planner's verdict on which pools a scoped change (``--pool``, promote) touches."""
    context: ChangeContext = NO_CONTEXT

    @property
    def operator_moves(self) -> bool:
        return self.final.operator_version != self.current.operator_version


@dataclass(frozen=True)
class StackCheck:
    """One rule: its name, the planners (actions) that run it, and what it makes of a change."""

    name: str
    actions: frozenset[str]
    run: Callable[[Change], list[Check]]


def changed_pools(current: Stack, final: Stack) -> tuple[str, ...]:
    """The pools of ``final`` whose driver differs from ``current``'s, or all when the operator moves."""
    before = {p.name: p.driver for p in current.pools}
    moves = final.operator_version != current.operator_version
    return tuple(p.name for p in final.pools if moves or before.get(p.name) != p.driver)


def _driver_identity(pool: Pool) -> tuple[Any, ...]:
    """What a pool's driver pods are made from, labels and annotations aside: a change of any of these
    replaces the loaded kernel module; a change of labels alone takes NVIDIA's restart-only path
    (gpu-operator PR #2527, k8s-operator-libs RestartOnlyPredicate: DRIVER_CONFIG_DIGEST unchanged)."""
    return (pool.driver, pool.driver_type, pool.use_precompiled, pool.resource_name,
            tuple(sorted(pool.node_selector.items())))


def reloaded_pools(change: Change) -> tuple[str, ...]:
    """The pools of ``final`` whose nodes get a new kernel module from this change: all of them when
    the operator or the driver management moves (the driver DaemonSets are re-made), else those whose
    driver identity changed or that are new."""
    current, final = change.current, change.final
    if change.operator_moves or final.management != current.management:
        return tuple(p.name for p in final.pools)
    before = {p.name: _driver_identity(p) for p in current.pools}
    return tuple(p.name for p in final.pools if before.get(p.name) != _driver_identity(p))


ClusterRule = Callable[[Change, ClusterSnapshot], list[Check]]


def needs_cluster(rule: ClusterRule) -> Callable[[Change], list[Check]]:
    """A rule that reads the cluster: it says nothing when none was read (the ``cluster`` check says
    which rules did not run), and is handed the state read otherwise."""

    def run(change: Change) -> list[Check]:
        return [] if change.context.cluster is None else rule(change, change.context.cluster)

    run.__name__, run.__doc__ = rule.__name__, rule.__doc__
    return run
