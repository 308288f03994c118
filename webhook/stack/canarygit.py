"""The Git side of the canary controller: which rollout a canary pool is in, whether it was decided, the
decision's commit, and a push that is never forced.

Git is the record: a rollout is the newest commit that changed a canary pool's driver (unless that
commit was itself a rollback); a decision is a commit whose trailer ``Gpugate-Canary`` names the
pool and that rollout (one line per pool: the pools that fail in one look are rolled back by one
commit, so many failing at once do not queue behind each other's commits). Before acting the controller looks for one,
so a restarted or newly elected controller never acts twice on one rollout. A push the remote
refuses (its branch moved on) is redone on the new head, where the rollout and the absence of a
decision are checked again; after ``attempts`` refusals it gives up, loudly, and never forces.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from webhook.errors import GpugateError
from webhook.stack import manifests, upgrade
from webhook.stack.canary import Analysis
from webhook.stack.canarymodes import CanaryDecision, Rollout
from webhook.stack.gitrepo import GIT_TIMEOUT_SECONDS, PushRefused, Repo
from webhook.stack.messages import TRAILER
from webhook.stack.model import Stack

TRAILER_KEY = "Gpugate-Canary"
"""``<pool> <rollout sha> <decision> [<failure mode>]``, one line per pool a commit decides."""
PUSH_ATTEMPTS = 3


class GaveUp(GpugateError):
    """The decision could not be pushed: the remote refused every attempt (it is never forced)."""


def _stack_at(repo: Repo, rev: str) -> Stack | None:
    text = repo.show_file(rev, manifests.STACK_FILE)
    try:
        return Stack.from_yaml(text) if text is not None else None
    except GpugateError:
        return None


def _action(repo: Repo, sha: str) -> str:
    proc = subprocess.run(["git", "show", "-s", f"--format=%(trailers:key={TRAILER},valueonly)", sha], cwd=repo.path,
                          capture_output=True, text=True, timeout=GIT_TIMEOUT_SECONDS, check=False)
    return proc.stdout.strip()


def rollouts(repo: Repo, pools: tuple[str, ...], *, limit: int = 100) -> dict[str, Rollout | None]:
    """For each pool: the commit that set its driver in HEAD's stack.yaml, if that was not a rollback."""
    found: dict[str, Rollout | None] = {}
    pending = set(pools)
    history = repo.changes_of(manifests.STACK_FILE, limit=limit)
    after: Stack | None = _stack_at(repo, history[0][0]) if history else None
    for sha, when in history:
        if not pending or after is None:
            break
        before = _stack_at(repo, f"{sha}^")
        for pool in sorted(pending):
            now = next((p.driver for p in after.pools if p.name == pool), None)
            was = next((p.driver for p in before.pools if p.name == pool), None) if before is not None else None
            if now is None:
                found[pool] = None
                pending.discard(pool)
            elif was != now:
                is_rollback = _action(repo, sha) == "rollback" or was is None
                found[pool] = None if is_rollback else Rollout(pool=pool, commit=sha, from_driver=was or now,
                                                               to_driver=now, started=when)
                pending.discard(pool)
        after = before
    return {pool: found.get(pool) for pool in pools}


@dataclass(frozen=True)
class Decided:
    """One decision a commit records: trailer ``Gpugate-Canary: <pool> <rollout sha> <decision> [<mode>]``,
    one per pool (a rollback commit can roll back several pools that failed in the same look)."""

    pool: str
    rollout: str
    decision: str
    mode: str = ""

    def trailer(self) -> tuple[str, str]:
        return TRAILER_KEY, " ".join(v for v in (self.pool, self.rollout, self.decision, self.mode) if v)

    @classmethod
    def parse(cls, value: str) -> Decided | None:
        parts = value.split()
        return cls(*parts[:4]) if len(parts) >= 3 else None


def _recorded(repo: Repo, limit: int = 500) -> list[tuple[str, float, Decided]]:
    return [(sha, when, found) for sha, when, values in repo.trailer_commits(TRAILER_KEY, limit=limit)
            for value in values if (found := Decided.parse(value)) is not None]


def decisions(repo: Repo) -> dict[tuple[str, str], tuple[str, str]]:
    """(pool, rollout commit) -> (sha, decision) of every canary decision in the newest commits."""
    return {(d.pool, d.rollout): (sha, d.decision) for sha, _, d in _recorded(repo)}


def decision_of(repo: Repo, rollout: Rollout) -> tuple[str, str] | None:
    """(sha, decision) of the commit that decided ``rollout``, if one exists."""
    return decisions(repo).get((rollout.pool, rollout.commit))


@dataclass(frozen=True, kw_only=True)
class Where:
    """The controller's clone and where it pushes."""

    repo: Repo
    remote: str = "origin"
    """The remote's name in the clone: where the branch is fetched from and pushed to."""
    branch: str = "main"
    schema_root: Path | None = None


Due = tuple[Rollout, CanaryDecision]
"""A pool's rollout and the decision taken on it."""


def _notes(due: list[Due]) -> list[str]:
    notes = []
    for rollout, decision in due:
        notes.append(f"canary pool {rollout.pool}, rollout {rollout.commit[:12]} ({rollout.from_driver} -> "
                     f"{rollout.to_driver})" + (f": failure mode: {decision.mode}" if decision.mode else ""))
        notes += [f"evidence ({rollout.pool}): {line}" for line in decision.evidence]
    return notes


def prepare(where: Where, analysis: Analysis, due: list[Due]) -> upgrade.Prepared:
    """The decisions as one checked commit on the clone's head (not yet made): a promote, or the
    rollback of every pool in ``due`` (each back to the driver it ran before its rollout)."""
    chart = upgrade.chart_settings(where.repo.root, helm=None, chart_repo=None, skip=True)
    rollout, decision = due[0]
    if decision.action == "rollback":
        prepared = upgrade.prepare_pool_rollback(where.repo, drivers={r.pool: r.from_driver for r, _ in due},
                                                 sha=rollout.commit, schema_root=where.schema_root, chart=chart)
        what = ", ".join(f"{r.pool} ({d.mode})" for r, d in due)
        title = (f"{prepared.plan.steps[0].title} ({decision.mode})" if len(due) == 1
                 else f"rollback canary pools {what}") if prepared.plan.steps else ""
    else:
        targets = "all" if analysis.promote_to == "all" else ",".join(analysis.promote_to)
        prepared = upgrade.prepare_promote(where.repo.root, source=rollout.pool, to=targets,
                                           schema_root=where.schema_root, chart=chart)
        title = prepared.plan.steps[0].title if prepared.plan.steps else ""
    trailers = tuple(Decided(r.pool, r.commit, d.action, d.mode).trailer() for r, d in due)
    plan = dataclasses.replace(prepared.plan, notes=tuple(_notes(due)), trailers=trailers)
    if plan.steps:
        plan = dataclasses.replace(plan, steps=(dataclasses.replace(plan.steps[0], title=title),))
    return dataclasses.replace(prepared, plan=plan)


def _still_due(where: Where, due: list[Due]) -> list[Due]:
    """What of ``due`` is still undecided and still its pool's rollout at the remote's head."""
    current = rollouts(where.repo, tuple(r.pool for r, _ in due))
    decided = decisions(where.repo)
    return [(r, d) for r, d in due if (now := current.get(r.pool)) is not None and now.commit == r.commit
            and (r.pool, r.commit) not in decided]


def commit_and_push(where: Where, analysis: Analysis, due: list[Due], *, attempts: int = PUSH_ATTEMPTS,
                    on_refused: Callable[[int, str], None] = lambda n, why: None) -> tuple[str, list[Due]]:
    """Commit ``due`` (one promote, or rollbacks) on the remote's head and push it; redo on a refusal.

    Each attempt starts from the remote's newest head and keeps only what is still due there (a pool
    whose driver changed again, or that was decided meanwhile, is left out; with nothing left,
    GpugateError says why). Returns the pushed sha and what it decided. After ``attempts`` refusals:
    ``GaveUp``, never a forced push.
    """
    for attempt in range(1, attempts + 1):
        where.repo.sync_to_remote(where.remote, where.branch)
        left = _still_due(where, due)
        if not left:
            pools = ", ".join(r.pool for r, _ in due)
            raise GpugateError(f"pool(s) {pools}: decided already or no longer the pools' newest driver change at "
                               f"{where.repo.head()[:12]}: nothing to commit")
        sha = upgrade.execute(where.repo, prepare(where, analysis, left), schema_root=where.schema_root,
                              recheck=False)
        try:
            where.repo.push(where.remote, where.branch)
            return sha, left
        except PushRefused as refused:
            on_refused(attempt, str(refused))
    pools = ", ".join(r.pool for r, _ in due)
    raise GaveUp(f"pool(s) {pools}: the {due[0][1].action} was refused {attempts} times by {where.remote} "
                 f"{where.branch} (someone keeps pushing); not forced. Decide it by hand: "
                 f"`gpugate stack {'rollback' if due[0][1].action == 'rollback' else 'promote'}`")


def canary_history(repo: Repo, limit: int = 200) -> list[dict[str, str]]:
    """The canary decisions in Git, newest first: pool, rollout, decision, mode, sha, subject."""
    return [{"sha": sha, "at": str(int(when)), "pool": d.pool, "rollout": d.rollout, "decision": d.decision,
             "mode": d.mode, "subject": repo.subject(sha)} for sha, when, d in _recorded(repo, limit)]


def credential_config(credentials: Path | None) -> tuple[str, ...]:
    """``git -c`` settings for the clone: a credential store file (from a Secret), and an identity."""
    config: tuple[str, ...] = ("user.name=gpugate canary", "user.email=canary@gpugate.invalid")
    if credentials is not None:
        config += (f"credential.helper=store --file={credentials}",)
    return config
