"""A callback URL's secrets in the job store: its rows read back hold the URL as shown (``***``) and the whole URL sealed
(AES-GCM under the server's key, bound to the job), never a byte of the user, password, query values or fragment; a
store made before sealing seals what it kept in clear when it opens; a sealed URL opens only under its key and in its own
job's row; the key file is made readable by its owner only."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path
from urllib.parse import quote

import pytest

from app.jobs.sealing import KEY_FILE, Sealer, Unsealable, key_file, key_of_setting
from app.jobs.sqlite import FILE_NAME, SqliteStore
from app.jobs.store import Answer, Store
from tests.service.jobs.conftest import StoreFactory

USER, PASSWORD, TOKEN, FRAGMENT = "hook-user-4b1e", "pa/ss#wo?rd-9d2c", "tok-77a0c3", "frag-e51f"
ENCODED = quote(PASSWORD, safe="")
SECRETS = (USER, ENCODED, "9d2c", TOKEN, FRAGMENT)
URL = f"https://{USER}:{ENCODED}@hooks.example:8443/done?token={TOKEN}&v=2#{FRAGMENT}"
SHOWN = "https://***@hooks.example:8443/done?token=***&v=***#***"


def every_row(store: Store) -> list[str]:
    """Every row of the store's tables, as text (the reader of the database)."""
    with store._tx(write=False) as cur:  # noqa: SLF001 - the rows themselves, as an SQL console reads them
        rows: list[str] = []
        for table in ("jobs", "images"):
            cur.execute(f"SELECT * FROM {table}")
            rows += [repr(row) for row in cur.fetchall()]
        return rows


def assert_no_secret(texts: list[str]) -> None:
    for secret in SECRETS:
        for text in texts:
            assert secret not in text, (secret, text[:300])


def test_no_secret_of_a_callback_url_is_in_any_row_and_the_runner_still_gets_the_url(make_store: StoreFactory) -> None:
    store = make_store()
    created = store.create_job("j1", {"attribute": {}}, URL, [("a.png", b"x")], 10**9)
    assert created.callback_url == SHOWN and created.callback_target == URL
    assert URL not in repr(created)  # a JobInfo in a log line shows no secret either
    rows = every_row(store)
    assert any(SHOWN in row for row in rows) and any("v1." in row for row in rows)  # kept: as shown, and sealed
    assert_no_secret(rows)
    other = make_store()  # another connection, as another process reads it
    job = other.get_job("j1")
    assert job is not None and job.callback_url == SHOWN and job.callback_target == URL and job.callback_problem is None
    (claim,) = other.claim("r", 1, 30)
    other.finish("r", claim.job_id, claim.index, Answer(200, {"ok": True}, {"ok": True}))
    assert [(j.id, j.callback_target) for j in other.due_callbacks()] == [("j1", URL)]
    plain = store.create_job("j2", {}, "http://hooks.example/plain", [("a.png", b"x")], 10**9)
    assert plain.callback_url == plain.callback_target == "http://hooks.example/plain"  # nothing secret: kept as it is


def test_no_secret_is_in_the_sqlite_files_bytes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    store.create_job("j1", {}, URL, [("a.png", b"x")], 10**9)
    store.close()
    files = [p for p in tmp_path.iterdir() if p.name.startswith(FILE_NAME)]
    assert files
    raw = b"".join(p.read_bytes() for p in files)
    for secret in SECRETS:
        assert secret.encode() not in raw, secret
    assert SHOWN.encode() in raw


def test_a_store_made_before_sealing_seals_the_urls_it_kept_in_clear(make_store: StoreFactory) -> None:
    old = make_store()
    old.create_job("old", {}, None, [("a.png", b"x")], 10**9)
    old.create_job("plain", {}, None, [("a.png", b"x")], 10**9)
    with old._tx() as cur:  # noqa: SLF001 - the row as the previous version kept it: the URL in clear, no sealed column
        cur.execute("UPDATE jobs SET callback_url = ? WHERE id = 'old'", (URL,))
        cur.execute("UPDATE jobs SET callback_url = 'http://hooks.example/plain' WHERE id = 'plain'")
        cur.execute("ALTER TABLE jobs DROP COLUMN callback_sealed")
    assert any(TOKEN in row for row in every_row(old))  # the secret was there
    new = make_store()  # a newer service opening it
    assert_no_secret(every_row(new))
    job = new.get_job("old")
    assert job is not None and job.callback_url == SHOWN and job.callback_target == URL
    plain = new.get_job("plain")
    assert plain is not None and plain.callback_target == plain.callback_url == "http://hooks.example/plain"


def test_a_sealed_url_opens_only_under_its_key_and_in_its_own_job(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path, sealer=Sealer(key_of_setting("the-first-key-of-this-test")))
    store.create_job("mine", {}, URL, [("a.png", b"x")], 10**9)
    store.create_job("yours", {}, URL.replace(TOKEN, "other"), [("a.png", b"x")], 10**9)
    with store._tx() as cur:  # noqa: SLF001 - a sealed URL copied into another job's row
        cur.execute("UPDATE jobs SET callback_sealed = (SELECT callback_sealed FROM jobs WHERE id = 'mine') WHERE id = 'yours'")
    copied = store.get_job("yours")
    assert copied is not None and copied.callback_target is None
    assert "does not open with this server's key (altered, or copied from another job)" in (copied.callback_problem or "")
    store.close()
    changed = SqliteStore(tmp_path, sealer=Sealer(key_of_setting("another-key-after-a-change")))
    job = changed.get_job("mine")
    assert job is not None and job.callback_target is None and job.callback_url == SHOWN
    assert "sealed with another key" in (job.callback_problem or "") and "IDG_JOBS_SEAL_KEY" in (job.callback_problem or "")
    changed.close()
    with pytest.raises(Unsealable, match="unknown form"):
        Sealer.ephemeral().open("v9.abc.def", "mine")


def test_the_key_file_is_made_once_readable_by_its_owner_only(tmp_path: Path) -> None:
    key = key_file(tmp_path)
    path = tmp_path / KEY_FILE
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key_file(tmp_path) == key  # the same key at the next start
    path.chmod(0o644)
    assert key_file(tmp_path) == key and stat.S_IMODE(path.stat().st_mode) == 0o600  # made private again
    SqliteStore(tmp_path / "store").close()
    assert (tmp_path / "store" / KEY_FILE).exists()  # the SQLite store's own, beside it
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="not a 32-byte seal key"):
        key_file(tmp_path)
    with pytest.raises(ValueError, match="at least 16 characters"):
        key_of_setting("short")


def test_the_sqlite_file_rows_read_by_sqlite3_hold_no_secret(tmp_path: Path) -> None:
    """The rows as another program reads the file (sqlite3's own connection, not the store's)."""
    SqliteStore(tmp_path).create_job("j1", {}, URL, [("a.png", b"x")], 10**9)
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        rows = [repr(r) for table in ("jobs", "images") for r in conn.execute(f"SELECT * FROM {table}")]  # noqa: S608
    assert rows and any(SHOWN in row for row in rows)
    assert_no_secret(rows)
