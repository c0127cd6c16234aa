"""Named API keys (``IDG_API_KEYS``, ``IDG_API_KEYS_FILE``, and ``IDG_API_KEY`` as the admin key
``default``): which key a request sends, compared in constant time against every key, and whose jobs
it may see. A key's name is what logs, job records and metrics carry; the key itself never."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from app.core.config import Settings

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


def api_key_in(carrier: Mapping[str, str]) -> str | None:
    """The key ``carrier`` (lower-case names: HTTP headers, gRPC metadata) sends as ``x-api-key`` or ``authorization: Bearer``."""
    given = carrier.get("x-api-key")
    auth = carrier.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return given


def match(keys: list[Key], given: str) -> Key | None:
    """The key ``given`` is, compared with every key in constant time (no early exit: the time says nothing)."""
    found = None
    for key in keys:
        if secrets.compare_digest(given.encode(), key.secret.encode()):
            found = key
    return found


def share_limit(settings: Settings, keys: list[Key]) -> int | None:
    """Requests one key may have in flight, over every door together (:meth:`app.doors.layer.Call.admit`), None where one
    key or none is configured (nobody to starve)."""
    if len(keys) < 2:
        return None
    return max(1, int(settings.max_queue * settings.key_share))
