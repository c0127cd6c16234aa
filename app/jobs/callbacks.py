"""A job's callback: the URL checked at submission, the delivery signed, retried with backoff, and
its outcome said in one word (``delivered``, ``refused``, ``failed``) with the status or error.

The signature is the common webhook scheme (Stripe's, GitHub's): ``X-IDG-Timestamp`` is the Unix
time of the attempt, ``X-IDG-Signature`` is ``sha256=`` and the hex HMAC-SHA256 of
``timestamp + "." + body`` (the raw bytes sent) keyed with ``IDG_CALLBACK_SECRET``. A receiver
recomputes it over the body it got, compares in constant time, and refuses a timestamp older than a
few minutes (a replay). Credentials in a callback URL (``user:password@``, and the values of its query, where webhook
tokens go: ``?token=...``) are sent as the URL asks but never logged nor shown (:func:`redacted`), httpx's own request
line included (:class:`RedactedUrls`).

A redirect (3xx) is not followed, as common webhook senders do (a redirect could send the signed body and the credentials
to a host the URL did not name): it is a failed try, tried again like a 5xx.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
from urllib.parse import unquote, urlsplit

import httpx

log = logging.getLogger(__name__)

MAX_URL = 2048
MAX_HOST = 253
"""A DNS name's longest (each label at most 63)."""
TRIES = 5
FIRST_WAIT_S = 1.0
"""Waits between tries: 1, 2, 4, 8 s."""
RETRIED = {408, 425, 429}
"""Statuses tried again beside 3xx and 5xx: the receiver was busy or slow, not refusing."""
HIDDEN = "***"
SIGNATURE, TIMESTAMP = "X-IDG-Signature", "X-IDG-Timestamp"


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a callback URL, or None: an http(s) URL with a valid host, no spaces or
    control characters, at most :data:`MAX_URL` characters."""
    if len(url) > MAX_URL:
        return f"is {len(url)} characters long, more than {MAX_URL}"
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "holds spaces or control characters"
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # the port is parsed lazily: a bad one raises here
    except ValueError as err:  # its words quote the URL's parts (a password cut by a "/" taken for the port): not echoed
        return _unparsed(str(err), url)
    if parts.scheme not in ("http", "https") or not host:
        return "must be an http:// or https:// URL with a host"
    if len(host) > MAX_HOST or any(len(label) > 63 for label in host.split(".")):
        return f"has a host longer than a DNS name may be ({MAX_HOST} characters, 63 per label)"
    return None


PARSE_ERRORS = {"Port could not be cast": "has a port that is not a number", "Port out of range": "has a port out of range 0-65535",
                "Invalid IPv6 URL": "has an IPv6 host without its closing ]",
                "invalid characters under NFKC": "has a host whose characters change under NFKC normalisation"}
"""urllib's words for a URL it cannot split, as said back (urllib's own quote the port or host it read, which may be a
password cut short by a ``/``, ``?`` or ``#``)."""
ENCODE_HINT = ("a user name or password holding '/', '?', '#' or '@' must have them percent-encoded (%2F, %3F, %23, %40)")


def _unparsed(error: str, url: str) -> str:
    said = next((words for start, words in PARSE_ERRORS.items() if error.startswith(start) or start in error), "is not a valid URL")
    return f"{said} ({ENCODE_HINT})" if "@" in url else said


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,15}://")


def redacted(url: str) -> str:
    """``url`` with its secrets replaced by ``***`` (for logs, status bodies and refusals): the user name and password,
    each query parameter's value (``?token=***&v=***``; a part without ``=``, all of it) and the fragment; the scheme,
    host, port, path and the query's names are kept.

    Whatever characters the secrets hold: a URL whose ``@`` is not in its authority (a password holding ``/``, ``?``
    or ``#`` ends the authority early, and urllib reads its first part as the host or port) is shown as its scheme and
    ``***``; so is one urllib cannot split, unless it has no ``@``, ``?`` nor ``#`` (then it holds no secret)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # parsed lazily: a bad one raises here
    except ValueError:
        parts = None
    if parts is None and not any(c in url for c in "@?#"):
        return url
    if parts is None or ("@" in url and "@" not in parts.netloc):
        scheme = _SCHEME.match(url)
        return (scheme[0] if scheme else "") + HIDDEN
    try:
        if parts.username is not None or parts.password is not None:
            parts = parts._replace(netloc=f"{HIDDEN}@" + parts.netloc.rsplit("@", 1)[1])
        if parts.query:
            parts = parts._replace(query="&".join(_hidden_value(p) for p in parts.query.split("&")))
        if parts.fragment:
            parts = parts._replace(fragment=HIDDEN)
        return parts.geturl()
    except ValueError:
        return "<invalid URL>"


def _hidden_value(part: str) -> str:
    name, eq, _ = part.partition("=")
    return f"{name}={HIDDEN}" if eq else (part and HIDDEN)


class RedactedUrls(logging.Filter):
    """On httpx's logger: its ``HTTP Request: POST <url> ...`` line shows the URL :func:`redacted` (the callback's
    query, with its token, is in the URL httpx sends)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, httpx.URL) for a in record.args):
            record.args = tuple(redacted(str(a)) if isinstance(a, httpx.URL) else a for a in record.args)
        return True


if not any(isinstance(f, RedactedUrls) for f in logging.getLogger("httpx").filters):
    logging.getLogger("httpx").addFilter(RedactedUrls())


def without_credentials(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """``url`` without its user name and password, and those as Basic authentication: sent as the URL
    asks, while the URL that httpx logs ("HTTP Request: POST ...") carries none."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    bare = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()
    return bare, httpx.BasicAuth(unquote(parts.username or ""), unquote(parts.password or ""))


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-IDG-Signature`` value of ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def _delivered(status: int) -> str | None:
    """The outcome's word for an answer that ends the tries (``delivered`` for a 2xx, ``refused`` for a 4xx but
    :data:`RETRIED`), or None for one tried again (a 3xx: a redirect is not followed; a 5xx; :data:`RETRIED`)."""
    if 200 <= status < 300:
        return "delivered"
    if 400 <= status < 500 and status not in RETRIED:
        return "refused"
    return None


async def deliver(client: httpx.AsyncClient, url: str, body: bytes, secret: str | None, what: str) -> str:
    """POST ``body`` (JSON) to ``url`` until it is answered 2xx, or 4xx but 408, 425, 429 (a redirect is not followed:
    a 3xx is tried again as a 5xx is), up to :data:`TRIES` times; the outcome, e.g. ``delivered: HTTP 204 after 1
    attempt(s)``."""
    shown, wait, outcome = redacted(url), FIRST_WAIT_S, ""
    bare, auth = without_credentials(url)
    for attempt in range(1, TRIES + 1):
        headers = {"Content-Type": "application/json"}
        if secret:
            stamp = str(int(time.time()))
            headers |= {TIMESTAMP: stamp, SIGNATURE: signature(secret, stamp, body)}
        try:
            r = await client.post(bare, content=body, headers=headers, auth=auth or httpx.USE_CLIENT_DEFAULT, follow_redirects=False)
            kind = _delivered(r.status_code)
            if kind is not None:
                outcome = f"{kind}: HTTP {r.status_code} after {attempt} attempt(s)"
                log.info("%s: callback %s %s", what, shown, outcome)
                return outcome
            outcome = f"HTTP {r.status_code}" + (" (a redirect: not followed)" if 300 <= r.status_code < 400 else "")
        except Exception as err:  # noqa: BLE001 - any failure of one attempt (network, TLS, a URL httpx refuses) is tried again
            outcome = f"{type(err).__name__}: {str(err).replace(url, shown).replace(bare, shown)[:200]}"
        log.warning("%s: callback %s attempt %d of %d: %s", what, shown, attempt, TRIES, outcome)
        if attempt < TRIES:
            await asyncio.sleep(wait)
            wait *= 2
    return f"failed: {outcome} after {TRIES} attempts"
