"""Named API keys (``IDG_API_KEYS``, ``IDG_API_KEYS_FILE``, and ``IDG_API_KEY`` as the admin key
``default``): which key a request sends, compared in constant time against every key, and whose jobs
it may see. A key's name is what logs, job records and metrics carry; the key itself never."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.config import Settings
from app.core.errors import error_body

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class Key:
    name: str
    secret: str
    admin: bool

    def sees(self, tenant: str | None) -> bool:
        """Whether this key may see (read, delete) a job submitted by ``tenant``."""
        return self.admin or tenant == self.name


def _parse(entry: str, where: str) -> Key:
    name, sep, rest = entry.strip().partition(":")
    secret, _, role = rest.rpartition(":") if rest.endswith(":admin") else (rest, "", "")
    if not sep or not NAME.fullmatch(name) or not secret:
        raise ValueError(f"{where}: each key must be NAME:KEY or NAME:KEY:admin (NAME of letters, digits, '_', '.', '-'), "
                         f"got an entry starting {entry.strip()[:12]!r}")
    return Key(name, secret, role == "admin")


def load_keys(settings: Settings) -> list[Key]:
    """Every key the settings name; empty when none is set (the service is then open to all)."""
    keys = [Key("default", settings.api_key, True)] if settings.api_key else []
    keys += [_parse(entry, "IDG_API_KEYS") for entry in settings.api_keys]
    if settings.api_keys_file is not None:
        try:
            lines = settings.api_keys_file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            why = getattr(err, "strerror", None) or err
            raise ValueError(f"IDG_API_KEYS_FILE={settings.api_keys_file} cannot be read ({why})") from err
        keys += [_parse(line, f"IDG_API_KEYS_FILE line {i}") for i, line in enumerate(lines, 1)
                 if line.strip() and not line.lstrip().startswith("#")]
    names, secrets_seen = [k.name for k in keys], {k.secret for k in keys}
    if len(set(names)) != len(names) or len(secrets_seen) != len(keys):
        raise ValueError("API keys: each name and each key must be given once (IDG_API_KEY is named 'default')")
    return keys


def match(keys: list[Key], given: str) -> Key | None:
    """The key ``given`` is, compared with every key in constant time (no early exit: the time says nothing)."""
    found = None
    for key in keys:
        if secrets.compare_digest(given.encode(), key.secret.encode()):
            found = key
    return found


WORK = ("/predict", "/attribute", "/v2/models/", "/jobs")
"""Paths whose POSTs take the worker's queue slots (a share of them per key)."""


class KeyShareMiddleware:
    """With several keys, one key holds at most its share of ``IDG_MAX_QUEUE`` in requests at once
    (``IDG_KEY_SHARE``): past it, that key's next request is a 503 with ``Retry-After`` (the queue is
    full, for that key: the status every work route documents for a full queue) while the others' still
    find room, so one tenant's flood cannot starve another's interactive requests. Counts the POSTs to
    the work routes, from their start to the end of their answer (a stream's too)."""

    def __init__(self, app: ASGIApp, keys: list[Key], limit: int) -> None:
        self.app, self.keys, self.limit = app, keys, limit
        self.in_flight: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith(WORK):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-api-key")
        if given is None and headers.get("authorization", "").lower().startswith("bearer "):
            given = headers["authorization"][7:].strip()
        key = None if given is None else match(self.keys, given)
        if key is None:  # no key or a wrong one: the route's own guard answers 401
            await self.app(scope, receive, send)
            return
        if self.in_flight.get(key.name, 0) >= self.limit:
            message = (f"the API key {key.name!r} has {self.limit} requests in flight, its share of the queue (IDG_KEY_SHARE of "
                       "IDG_MAX_QUEUE): retry when one has been answered")
            body = json.dumps(error_body(503, message, "key_share")).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": body})
            return
        self.in_flight[key.name] = self.in_flight.get(key.name, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[key.name] -= 1


def share_limit(settings: Settings, keys: list[Key]) -> int | None:
    """Requests one key may have in flight, None where one key or none is configured (nobody to starve)."""
    if len(keys) < 2:
        return None
    return max(1, int(settings.max_queue * settings.key_share))
