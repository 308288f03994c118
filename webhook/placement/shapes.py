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

from webhook.placement.devices import MILLI
from webhook.placement.inputs import PodDemand

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
    if demand.mig and not demand.uses_devices:
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
