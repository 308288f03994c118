"""The pod shapes a fragment is measured against: FGD's "typical pods", from recent pods or configured.

A shape is (cpu, thousandths per GPU, GPU count, allowed products); memory is left out, as FGD
leaves it out. The mix is the most common shapes, by count, until they cover ``popularity`` of the
pods (FGD's 95%), each weighted by its share. CPU-only pods are shapes too: for them every idle
GPU of a node is fragment, which is what makes FGD keep CPU pods off the CPU of empty GPU nodes.
MIG pods take fixed slices, not a share of a GPU's thousandths: they are not in the mix.

``ShapeWindow`` keeps the last N shapes the balancer saw created and looks at the mix every
``refresh`` pods; it takes a new mix only when it moved by more than ``tolerance`` (total
variation), so the measure's memos (which a new mix empties) survive a steady workload.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.kube.demand import PodDemand
from webhook.placement.devices import MILLI

POPULARITY = 0.95


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """One pod shape; ``milli`` is per GPU (0: no GPU), ``products`` sorted (empty: any)."""

    cpu: int
    milli: int = 0
    gpus: int = 0
    products: tuple[str, ...] = ()

    @property
    def wants_gpu(self) -> bool:
        return self.milli > 0


def shape_of(demand: PodDemand) -> Shape | None:
    """The shape of a demand, or None for a MIG pod (its slices are not GPU thousandths)."""
    if demand.extended and not demand.uses_devices:
        return None
    products = tuple(sorted(demand.products))
    if demand.gpus:
        return Shape(demand.cpu, MILLI, demand.gpus, products)
    if demand.share_milli:
        return Shape(demand.cpu, demand.share_milli, 1, products)
    return Shape(demand.cpu)


@dataclass(frozen=True, slots=True)
class ShapeMix:
    """The typical shapes and their weights (summing to 1); equal mixes compare (and hash) equal."""

    shapes: tuple[Shape, ...] = ()
    weights: tuple[float, ...] = ()

    @classmethod
    def from_counts(cls, counts: Mapping[Shape, int], *, popularity: float = POPULARITY) -> ShapeMix:
        """Most common first (ties: the larger shape first), cut once ``popularity`` of pods is covered."""
        ordered = sorted(((n, shape) for shape, n in counts.items() if n > 0), reverse=True)
        total = sum(n for n, _ in ordered)
        chosen: list[tuple[int, Shape]] = []
        covered = 0
        for count, shape in ordered:
            if covered >= popularity * total:
                break
            chosen.append((count, shape))
            covered += count
        return cls(shapes=tuple(s for _, s in chosen), weights=tuple(n / covered for n, _ in chosen))

    @classmethod
    def from_demands(cls, demands: Iterable[PodDemand], *, popularity: float = POPULARITY) -> ShapeMix:
        """The mix of a configured list of pods (e.g. a trace's pod list)."""
        found = (shape_of(d) for d in demands)
        return cls.from_counts(Counter(s for s in found if s is not None), popularity=popularity)


def distance(one: ShapeMix, other: ShapeMix) -> float:
    """Total variation distance between two mixes (0: the same, 1: nothing in common)."""
    weights = dict(zip(one.shapes, one.weights, strict=True))
    for shape, weight in zip(other.shapes, other.weights, strict=True):
        weights[shape] = weights.get(shape, 0.0) - weight
    return 0.5 * sum(abs(w) for w in weights.values())


class ShapeWindow:
    """The last ``size`` pod shapes seen, and the mix they make, rebuilt every ``refresh`` additions.

    Mutable on purpose (the balancer feeds it from its pod watch), but with no clock: what it
    holds depends only on the shapes added, in order.
    """

    def __init__(self, *, size: int = 2000, refresh: int = 100, popularity: float = POPULARITY,
                 tolerance: float = 0.05) -> None:
        self.size, self.refresh, self.popularity = max(1, size), max(1, refresh), popularity
        self.tolerance = tolerance
        self._recent: deque[Shape] = deque()
        self._counts: Counter[Shape] = Counter()
        self._since = 0
        self._mix = ShapeMix()

    def add(self, shape: Shape | None) -> bool:
        """Count one pod's shape; True when the mix was rebuilt (and differs from the last one)."""
        if shape is None:
            return False
        self._recent.append(shape)
        self._counts[shape] += 1
        if len(self._recent) > self.size:
            old = self._recent.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._since += 1
        # The first pods rebuild at once (an empty mix scores nothing), later ones every `refresh`.
        if self._since >= self.refresh or len(self._recent) <= self.refresh:
            self._since = 0
            mix = ShapeMix.from_counts(self._counts, popularity=self.popularity)
            if distance(mix, self._mix) > self.tolerance or not self._mix.shapes:
                self._mix = mix
                return True
        return False

    def __len__(self) -> int:
        return len(self._recent)

    def mix(self) -> ShapeMix:
        return self._mix


class MixError(ValueError):
    """A configured pod-shape mix that cannot be used; ``str()`` names the entry and the field."""


_ENTRY_KEYS = frozenset({"cpu", "gpus", "gpuMilli", "products", "weight"})


def parse_mix(entries: Any, source: str = "mix") -> ShapeMix:
    """A configured mix from its YAML form: a list of shapes, each with a positive ``weight``.

    ``cpu`` in millicores; ``gpus`` whole devices (0 or absent: a CPU-only pod); ``gpuMilli`` the
    thousandths of one GPU a time-sliced share asks (1-999, with ``gpus: 1``; absent: whole GPUs);
    ``products`` the GPU products the pods are pinned to (absent: any). Weights are relative (they
    are scaled to sum to 1), so counts of pods seen work as they are; a shape listed twice adds up.
    The whole mix is used as given, in its order: the popularity cut applies to learned mixes only.
    """
    if not isinstance(entries, list) or not entries:
        raise MixError(f"{source}: a mix is a non-empty list of pod shapes")
    weights: dict[Shape, float] = {}
    for index, entry in enumerate(entries):
        where = f"{source}[{index}]"
        if not isinstance(entry, dict):
            raise MixError(f"{where}: a shape is a mapping with cpu, gpus, gpuMilli, products and weight")
        unknown = sorted(set(entry) - _ENTRY_KEYS)
        if unknown:
            raise MixError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(_ENTRY_KEYS))}")
        cpu, gpus = _count(entry, "cpu", where), _count(entry, "gpus", where)
        milli = _count(entry, "gpuMilli", where) if "gpuMilli" in entry else (MILLI if gpus else 0)
        if gpus and not 0 < milli <= MILLI:
            raise MixError(f"{where}: gpuMilli must be 1-{MILLI} (thousandths of one GPU), got {milli}")
        if milli and not gpus:
            raise MixError(f"{where}: gpuMilli needs gpus (a share is gpus: 1)")
        if milli < MILLI and gpus > 1:
            raise MixError(f"{where}: a share (gpuMilli {milli}) is one GPU's; got gpus: {gpus}")
        products = entry.get("products", [])
        if not isinstance(products, list) or not all(isinstance(p, str) and p for p in products):
            raise MixError(f"{where}: products must be a list of GPU product names")
        weight = entry.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise MixError(f"{where}: weight must be a number above 0, got {weight!r}")
        shape = Shape(cpu, milli, gpus, tuple(sorted(set(products))))
        weights[shape] = weights.get(shape, 0.0) + float(weight)
    total = sum(weights.values())
    # A mix written by mix_entries already sums to 1 (to rounding): kept exactly, so it reads back equal.
    scale = 1.0 if abs(total - 1.0) < 1e-9 else total
    return ShapeMix(shapes=tuple(weights), weights=tuple(w / scale for w in weights.values()))


def _count(entry: dict[str, Any], key: str, where: str) -> int:
    value = entry.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MixError(f"{where}: {key} must be a whole number of at least 0, got {value!r}")
    return value


def mix_entries(mix: ShapeMix) -> list[dict[str, Any]]:
    """The YAML form ``parse_mix`` reads, e.g. to pin a mix learned from a cluster's pods."""
    out: list[dict[str, Any]] = []
    for shape, weight in zip(mix.shapes, mix.weights, strict=True):
        entry: dict[str, Any] = {"cpu": shape.cpu}
        if shape.gpus:
            entry["gpus"] = shape.gpus
            if shape.milli != MILLI:
                entry["gpuMilli"] = shape.milli
        if shape.products:
            entry["products"] = list(shape.products)
        entry["weight"] = weight
        out.append(entry)
    return out
