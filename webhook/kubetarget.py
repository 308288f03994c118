"""Which cluster a command talks to, as its options name it. Pure: a value, read by ``kubeclient``.

Kept apart from ``kubeclient`` so the commands that take the options (``gpugate stack``) do not
load the Kubernetes client until they talk to a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    """Which cluster a command talks to, as its options say: an API server URL (used as is), or a
    kubeconfig file and context (``--kubeconfig``, ``--context``); none of them: in-cluster, else
    ``$KUBECONFIG`` or ``~/.kube/config`` at its current context."""

    server: str | None = None
    kubeconfig: str | None = None
    context: str | None = None

    @property
    def given(self) -> bool:
        """A cluster was named on the command line (``--kube`` is then implied)."""
        return bool(self.server or self.kubeconfig or self.context)

    def describe(self) -> str:
        if self.server:
            return self.server
        if self.kubeconfig or self.context:
            return f"kubeconfig {self.kubeconfig or '(default)'}, context {self.context or '(current)'}"
        return "kubeconfig / in-cluster"
