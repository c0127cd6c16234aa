"""A job's callback URL in the store: shown, never in clear where its secrets are.

A callback URL may hold a user name and password, query values (where webhook tokens go) and a fragment. The store keeps
it as two columns: ``callback_url``, the URL as shown (:func:`app.jobs.callbacks.redacted`: its secrets ``***``), and,
when that differs from the URL, ``callback_sealed``: the whole URL sealed with the server's key (AES-256-GCM, a fresh
96-bit nonce per URL, the job's id as associated data so that a sealed URL copied to another job's row does not open).
A reader of the database (a backup, a replica's operator, an SQL console) sees the first and the ciphertext; the runner
opens the second when it calls back.

Sealed, not kept in memory only: a job's callback is sent by whichever process finishes it, after a restart too (its
callback still due), so what calls back has to be in the store. The key (:func:`load_key`): ``IDG_JOBS_SEAL_KEY``, else
a file of 32 random bytes made on first start beside the SQLite store (``IDG_DATA_DIR/jobs.key``, mode 0600). Replicas
sharing a PostgreSQL store must share the key (set ``IDG_JOBS_SEAL_KEY`` on each): a job finished by a replica whose key
did not seal its URL fails its callback, saying so, as does every job submitted before the key changed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import secrets
import stat
import time
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger(__name__)

KEY_FILE = "jobs.key"
KEY_BYTES = 32
VERSION = "v1"
MIN_SETTING_CHARS = 16
"""The shortest ``IDG_JOBS_SEAL_KEY`` taken (it is hashed to the 256-bit key)."""
_PROCESS_KEY = secrets.token_bytes(KEY_BYTES)


class Unsealable(Exception):
    """A sealed callback URL this server's key does not open: sealed with another key, or altered."""


class Sealer:
    """Seals and opens text under one AES-256-GCM key, bound to an id (the job's)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a seal key has {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"idg-seal-key-id:" + key).hexdigest()[:12]
        """Names the key in each sealed text (a digest: the key cannot be found from it), so that a text sealed under
        another key is refused saying so."""

    def seal(self, text: str, bound_to: str) -> str:
        nonce = secrets.token_bytes(12)
        sealed = self._aead.encrypt(nonce, text.encode(), bound_to.encode())
        return f"{VERSION}.{self.key_id}.{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def open(self, sealed: str, bound_to: str) -> str:
        """The text :meth:`seal` sealed for ``bound_to``; :class:`Unsealable` saying why where it does not open."""
        version, key_id, body = (sealed.split(".", 2) + ["", ""])[:3]
        if version != VERSION:
            raise Unsealable(f"it was sealed in an unknown form ({version[:8]!r})")
        if key_id != self.key_id:
            raise Unsealable(f"it was sealed with another key (key id {key_id[:12]}; this server's is {self.key_id}): "
                             "IDG_JOBS_SEAL_KEY or IDG_DATA_DIR/jobs.key changed, or the replicas do not share one")
        try:
            raw = base64.urlsafe_b64decode(body.encode())
            return self._aead.decrypt(raw[:12], raw[12:], bound_to.encode()).decode()
        except (InvalidTag, ValueError) as err:
            raise Unsealable("it does not open with this server's key (altered, or copied from another job)") from err

    @classmethod
    def ephemeral(cls) -> Sealer:
        """The key of this process's lifetime, one for all its stores (a store opened without a key: tools and tests;
        nothing sealed under it opens in another process)."""
        return cls(_PROCESS_KEY)


def key_of_setting(value: str) -> bytes:
    """The 256-bit key of an ``IDG_JOBS_SEAL_KEY`` value (SHA-256 of it; e.g. ``openssl rand -base64 32``)."""
    if len(value) < MIN_SETTING_CHARS:
        raise ValueError(f"IDG_JOBS_SEAL_KEY must be at least {MIN_SETTING_CHARS} characters (e.g. openssl rand -base64 32), "
                         f"got {len(value)}")
    return hashlib.sha256(value.encode()).digest()


def key_file(folder: Path) -> bytes:
    """The key in ``folder/jobs.key``, made (32 random bytes, mode 0600, readable by this user only) where there is none.
    Processes starting together make it once: the first to create it writes it, the others read what it wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_key(path)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    log.info("made the callback URLs' seal key %s (mode 0600); keep it with the job store: jobs' callbacks need it", path)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    for _ in range(50):  # another process made the file and is writing its 32 bytes
        key = path.read_bytes()
        if len(key) == KEY_BYTES:
            break
        time.sleep(0.02)
    else:
        raise ValueError(f"{path} holds {len(key)} bytes, not a {KEY_BYTES}-byte seal key: remove it only if no job's "
                         "callback is due (their sealed URLs would not open), or set IDG_JOBS_SEAL_KEY")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600)
        log.warning("%s could be read by other users (mode %o): made 0600", path, mode)
    return key


def load_key(setting: str | None, folder: Path) -> Sealer:
    """The server's sealer: of ``IDG_JOBS_SEAL_KEY`` where set, else of ``folder/jobs.key`` (made on first start)."""
    return Sealer(key_of_setting(setting) if setting else key_file(folder))
