"""The placement goals the replay's table is judged by, one home for the benchmark and its test.

``benchmarks/placement_table.py`` prints a goal cell beside each list's figures with these;
``tests/replay/test_placement_goals.py`` checks each goal reads a miss where it should. A
benchmark may import a test helper, never the other way round, so the goals live on this side.
Standard library only: the benchmark runs on an install without the test extra.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FGD_TABLE = ROOT / "docs" / "placement.md"
FGD_SECTION = "## The 17 evaluation lists (allocation at 100% arrival, median of seeds 42-51)"


def fgd_figures(path: Path = FGD_TABLE) -> dict[str, float]:
    """The fgd column of docs/placement.md's 17-list table (the reference arm in its published
    model, medians of seeds 42-51, printed by ``table`` in an earlier run; the arm has not changed)."""
    text = path.read_text(encoding="utf-8").split(FGD_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip().strip("*") for cell in rows[0]]
    column = header.index("fgd")
    return {cells[0].strip(): float(cells[column]) for cells in rows[1:] if cells[column].strip()[:1].isdigit()}


def timeslice_goal(placed: list[float | None], over: list[float | None],
                   shares: list[float | None] | None = None) -> str:
    """The goal in timeslice: the extender (last) places at least as many pods as stock and
    BestFit-on-slots (first two), with fewer overcommitted shares. No scheduler in this world sees a
    share's size (a slot is a slot), so which shares are overcommitted is the list's, and their
    count follows the shares placed: with ``shares`` (shares placed, same arms) "fewer" is judged per
    share placed, the extender's overcommitted fraction not above either arm's; without, by count."""
    if None in placed or None in over:
        return "incomplete"
    (stock, best, ext), (o_stock, o_best, o_ext) = placed, over
    misses = []
    if ext < max(stock, best):  # type: ignore[operator,type-var]
        misses.append(f"places {ext - max(stock, best):+g} pods")  # type: ignore[operator,type-var]
    if shares is not None and None not in shares and all(shares):
        rates = [o / n for o, n in zip(over, shares, strict=True)]  # type: ignore[operator]
        if rates[2] > min(rates[0], rates[1]):
            misses.append(f"overcommits {100 * (rates[2] - min(rates[0], rates[1])):+.1f} points more shares")
    elif o_ext >= min(o_stock, o_best):  # type: ignore[operator,type-var]
        misses.append("not fewer overcommitted")
    return ", ".join(misses) or "met"


def _dra_misses(name: str, dra: float, fgd: float) -> list[str]:
    """The goal in dra: the extender at least FGD's figure minus 0.5, and 95.2 on the default list."""
    misses = [f"fgd {dra - fgd:+.2f}"] if dra < fgd - 0.5 else []
    if name == "default" and dra < 95.2:
        misses.append("< 95.2")
    return misses


def world_dra_goal(name: str, dra: float | None, fgd: float | None) -> str:
    """The dra goals for one extender figure: "met", the misses, or "incomplete"."""
    if dra is None or fgd is None:
        return "incomplete"
    return ", ".join(_dra_misses(name, dra, fgd)) or "met"


def dra_goals(name: str, dra: float | None, fgd: float | None, mixed: float | None = None) -> str:
    """The dra goals for the extender as shipped (a learned mix) and, when it was run, for the
    extender given a configured mix (``extender_mix: trace``); a miss of the latter is marked so."""
    if mixed is None or dra is None or fgd is None:
        return world_dra_goal(name, dra, fgd)
    misses = _dra_misses(name, dra, fgd) + [f"{m} (configured mix)" for m in _dra_misses(name, mixed, fgd)]
    return ", ".join(misses) or "met"


def goals(name: str, got: dict[str, float | None]) -> str:
    """The placement goals on one list: the extender as shipped (``extender-packed``, the device
    plugin's packed allocation, when that column is there; else ``extender``) at or above BestFit,
    within 0.5 of FGD, never below the stock scheduler under either device allocation, 95.2 on
    the default list; the same for an ``extender-mix`` column (the extender given the pod list's
    shape mix, ``--extender-mix``), reported apart; and the starter policies never below stock
    under the same allocation."""
    stocks = [v for v in (got.get("stock"), got.get("stock-packed")) if v is not None]
    best, fgd = got.get("bestfit"), got.get("fgd")
    learned = got.get("extender-packed") if got.get("extender-packed") is not None else got.get("extender")
    if learned is None or not stocks or best is None or fgd is None:
        return "incomplete"
    misses = _extender_misses(name, learned, stocks, best, fgd)
    configured = got.get("extender-mix")
    if configured is not None:
        misses += [f"{miss} (configured mix)" for miss in _extender_misses(name, configured, stocks, best, fgd)]
    for suffix in ("", "-packed"):
        starter, stock = got.get(f"gpugate{suffix}"), got.get(f"stock{suffix}")
        if starter is not None and stock is not None and starter < stock:
            misses.append(f"gpugate{suffix} {starter - stock:+.2f} vs stock{suffix}")
    return ", ".join(misses) or "met"


def _extender_misses(name: str, ext: float, stocks: list[float], best: float, fgd: float) -> list[str]:
    misses = []
    if name == "default" and ext < 95.2:
        misses.append("< 95.2")
    if ext < best:
        misses.append("< bestfit")
    if ext < fgd - 0.5:
        misses.append(f"fgd {ext - fgd:+.2f}")
    if ext < max(stocks):
        misses.append("< stock")
    return misses
