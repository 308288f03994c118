"""``--kubeconfig`` and ``--context``, the same on every command that talks to a cluster.

They sit beside the command's ``--server URL`` (a test's or a port-forward's API server, used
without a kubeconfig), and ``target`` turns the three into the ``kubeclient.Target`` the command
hands to ``kubeclient.api_client``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from webhook.kubetarget import Target


def kubeconfig_options(function: Callable[..., Any]) -> Callable[..., Any]:
    function = click.option("--context", "context", metavar="NAME",
                            help="The kubeconfig context to use [default: its current-context].")(function)
    return click.option("--kubeconfig", "kubeconfig", metavar="FILE",
                        type=click.Path(exists=True, dir_okay=False),
                        help="The kubeconfig file [default: in-cluster, else $KUBECONFIG or ~/.kube/config].")(function)


def target(server: str | None, kubeconfig: str | None, context: str | None) -> Target:
    """The cluster the options name; --server excludes the other two (it is used without a kubeconfig)."""
    if server and (kubeconfig or context):
        raise click.UsageError("--server is used as is, without a kubeconfig: give it, or --kubeconfig/--context")
    return Target(server=server, kubeconfig=kubeconfig, context=context)


def target_options(server_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--server``, ``--kubeconfig`` and ``--context``, handed to the command as one ``server``
    argument: the ``Target`` they name (``Target.given`` False when none was given)."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def command(*args: Any, server: str | None = None, kubeconfig: str | None = None,
                    context: str | None = None, **kwargs: Any) -> Any:
            return function(*args, server=target(server, kubeconfig, context), **kwargs)

        return click.option("--server", default=None, help=server_help)(kubeconfig_options(command))
    return decorate
