"""FGD's fragment measure of a node, and how much one pod would change it (memoized, pure Python).

For a node n and a typical shape m (Weng et al., ATC'23, ``pkg/utils/frag.go``): if m wants GPUs,
may use n's product, finds ``gpus`` GPUs each with at least its ``milli`` left and its cpu fits the
node's cpu left, the fragment is the thousandths left on the GPUs too small for m; in every other
case (a CPU shape included) it is all the node's idle GPU thousandths. F_n is the weighted sum
over the mix. A pod's delta is F_n after it minus F_n before; FGD places where F drops most.

The measure reads only the node's product, the multiset of what its GPUs have left
(``NodeView.signature``) and which of the mix's cpu thresholds its cpu left reaches (its cpu
class). For one (product, signature) a table of prefix sums over the cpu classes gives F for every
class at once; nodes of a cluster share few signatures, so the tables are few, and a delta is
then two table reads. ``points`` memoizes FGD's score per (node key, pod shape) on top.

One addition for a node that takes shares only (``serves`` ``shares``: a time-sliced node that
advertises only ``nvidia.com/gpu.shared``): FGD asks whether *one* pod of each shape still fits, but
such a node has four slots per GPU, and the shares ask about three times the cpu per GPU that
whole-GPU pods do, so its cpu runs out long before its slots. Its fragment therefore also counts
the slots its cpu cannot serve (``stranded``): free slots beyond what the cpu left carries at the
mix's mean cpu per share. A CPU pod on such a node then costs the slots its cpu would have served,
and a share goes where its cpu matches what the node has per slot (a large share to a node rich in
cpu per slot), so neither the node's slots nor its cpu are left over. A node that takes whole GPUs
or either kind (every DRA device, the published model) is measured exactly as before.
docs/placement.md measures it (the timeslice world).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable

from webhook.placement import devices
from webhook.placement.devices import DevicePolicy, Serves
from webhook.placement.shapes import ShapeMix

MEMO_LIMIT = 200_000
"""Entries kept before a memo is emptied: bounds the balancer's memory (a few tens of MB)."""
MAX_POINTS = 100
NO_FIT = -1

Table = tuple[tuple[float, ...], tuple[float, ...], int]
"""Per cpu class c: weighted thousandths lost by the shapes that fit, their weight; and the idle total."""


def fgd_points(delta: float) -> int:
    """FGD's score plugin: ``int(100 * sigmoid(-dF / 1000))``, unnormalized (the artifact's ``frag.go``)."""
    exponent = delta / 1000
    if exponent > 700:   # exp would overflow; the score is 0 long before
        return 0
    return int(MAX_POINTS / (1.0 + math.exp(exponent)))


class Fragmenter:
    """The fragment measure for one shape mix and device policy; deterministic, the memos only save work."""

    def __init__(self, mix: ShapeMix, policy: DevicePolicy = "distributed") -> None:
        self.mix = mix
        self.policy = policy
        self.thresholds: tuple[int, ...] = tuple(sorted({shape.cpu for shape in mix.shapes}))
        # GPU shapes as (cpu class index, milli, gpus, products, weight); a shape's cpu fits a node
        # whose cpu class (thresholds reached) is above its index.
        self._rows = tuple((self.thresholds.index(s.cpu), s.milli, s.gpus, frozenset(s.products), w)
                           for s, w in zip(mix.shapes, mix.weights, strict=True) if s.wants_gpu)
        self._access: dict[tuple[str, Serves], tuple[tuple[int, int, int, float], ...]] = {}
        self._tables: dict[tuple[str, tuple[int, ...], Serves], Table] = {}
        self._slot_need: dict[str, tuple[float, tuple[tuple[int, float], ...]]] = {}
        self.memo: dict[tuple[object, ...], int] = {}
        """``points`` by (product, signature, cpu class before, after, gpus, share, ordered, serves): read
        directly by the hot loop."""

    def cpu_class(self, cpu_left: int) -> int:
        """How many of the mix's cpu thresholds ``cpu_left`` reaches (-1 when negative: nothing fits)."""
        return bisect_right(self.thresholds, cpu_left) if cpu_left >= 0 else -1

    def _rows_for(self, product: str, serves: Serves = "any") -> tuple[tuple[int, int, int, float], ...]:
        """The GPU shapes that may use a node of ``product`` that takes ``serves``:
        (cpu class index, milli, gpus, weight). A shape the node cannot take (a whole-GPU shape on
        a node of time-sliced slots, a share on a node of whole GPUs) counts all its idle GPU as
        fragment, as a shape pinned to another product does."""
        rows = self._access.get((product, serves))
        if rows is None:
            rows = self._access[(product, serves)] = tuple(
                (index, milli, gpus, weight) for index, milli, gpus, products, weight in self._rows
                if (not products or product in products) and devices.takes(serves, milli))
        return rows

    def slot_need(self, product: str) -> tuple[float, tuple[tuple[int, float], ...]]:
        """What the mix's shares ask of a share-only node of ``product``: their mean cpu per share
        (millicores; 0 without shares) and each share size (thousandths) with its part of the shares'
        weight. Shares asking no cpu are left out: they strand nothing."""
        found = self._slot_need.get(product)
        if found is None:
            rows = [(shape.cpu, shape.milli, weight) for shape, weight in zip(self.mix.shapes, self.mix.weights,
                                                                              strict=True)
                    if shape.wants_gpu and shape.milli < devices.MILLI and shape.cpu > 0
                    and (not shape.products or product in shape.products)]
            total = sum(weight for _, _, weight in rows)
            found = (0.0, ()) if not total else (
                sum(cpu * weight for cpu, _, weight in rows) / total,
                tuple((milli, weight / total) for _, milli, weight in rows))
            self._slot_need[product] = found
        return found

    def stranded(self, product: str, signature: tuple[int, ...], cpu_left: int) -> float:
        """Idle thousandths of a share-only node that its cpu cannot serve: per share size of the mix,
        the slots free beyond what ``cpu_left`` carries at the shares' mean cpu, weighted by the
        size's part of the shares (see the module docstring)."""
        per, sizes = self.slot_need(product)
        out = 0.0
        for milli, part in sizes:
            out += part * max(0.0, sum(free // milli for free in signature) - max(0, cpu_left) / per) * milli
        return out

    def table(self, product: str, signature: tuple[int, ...], serves: Serves = "any") -> Table:
        """Prefix sums over cpu classes for one (product, GPUs left, what it takes): F for any class in O(1)."""
        key = (product, signature, serves)
        found = self._tables.get(key)
        if found is not None:
            return found
        classes = len(self.thresholds) + 1
        lost = [0.0] * classes
        usable = [0.0] * classes
        by_milli: dict[int, tuple[int, int]] = {}
        for index, milli, gpus, weight in self._rows_for(product, serves):
            counted = by_milli.get(milli)
            if counted is None:
                enough = small = 0
                for free in signature:
                    if free >= milli:
                        enough += 1
                    else:
                        small += free
                counted = by_milli[milli] = (enough, small)
            if counted[0] >= gpus:
                lost[index + 1] += weight * counted[1]
                usable[index + 1] += weight
        for c in range(1, classes):
            lost[c] += lost[c - 1]
            usable[c] += usable[c - 1]
        found = (tuple(lost), tuple(usable), sum(signature))
        if len(self._tables) >= MEMO_LIMIT:
            self._tables.clear()
        self._tables[key] = found
        return found

    def warm(self, keys: Iterable[tuple[str, tuple[int, ...], Serves]]) -> None:
        """Build the tables of these (product, signature, serves) now (off the request path)."""
        for product, signature, serves in keys:
            self.table(product, signature, serves)

    def fragment(self, product: str, signature: tuple[int, ...], cpu_class: int, serves: Serves = "any") -> float:
        """F_n: idle GPU thousandths the mix cannot use, expected over the mix (all of them if it is empty)."""
        lost, usable, total = self.table(product, signature, serves)
        if cpu_class < 0 or not total:
            return float(total)
        if not self.mix.weights:
            return 0.0
        return lost[cpu_class] + (1.0 - usable[cpu_class]) * total

    def delta(self, product: str, signature: tuple[int, ...], cpu_left: int, cpu: int, gpus: int,
              share_milli: int, ordered: bool = False, serves: Serves = "any") -> float | None:
        """F_n after the pod minus before (negative: the pod fills a fragment); None: it does not fit.
        ``ordered``: a DRA node, whose signature is in device order and allocated first fit;
        ``serves``: which shapes the node's GPUs take (``devices.Serves``); a share-only node's
        stranded slots count too (``stranded``)."""
        after = self.cpu_class(cpu_left - cpu)
        remaining = devices.after_sorted(signature, gpus, share_milli, "first" if ordered else self.policy)
        if remaining is None or after < 0:
            return None
        change = self.fragment(product, remaining, after, serves) - \
            self.fragment(product, signature, self.cpu_class(cpu_left), serves)
        if serves == "shares":
            change += self.stranded(product, remaining, cpu_left - cpu) - self.stranded(product, signature, cpu_left)
        return change

    def points(self, product: str, signature: tuple[int, ...], cpu_left: int, cpu: int, gpus: int,
               share_milli: int, ordered: bool = False, serves: Serves = "any") -> int:
        """FGD's 0..100 score of placing the pod on the node (``NO_FIT``: it does not fit); memoized."""
        thresholds = self.thresholds
        key: tuple[object, ...]
        if serves == "shares":  # stranded slots read the exact cpu, not its class
            key = ("shares", product, signature, cpu_left, cpu, gpus, share_milli, ordered)
        else:
            key = (product, signature, bisect_right(thresholds, cpu_left) if cpu_left >= 0 else -1,
                   bisect_right(thresholds, cpu_left - cpu) if cpu_left >= cpu else -1, gpus, share_milli, ordered,
                   serves)
        found = self.memo.get(key)
        if found is None:
            delta = self.delta(product, signature, cpu_left, cpu, gpus, share_milli, ordered, serves)
            found = NO_FIT if delta is None else fgd_points(delta)
            if len(self.memo) >= MEMO_LIMIT:
                self.memo.clear()
            self.memo[key] = found
        return found
