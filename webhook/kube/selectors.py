"""What the CEL selectors gpugate writes prove about the devices they select. Pure.

Read only from conjunctions of the few term forms gpugate itself writes, so a selector written to
look like a bound inside a longer expression never lowers a count (``kube.units.device_share``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from webhook import names
from webhook.kube.resources import MigProfile, mig_profile

_QUOTED = r"[\"']"
DRIVER_TERM = re.compile(rf"^device\.driver\s*==\s*{_QUOTED}([a-z0-9.-]+){_QUOTED}$")
_PROFILE_TERM = re.compile(rf"^device\.attributes\[{_QUOTED}{re.escape(names.DRA_DRIVER)}{_QUOTED}\]"
                           rf"\.{names.DRA_PROFILE_ATTRIBUTE}\s*==\s*{_QUOTED}([1-9][0-9]*g\.[1-9][0-9]*gb){_QUOTED}$")
_MEMORY_TERM = re.compile(rf"^device\.capacity\[{_QUOTED}{re.escape(names.DRA_DRIVER)}{_QUOTED}\]"
                          rf"\.{names.DRA_MEMORY_CAPACITY}\.compareTo\(quantity\({_QUOTED}([0-9]+)Mi{_QUOTED}\)\)"
                          rf"\s*>=\s*0$")
_TYPE_TERM = re.compile(rf"^device\.attributes\[{_QUOTED}{re.escape(names.DRA_DRIVER)}{_QUOTED}\]\.type\s*==\s*"
                        rf"{_QUOTED}[a-z]+{_QUOTED}$")


def conjuncts(expression: str) -> tuple[str, ...]:
    """The terms of a CEL expression that is a plain conjunction (``a && b``); () for anything else
    (an ``||``, a ternary, a negation), whose terms do not each bound the devices it selects."""
    if "||" in expression or "?" in expression or "!" in expression.replace("!=", ""):
        return ()
    return tuple(term.strip() for term in expression.split("&&"))


@dataclass(frozen=True, slots=True)
class SelectorBounds:
    """What the CEL selectors of one ask (or one class) provably say about its devices.

    Read only from selectors that are conjunctions of terms each of exactly one of the forms gpugate
    writes (``webhook/admission/claimladder.py``, ``kube.claims.memory_selector``): a selector with
    any other term says nothing here, so a term written to look like a bound inside a longer
    expression (a string literal holding ``&&``) never lowers a count."""

    mig: MigProfile | None = None
    """``profile == "<g>g.<mem>gb"``: every device is a MIG slice of that profile."""
    min_memory_mib: int | None = None
    """``memory.compareTo(quantity("<n>Mi")) >= 0``: every device holds at least that much."""
    shareable: bool = False
    """``device.allowMultipleAllocations == true``: a capacity request takes a share of the device."""


def selector_bounds(selectors: tuple[str, ...]) -> SelectorBounds:
    """The bounds ANDed selectors prove (:class:`SelectorBounds`)."""
    mig: MigProfile | None = None
    memory: int | None = None
    shareable = False
    for expression in selectors:
        terms = conjuncts(expression)
        if not terms or not all(_known_term(t) for t in terms):
            continue
        for term in terms:
            if (found := _PROFILE_TERM.match(term)) is not None:
                mig = mig_profile(f"{names.MIG_RESOURCE_PREFIX}{found.group(1)}") or mig
            elif (found := _MEMORY_TERM.match(term)) is not None:
                memory = max(memory or 0, int(found.group(1)))
            elif term == names.DRA_SHARE_SELECTOR:
                shareable = True
    return SelectorBounds(mig=mig, min_memory_mib=memory, shareable=shareable)


def _known_term(term: str) -> bool:
    return term == names.DRA_SHARE_SELECTOR or any(p.match(term) for p in (DRIVER_TERM, _PROFILE_TERM, _MEMORY_TERM,
                                                                          _TYPE_TERM))
