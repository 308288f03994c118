"""The HTTPS client side of the webhook: post a review as the API server would, read the answer.

Used by ``gpugate admit``. It verifies the server's certificate for a chosen name while dialling
the URL's address, as the API server verifies a webhook Service's certificate against its
``caBundle`` while connecting to a pod or cluster IP.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from webhook.admission import reviews
from webhook.errors import GpugateError, InputError


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to the URL's address while verifying the certificate for ``server_name``."""

    def __init__(self, host: str, port: int, *, context: ssl.SSLContext, server_name: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name
        self._context = context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self._server_name)


def post_review(server: str, endpoint: str, review: Mapping[str, Any], *, ca: Path | None,
                server_name: str | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    """POST a review to ``server/endpoint``; (HTTP status, parsed JSON body)."""
    url = urlsplit(server)
    if url.scheme != "https" or not url.hostname:
        raise InputError(f"--server must be an https:// URL, got {server!r}")
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
    except (ssl.SSLError, OSError) as err:
        raise InputError(f"--ca {ca}: not a PEM CA certificate ({err})") from err
    name = server_name or url.hostname
    connection = _PinnedHTTPSConnection(url.hostname, url.port or 443, context=context,
                                        server_name=name, timeout=timeout)
    path = url.path.rstrip("/") + "/" + endpoint
    try:
        connection.request("POST", path, body=json.dumps(review).encode(),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
    except ssl.SSLCertVerificationError as err:
        if "hostname" in str(err).lower() or "ip address mismatch" in str(err).lower():
            hint = (f"the certificate is not for {name!r}; pass --server-name with a name it is for "
                    f"(the webhook's is <service>.<namespace>.svc)")
        elif ca is None:
            hint = "pass the server's CA with --ca"
        else:
            hint = f"the certificate is not signed by the CA in {ca}"
        raise GpugateError(f"TLS with {server} failed: {err.verify_message or err}; {hint}") from err
    except ssl.SSLError as err:
        raise GpugateError(f"TLS with {server} failed: {err}") from err
    except OSError as err:
        raise GpugateError(f"cannot reach {server}: {err}") from err
    finally:
        connection.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode(errors="replace")


def render_response(endpoint: str, document: dict[str, Any]) -> tuple[str, bool]:
    """A human summary of a review response, and whether it was allowed."""
    response = document.get("response") or {}
    allowed = bool(response.get("allowed"))
    lines = [f"{endpoint}: {'allowed' if allowed else 'DENIED'} (uid {response.get('uid')})"]
    if not allowed:
        status = response.get("status") or {}
        lines.append(f"  reason ({status.get('code')}): {status.get('message')}")
    for warning in response.get("warnings") or []:
        lines.append(f"  warning: {warning}")
    for key, value in (response.get("auditAnnotations") or {}).items():
        lines.append(f"  audit {key}: {value}")
    if response.get("patch"):
        ops = reviews.decode_patch(response["patch"])
        lines.append(f"  patch ({len(ops)} operations, {response.get('patchType')}):")
        lines.extend("    " + line for line in json.dumps(ops, indent=2).splitlines())
    elif endpoint == "mutate":
        lines.append("  patch: none")
    return "\n".join(lines), allowed
