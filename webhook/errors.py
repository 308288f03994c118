"""The one error family gpugate raises on purpose.

Each edge maps these in one place: the CLI prints ``str(err)`` and exits 1, the admission
server answers 400 (bad review) or allows with a warning (internal failure), the balancer
backs off. ``str()`` is always the user's message: it names the thing, the place and the fix.
"""

from __future__ import annotations


class GpugateError(Exception):
    """Raised on purpose; ``str()`` is the message shown to the user."""


class PolicyLoadError(GpugateError):
    """A policy folder (or one document in it) is invalid; nothing of it was loaded."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class InputError(GpugateError):
    """A file given on the command line is not what the command needs."""


class BadReview(GpugateError):
    """An AdmissionReview request is malformed: answered with HTTP 400 and this message."""


class ClusterAPIError(GpugateError):
    """A Kubernetes API call failed; raised ``from`` the client's ApiException."""
