"""The ``gpugate`` command: a thin click group whose subcommands live in ``webhook.commands``.

Subcommands are imported only when invoked, so ``gpugate mutate`` never pays for (or breaks
on) the replay's numpy or the server's gunicorn, and each command module has one owner.
Exit codes: 0 ok, 1 denied or failed check, 2 usage.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from webhook import __version__
from webhook.errors import GpugateError

# name -> "module:attribute"; the order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "mutate": "webhook.commands.offline:mutate",
    "validate": "webhook.commands.offline:validate",
    "policy": "webhook.commands.offline:policy",
    "serve": "webhook.commands.serve:serve",
    "admit": "webhook.commands.serve:admit",
    "certs": "webhook.commands.certs:certs",
    "smoke": "webhook.commands.smoke:smoke",
    "audit": "webhook.commands.audit:audit",
    "balance": "webhook.commands.balance:balance",
    "health": "webhook.commands.health:health",
    "usage": "webhook.commands.usage:usage",
    "stack": "webhook.commands.stack:stack",
    "argocd": "webhook.commands.argocd:argocd",
    "replay": "webhook.commands.replay:replay",
    "demo": "webhook.commands.demo:demo",
}


# The one-line summary of each command in `gpugate --help`: written to fit, so none is cut off,
# and shown without importing the command's module.
SUMMARIES: dict[str, str] = {
    "mutate": "Show a pod as the webhook would admit it.",
    "validate": "Say whether the cluster would admit a pod or workload.",
    "policy": "Check and test a folder of GPUPolicy files.",
    "serve": "Run the admission webhook over HTTPS.",
    "admit": "Send a pod or review to a running webhook.",
    "certs": "Make or renew the webhook's TLS certificate.",
    "smoke": "Dry-run pods a running webhook must shape and deny.",
    "audit": "Judge running pods and workloads by today's policies.",
    "balance": "Label GPU nodes by load (the balancer).",
    "health": "List quarantined GPUs; release one by hand.",
    "usage": "GPU-hours per namespace and owner; idle GPUs.",
    "stack": "Plan, upgrade and roll back the GPU stack in Git.",
    "argocd": "Keep the Argo CD side of the stack consistent.",
    "replay": "Replay a GPU cluster trace against policies.",
    "demo": "Try gpugate on a local cluster of GPU nodes.",
}


# Packages only one command needs, kept out of the base install (and the webhook image).
OPTIONAL_EXTRAS: dict[str, str] = {"numpy": "replay", "matplotlib": "replay", "kubernetes_validate": "stack"}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUMMARIES[name]) for name in COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # an optional extra (e.g. replay) is not installed
            return _unavailable(cmd_name, err)
        command = getattr(module, attribute)
        if not isinstance(command, click.Command):  # pragma: no cover - a wiring mistake
            raise TypeError(f"{target} is not a click command")
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpugateError as err:
            click.echo(f"error: {err}", err=True)
            ctx.exit(1)
        except ModuleNotFoundError as err:
            extra = OPTIONAL_EXTRAS.get((err.name or "").split(".")[0])
            if extra is None:
                raise
            click.echo(f"error: 'gpugate {ctx.invoked_subcommand}' needs {err.name}, which is not installed; "
                       f"install the extra: pip install 'gpugate[{extra}]'", err=True)
            ctx.exit(1)


def _unavailable(name: str, err: ImportError) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   help=f"(unavailable: {err})")
    def command() -> None:
        raise click.ClickException(
            f"'gpugate {name}' needs a package that is not installed ({err}); "
            f"install the matching extra, e.g. pip install 'gpugate[{name}]'"
        )

    return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpugate")
def main() -> None:
    """gpugate: steer GPU pods by policy and load, and keep the GPU stack in Git."""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
