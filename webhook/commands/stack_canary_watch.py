"""``gpugate stack canary --watch``: the options of the canary controller and its start and stop.

The controller is ``webhook.stack.canary_controller``; this module parses its flags (``GPUGATE_*``
environment variables, as the Deployment sets them), makes its clone of the GitOps repository, and
runs it until SIGTERM or SIGINT, releasing the Lease on the way out.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from webhook.commands.stack_options import Workspace
from webhook.kubeclient import api_client
from webhook.kubetarget import Target
from webhook.lease import LeaseSettings
from webhook.stack import canary_controller, canary_observe, canarygit, canarymetrics
from webhook.stack.gitrepo import Repo


@dataclass(frozen=True)
class WatchOptions:
    repo_url: str | None
    branch: str
    workdir: Path | None
    git_credentials: Path | None
    lease_namespace: str
    identity: str
    leader_election: bool
    operator_namespace: str
    metrics_port: int
    push_attempts: int


def watch_options(func: Any) -> Any:
    """The flags of ``--watch``, handed to the command as one ``watch: WatchOptions | None``."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        names = ("repo_url", "branch", "workdir", "git_credentials", "lease_namespace", "identity",
                 "leader_election", "operator_namespace", "metrics_port", "push_attempts")
        values = {name: kwargs.pop(name) for name in names}
        kwargs["watch"] = WatchOptions(**values) if kwargs.pop("watch") else None
        return func(*args, **kwargs)

    options = [
        click.option("--watch", is_flag=True, help="Run as the controller that decides and commits by itself."),
        click.option("--repo-url", envvar="GPUGATE_GIT_URL", default=None,
                     help="--watch: the GitOps repository to clone and push to (default: --repo's origin)."),
        click.option("--branch", envvar="GPUGATE_GIT_BRANCH", default="main", show_default=True,
                     help="--watch: the branch Argo CD follows."),
        click.option("--workdir", envvar="GPUGATE_WORKDIR", type=click.Path(file_okay=False, path_type=Path),
                     default=None, help="--watch: where to clone (default: a temporary folder)."),
        click.option("--git-credentials", envvar="GPUGATE_GIT_CREDENTIALS",
                     type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="--watch: a git-credential-store file (https://user:token@host), e.g. from a Secret."),
        click.option("--lease-namespace", envvar="POD_NAMESPACE", default="gpugate-system", show_default=True,
                     help="--watch: the namespace of the gpugate-canary Lease and of the controller."),
        click.option("--identity", envvar="POD_NAME", default=socket.gethostname(),
                     help="--watch: this replica's name in the Lease."),
        click.option("--leader-election/--no-leader-election", default=True, show_default=True,
                     help="--watch: take the Lease before acting (one writer among replicas)."),
        click.option("--operator-namespace", envvar="GPUGATE_OPERATOR_NAMESPACE", default="gpu-operator",
                     show_default=True, help="--watch: where the GPU Operator runs the driver pods."),
        click.option("--metrics-port", type=int, default=0, help="--watch: serve /metrics on this port (0: not)."),
        click.option("--push-attempts", type=click.IntRange(1, 10), default=canarygit.PUSH_ATTEMPTS,
                     show_default=True, help="--watch: refused pushes redone on the new head before giving up."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _clone(options: WatchOptions, where: Workspace) -> canarygit.Where:
    config = canarygit.credential_config(options.git_credentials)
    if options.repo_url is None:
        return canarygit.Where(repo=Repo(where.root), remote="origin", branch=options.branch,
                               schema_root=where.schema_root)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="gpugate-canary-"))
    target = workdir / "repo"
    repo = Repo(target) if (target / ".git").is_dir() else Repo.clone(options.repo_url, target,
                                                                    branch=options.branch, config=config)
    return canarygit.Where(repo=repo, remote="origin", branch=options.branch, schema_root=where.schema_root)


def canary_watch_loop(options: WatchOptions, where: Workspace, *, server: Target | str | None, prometheus: str | None,
                      analysis_file: Path | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    lease = (LeaseSettings(name="gpugate-canary", namespace=options.lease_namespace, identity=options.identity)
             if options.leader_election else None)
    settings = canary_controller.ControllerSettings(
        where=_clone(options, where), lease=lease, analysis_file=analysis_file, push_attempts=options.push_attempts,
        eyes=canary_observe.Eyes(api=api_client(server), operator_namespace=options.operator_namespace,
                                 prometheus=prometheus))
    if options.metrics_port:
        canarymetrics.serve(options.metrics_port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    click.echo(f"canary controller {options.identity}: following {settings.where.remote} {options.branch} "
               f"(pid {os.getpid()})")
    canary_controller.CanaryController(settings).run(stop)
