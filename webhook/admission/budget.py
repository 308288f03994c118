"""What one review may cost the core: a ceiling on the fields it holds, counted on its bytes first. Pure.

The core's work grows with what a pod holds (affinity terms are merged, the desired pod is compared
with the one sent); a pod with 38,000 node-selector terms once cost 2.4 s of CPU and a 22 MB patch,
past the API server's 5 s timeout with a few in flight, and decoding it alone takes 0.75 s. The API
server accepts such a pod (3 MiB of input), so the webhook must answer it: over the ceiling it is
refused (validation) or left unshaped (mutation), with the reason, in the milliseconds the count takes.
"""

from __future__ import annotations

MAX_KEYS = 50_000
"""Object members (keys) a review may hold to be judged. A pod of 100 containers with 50 environment
variables each, and its managedFields, holds about 40,000; the pod with 38,000 node-selector terms
about 150,000."""


def keys_over(body: bytes, ceiling: int = MAX_KEYS) -> bool:
    """Whether the JSON ``body`` holds more than ``ceiling`` object members, counted on the bytes before
    anything is decoded (decoding that pod alone took 0.75 s): every key ends in ``":``, and a ``":``
    inside a string is written ``\\":``. A few milliseconds for the largest review."""
    return body.count(b'":') - body.count(b'\\":') > ceiling


def over_reason(ceiling: int = MAX_KEYS) -> str:
    return (f"it holds more than {ceiling:,} fields, more than gpugate judges within the webhook's timeout "
            f"(node affinity terms, containers, env and the like, counted together)")
