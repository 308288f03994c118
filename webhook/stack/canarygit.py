"""The Git side of the canary controller: which rollout a canary pool is in, whether it was decided, the
decision's commit, and a push that is never forced.

Git is the record: a rollout is the newest commit that changed a canary pool's driver (unless that
commit was itself a rollback); a decision is a commit whose trailers name the pool and that rollout
(``Gpugate-Canary-Pool``, ``Gpugate-Canary-Rollout``). Before acting the controller looks for one,
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
from webhook.stack.canarymodes import Decision, Rollout
from webhook.stack.gitrepo import GIT_TIMEOUT_SECONDS, PushRefused, Repo
from webhook.stack.messages import TRAILER
from webhook.stack.model import Stack

POOL_TRAILER = "Gpugate-Canary-Pool"
ROLLOUT_TRAILER = "Gpugate-Canary-Rollout"
DECISION_TRAILER = "Gpugate-Canary-Decision"
MODE_TRAILER = "Gpugate-Canary-Mode"
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


def decisions(repo: Repo) -> dict[tuple[str, str], tuple[str, str]]:
    """(pool, rollout commit) -> (sha, decision) of every canary decision in the newest commits."""
    return {(trailers.get(POOL_TRAILER, ""), trailers[ROLLOUT_TRAILER]): (sha, trailers.get(DECISION_TRAILER, "?"))
            for sha, _, trailers in repo.trailer_commits(ROLLOUT_TRAILER)}


def decision_of(repo: Repo, rollout: Rollout) -> tuple[str, str] | None:
    """(sha, decision) of the commit that decided ``rollout``, if one exists."""
    for sha, _, trailers in repo.trailer_commits(ROLLOUT_TRAILER):
        if trailers.get(ROLLOUT_TRAILER) == rollout.commit and trailers.get(POOL_TRAILER) == rollout.pool:
            return sha, trailers.get(DECISION_TRAILER, "?")
    return None


@dataclass(frozen=True, kw_only=True)
class Where:
    """The controller's clone and where it pushes."""

    repo: Repo
    remote: str = "origin"
    """The remote's name in the clone: where the branch is fetched from and pushed to."""
    branch: str = "main"
    schema_root: Path | None = None


def prepare(where: Where, analysis: Analysis, rollout: Rollout, decision: Decision) -> upgrade.Prepared:
    """The decision as a checked commit on the clone's head (not yet made)."""
    chart = upgrade.chart_settings(where.repo.root, helm=None, chart_repo=None, skip=True)
    trailers: tuple[tuple[str, str], ...] = ((POOL_TRAILER, rollout.pool), (ROLLOUT_TRAILER, rollout.commit),
                                             (DECISION_TRAILER, decision.action))
    notes = [f"canary pool {rollout.pool}, rollout {rollout.commit[:12]} ({rollout.from_driver} -> "
             f"{rollout.to_driver})"]
    if decision.action == "rollback":
        trailers += ((MODE_TRAILER, decision.mode),)
        notes.append(f"failure mode: {decision.mode}")
        prepared = upgrade.prepare_pool_rollback(where.repo, pool=rollout.pool, driver=rollout.from_driver,
                                                 sha=rollout.commit, schema_root=where.schema_root, chart=chart)
    else:
        targets = "all" if analysis.promote_to == "all" else ",".join(analysis.promote_to)
        prepared = upgrade.prepare_promote(where.repo.root, source=rollout.pool, to=targets,
                                           schema_root=where.schema_root, chart=chart)
    notes += [f"evidence: {line}" for line in decision.evidence]
    plan = dataclasses.replace(prepared.plan, notes=tuple(notes), trailers=trailers)
    if decision.action == "rollback":
        title = f"{plan.steps[0].title} ({decision.mode})"
        plan = dataclasses.replace(plan, steps=(dataclasses.replace(plan.steps[0], title=title),))
    return dataclasses.replace(prepared, plan=plan)


def commit_and_push(where: Where, analysis: Analysis, rollout: Rollout, decision: Decision, *,
                    attempts: int = PUSH_ATTEMPTS, on_refused: Callable[[int, str], None] = lambda n, why: None) -> str:
    """Commit ``decision`` on the remote's head and push it; redo on a refusal; the pushed sha.

    Each attempt starts from the remote's newest head: if the rollout is no longer the pool's (a
    newer commit changed its driver) or it was decided meanwhile, nothing is committed (GpugateError
    names why). After ``attempts`` refusals: ``GaveUp``.
    """
    for attempt in range(1, attempts + 1):
        where.repo.sync_to_remote(where.remote, where.branch)
        current = rollouts(where.repo, (rollout.pool,))[rollout.pool]
        if current is None or current.commit != rollout.commit:
            raise GpugateError(f"pool {rollout.pool}: rollout {rollout.commit[:12]} is no longer the pool's newest "
                               f"driver change at {where.repo.head()[:12]}: not deciding it")
        decided = decision_of(where.repo, rollout)
        if decided is not None:
            raise GpugateError(f"pool {rollout.pool}: rollout {rollout.commit[:12]} was decided already "
                               f"({decided[1]} in {decided[0][:12]})")
        prepared = prepare(where, analysis, rollout, decision)
        sha = upgrade.execute(where.repo, prepared, schema_root=where.schema_root)
        try:
            where.repo.push(where.remote, where.branch)
            return sha
        except PushRefused as refused:
            on_refused(attempt, str(refused))
    raise GaveUp(f"pool {rollout.pool}: the {decision.action} of rollout {rollout.commit[:12]} was refused "
                 f"{attempts} times by {where.remote} {where.branch} (someone keeps pushing); not forced. Decide it "
                 f"by hand: `gpugate stack {'rollback' if decision.action == 'rollback' else 'promote'}`")


def canary_history(repo: Repo, limit: int = 200) -> list[dict[str, str]]:
    """The canary decisions in Git, newest first: pool, rollout, decision, mode, sha, subject."""
    out = []
    for sha, when, trailers in repo.trailer_commits(ROLLOUT_TRAILER, limit=limit):
        subject = repo.subject(sha)
        out.append({"sha": sha, "at": str(int(when)), "pool": trailers.get(POOL_TRAILER, "?"),
                    "rollout": trailers.get(ROLLOUT_TRAILER, "?"), "decision": trailers.get(DECISION_TRAILER, "?"),
                    "mode": trailers.get(MODE_TRAILER, ""), "subject": subject})
    return out


def credential_config(credentials: Path | None) -> tuple[str, ...]:
    """``git -c`` settings for the clone: a credential store file (from a Secret), and an identity."""
    config: tuple[str, ...] = ("user.name=gpugate canary", "user.email=canary@gpugate.invalid")
    if credentials is not None:
        config += (f"credential.helper=store --file={credentials}",)
    return config
