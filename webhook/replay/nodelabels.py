"""Node labels as one column per key, so a node-affinity requirement is one numpy operation over all
nodes: what the replay's kube-scheduler model (``replay.kubescheduler``) evaluates pods' terms on."""

from __future__ import annotations

import numpy as np

from webhook.kube.affinity import Requirement, SelectorTerm


class NodeLabels:
    """Node labels as one column per key, so a requirement is one numpy operation over all nodes."""

    def __init__(self, names: list[str], labels: list[dict[str, str]]) -> None:
        self.names = np.array(names, dtype=object)
        self.size = len(names)
        self.version = 0
        self._columns: dict[str, list[str | None]] = {}
        self._encoded: dict[str, tuple[np.ndarray, dict[str, int], np.ndarray]] = {}
        self._masks: dict[object, np.ndarray] = {}
        keys = sorted({key for node in labels for key in node})
        for key in keys:
            self._columns[key] = [node.get(key) for node in labels]

    def set_column(self, key: str, values: list[str | None]) -> None:
        """Replace one label on every node (the balancer's relabel); cached evaluations are dropped."""
        if self._columns.get(key) == values:
            return
        self._columns[key] = list(values)
        self._encoded.pop(key, None)
        self._masks.clear()
        self.version += 1

    def update(self, key: str, changes: dict[int, str | None]) -> None:
        """Set one label on some nodes (the balancer relabelling the nodes that changed)."""
        column = self._columns.setdefault(key, [None] * self.size)
        changes = {node: value for node, value in changes.items() if column[node] != value}
        if not changes:
            return
        encoded = self._encoded.get(key)
        for node, value in changes.items():
            column[node] = value
            if encoded is not None:
                codes, vocabulary, numbers = encoded
                codes[node] = -1 if value is None else vocabulary.setdefault(value, len(vocabulary))
                numbers[node] = _as_int(value)
        self._masks.clear()
        self.version += 1

    def value(self, node: int, key: str) -> str | None:
        column = self._columns.get(key)
        return None if column is None else column[node]

    def _encode(self, key: str) -> tuple[np.ndarray, dict[str, int], np.ndarray]:
        found = self._encoded.get(key)
        if found is None:
            column = self._columns.get(key) or [None] * self.size
            vocabulary: dict[str, int] = {}
            codes = np.array([-1 if v is None else vocabulary.setdefault(v, len(vocabulary)) for v in column],
                             dtype=np.int64)
            numbers = np.array([_as_int(v) for v in column], dtype=np.float64)
            found = self._encoded[key] = (codes, vocabulary, numbers)
        return found

    def requirement(self, req: Requirement) -> np.ndarray:
        codes, vocabulary, numbers = self._encode(req.key)
        if req.operator in ("In", "NotIn"):
            wanted = [vocabulary[v] for v in req.values if v in vocabulary]
            inside = np.isin(codes, wanted) if wanted else np.zeros(self.size, dtype=bool)
            return inside if req.operator == "In" else ~inside
        if req.operator == "Exists":
            return codes >= 0
        if req.operator == "DoesNotExist":
            return codes < 0
        bound = _as_int(req.values[0]) if len(req.values) == 1 else np.nan
        if np.isnan(bound):
            return np.zeros(self.size, dtype=bool)
        with np.errstate(invalid="ignore"):
            return numbers > bound if req.operator == "Gt" else numbers < bound

    def field(self, req: Requirement) -> np.ndarray:
        if req.key != "metadata.name" or req.operator not in ("In", "NotIn"):
            return np.zeros(self.size, dtype=bool)
        inside = np.isin(self.names, list(req.values))
        return inside if req.operator == "In" else ~inside

    def term(self, term: SelectorTerm) -> np.ndarray:
        """A term matches where all of its requirements hold; an empty term matches no node."""
        cached = self._masks.get(term)
        if cached is not None:
            return cached
        if not term.expressions and not term.fields:
            mask = np.zeros(self.size, dtype=bool)
        else:
            mask = np.ones(self.size, dtype=bool)
            for req in term.expressions:
                mask &= self.requirement(req)
            for req in term.fields:
                mask &= self.field(req)
        self._masks[term] = mask
        return mask


def _as_int(value: str | None) -> float:
    if value is None:
        return np.nan
    try:
        return float(int(value, 10))
    except ValueError:
        return np.nan
