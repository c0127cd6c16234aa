"""The PostgreSQL job store at cluster scale: job images claimed and finished per second against open images and
concurrent replicas, with fairness across tenants checked (issue #64 item 3).

A throwaway PostgreSQL server (tests/service/jobs/postgres_server.py: Debian's initdb + pg_ctl on loopback, fsync off)
holds jobs of two tenants shaped differently: ``alpha`` submits few large jobs, ``beta`` many jobs of 100 images,
half of the open images each. Each simulated replica is a thread with a store of its own
(:class:`app.jobs.postgres.PostgresStore`, its own connection pool) that does what the runner
(app/jobs/runner.py ``_claim_some`` and ``_run_image``) does with the store: ``claim(owner, limit, lease)`` for its free
slots (``--limit``, the runner's ``IDG_JOBS_IN_FLIGHT``), then ``finish`` of each claimed image with an answer, with no
model time in between: the store's own limit. A level runs for ``--seconds`` or until a fifth of the open images are
answered (the open count stays within 80% of the level's), then the answered images are set back to pending (and
the table vacuumed) for the next level.

Checked at each level: every claimed image finished exactly once (no claim lost, none answered twice), and the claims'
split across tenants (each tenant's share; the store's rule: each tenant's open images take turns, so two tenants with
open images get half each) and across ``beta``'s jobs (image 0 of each job before image 1 of any: claims per job differ
by at most one, plus the claims in flight).

Run: ``python -m benchmarks.store_scale`` (results/benchmarks/store-scale-<date>/store-scale.md and .json); needs the
``postgres`` extra and Debian's ``postgresql`` package. Traffic goes only to the loopback server it starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.jobs.postgres import PostgresStore
from app.jobs.sql import IN_FLIGHT_SQL, NEXT_OF_TENANT_SQL, TENANTS_SQL
from app.jobs.store import PENDING, QUEUED, Answer

log = logging.getLogger(__name__)

TENANTS = ("alpha", "beta")
BETA_JOB = 100
"""Images per job of tenant ``beta`` (many small jobs); ``alpha``'s jobs are up to :data:`ALPHA_JOB` images."""
ALPHA_JOB = 5000
LEASE_S = 30.0
"""The runner's default lease (``IDG_JOBS_LEASE_S``)."""
H200_CHECK = Path("results/benchmarks/gpu-check-h200-2026-11-27-third/gpu-check.json")
"""The GPU check on an H200 whose Lite0 service level (attributions/s at 128 clients) sets the target."""
TARGET_FACTOR = 10


@dataclass
class Level:
    """One level's figures: ``open_images`` open at its start, ``claimers`` simulated replicas."""

    open_images: int
    claimers: int
    limit: int
    seconds: float = 0.0
    claims: int = 0
    empty_claims: int = 0
    claimed: int = 0
    finished: int = 0
    lost: int = 0
    duplicated: int = 0
    errors: int = 0
    claim_ms: list[float] = field(default_factory=list)
    finish_ms: list[float] = field(default_factory=list)
    by_tenant: Counter[str] = field(default_factory=Counter)
    by_job: Counter[str] = field(default_factory=Counter)
    stored_done: int = 0
    store_cpu_s: float = 0.0
    """CPU seconds of every PostgreSQL process (server, backends, background workers) during the level."""
    claimers_cpu_s: float = 0.0
    """CPU seconds of this process (the claimers' threads) during the level."""

    def figures(self, beta_jobs: set[str]) -> dict[str, Any]:
        total = sum(self.by_tenant.values()) or 1
        beta = [self.by_job.get(j, 0) for j in beta_jobs]
        return {
            "open_images": self.open_images, "claimers": self.claimers, "limit": self.limit, "seconds": round(self.seconds, 2),
            "claims": self.claims, "empty_claims": self.empty_claims, "images_claimed": self.claimed,
            "images_finished": self.finished, "finished_per_s": round(self.finished / self.seconds, 1) if self.seconds else 0.0,
            "claims_per_s": round(self.claims / self.seconds, 1) if self.seconds else 0.0,
            "claim_ms_p50": _pct(self.claim_ms, 50), "claim_ms_p99": _pct(self.claim_ms, 99),
            "finish_ms_p50": _pct(self.finish_ms, 50), "finish_ms_p99": _pct(self.finish_ms, 99),
            "lost": self.lost, "duplicated": self.duplicated, "errors": self.errors, "stored_done": self.stored_done,
            "tenant_share": {t: round(self.by_tenant.get(t, 0) / total, 3) for t in TENANTS},
            "beta_claims_per_job_min": min(beta) if beta else 0, "beta_claims_per_job_max": max(beta) if beta else 0,
            "store_cpu_ms_per_image": round(1000 * self.store_cpu_s / self.finished, 3) if self.finished else 0.0,
            "claimers_cpu_ms_per_image": round(1000 * self.claimers_cpu_s / self.finished, 3) if self.finished else 0.0,
        }


def postgres_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) so far of each process named ``postgres`` on this machine, by pid (``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name == "postgres":
            seconds[int(entry.name)] = (int(rest[11]) + int(rest[12])) / tick
    return seconds


def pin(store_cpu: int) -> list[int]:
    """Every PostgreSQL process onto CPU ``store_cpu`` (its backends, forked later by the server, inherit it), this
    process (the claimers) onto the others: the store measured on a core of its own, as on a database machine."""
    pids = sorted(postgres_cpu_s())
    for pid in pids:
        os.sched_setaffinity(pid, {store_cpu})
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - {store_cpu})
    return pids


def _pct(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 2)


def machine(url: str) -> dict[str, Any]:
    import psycopg

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    with psycopg.connect(url, autocommit=True) as conn:
        version = str(conn.execute("SELECT version()").fetchone()[0])  # type: ignore[index]
        settings = {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                    for name in ("fsync", "synchronous_commit", "shared_buffers", "max_connections")}
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "postgresql": version, "postgresql_settings": settings, "load_average_at_start": list(os.getloadavg())}


def h200_lite0() -> float:
    """The Lite0 service's attributions/s on one H200 (the best level of the GPU check)."""
    check = json.loads(H200_CHECK.read_text())
    return max(float(level["throughput_per_s"]) for level in check["check-service-lite0"])


def load(url: str, open_images: int, image_bytes: int) -> tuple[dict[str, str], set[str], bytes]:
    """Store the jobs (half the images each tenant's); the tenant of each job, ``beta``'s jobs, and the image bytes."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS images, jobs")
    store = PostgresStore(url, timeout_s=120.0)
    data = os.urandom(image_bytes)
    tenants: dict[str, str] = {}
    half = open_images // 2
    sizes = {"alpha": [min(ALPHA_JOB, half - i) for i in range(0, half, ALPHA_JOB)],
             "beta": [min(BETA_JOB, open_images - half - i) for i in range(0, open_images - half, BETA_JOB)]}
    params = {"attribute": {"model": "efficientnet_lite0"}}
    try:
        for tenant, jobs in sizes.items():
            for n, size in enumerate(jobs):
                job_id = f"{tenant}-{n:05d}"
                store.create_job(job_id, params, None, [(f"{i}.jpg", data) for i in range(size)], max_bytes=2**62,
                                 tenant=tenant)
                tenants[job_id] = tenant
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE images")
        conn.execute("VACUUM ANALYZE jobs")
    return tenants, {j for j, t in tenants.items() if t == "beta"}, data


def reset(url: str, data: bytes) -> None:
    """Every image pending again, every job queued (the answered ones' bytes put back)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE images SET state = %s, owner = NULL, lease_until = NULL, attempts = 0, seq = NULL, status = NULL, "
                     "summary = NULL, result = NULL, finished = NULL, replica = NULL, data = %s WHERE state <> %s",
                     (PENDING, data, PENDING))
        conn.execute("UPDATE jobs SET state = %s, done = 0, failed = 0, started = NULL, finished = NULL, callback_due = 0",
                     (QUEUED,))
        conn.execute("VACUUM ANALYZE images")
        conn.execute("VACUUM ANALYZE jobs")


def claim_plan(url: str) -> dict[str, Any]:
    """One claim of 2 images by a new owner, timed whole (then given back), and the plans of its reads under
    ``EXPLAIN ANALYZE``: the tenants with pending images, one tenant's next images, and the images in flight."""
    import psycopg

    store = PostgresStore(url)
    try:
        t0 = time.perf_counter()
        claimed = store.claim("bench:plan", 2, 30.0)
        ms = 1000 * (time.perf_counter() - t0)
        store.release_owners(["bench:plan"])
    finally:
        store.close()
    plans: dict[str, list[str]] = {}
    with psycopg.connect(url) as conn:
        for name, sql, args in (("tenants", TENANTS_SQL, ()), ("next_of_tenant", NEXT_OF_TENANT_SQL.format(n=0), ("beta", -1, "", 32)),
                                ("in_flight", IN_FLIGHT_SQL, ())):
            rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql.replace("?", "%s"), args).fetchall()
            plans[name] = [str(r[0]) for r in rows]
        conn.rollback()
    return {"execution_ms": ms, "claimed": len(claimed), "plan": plans}


def run_level(url: str, level: Level, tenants: dict[str, str], seconds: float, answer: Answer, each: bool = False) -> None:
    limit = level.limit
    budget = max(1, level.open_images // 5)
    stores = [PostgresStore(url, timeout_s=60.0) for _ in range(level.claimers)]
    lock = threading.Lock()
    seen: set[tuple[str, int]] = set()
    start = threading.Barrier(level.claimers + 1)
    stop_at = [0.0]

    def claimer(store: PostgresStore, owner: str) -> None:
        claim_ms: list[float] = []
        finish_ms: list[float] = []
        start.wait()
        while time.monotonic() < stop_at[0]:
            with lock:
                if level.claimed >= budget:
                    break
            try:
                t0 = time.perf_counter()
                got = store.claim(owner, limit, LEASE_S)
                claim_ms.append((time.perf_counter() - t0) * 1000)
            except Exception:  # noqa: BLE001 - counted, the level goes on
                log.exception("claim failed")
                with lock:
                    level.errors += 1
                continue
            with lock:
                level.claims += 1
                level.empty_claims += int(not got)
                level.claimed += len(got)
                for c in got:
                    key = (c.job_id, c.index)
                    level.duplicated += int(key in seen)
                    seen.add(key)
                    level.by_tenant[tenants[c.job_id]] += 1
                    level.by_job[c.job_id] += 1
            if not got:
                continue
            try:  # as the runner does (app/jobs/runner.py _finish): the answers that arrive together, written together
                t0 = time.perf_counter()
                if each:
                    outcomes = [store.finish(owner, c.job_id, c.index, answer, replica=owner) for c in got]
                else:
                    outcomes = store.finish_many(owner, [(c.job_id, c.index, answer) for c in got], replica=owner)
                finish_ms.append((time.perf_counter() - t0) * 1000 / (len(got) if each else 1))
            except Exception:  # noqa: BLE001
                log.exception("finish failed")
                with lock:
                    level.errors += 1
                continue
            with lock:
                level.finished += sum(d is not None for d in outcomes)
                level.lost += sum(d is None for d in outcomes)
        with lock:
            level.claim_ms.extend(claim_ms)
            level.finish_ms.extend(finish_ms)

    threads = [threading.Thread(target=claimer, args=(s, f"bench:{os.getpid()}:{n}"), name=f"claimer-{n}")
               for n, s in enumerate(stores)]
    for t in threads:
        t.start()
    store_cpu, own_cpu = postgres_cpu_s(), time.process_time()
    began = time.monotonic()
    stop_at[0] = began + seconds
    start.wait()
    for t in threads:
        t.join()
    level.seconds = time.monotonic() - began
    level.claimers_cpu_s = time.process_time() - own_cpu
    level.store_cpu_s = sum(cpu - store_cpu.get(pid, 0.0) for pid, cpu in postgres_cpu_s().items())
    for s in stores:
        s.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        level.stored_done = int(conn.execute("SELECT COUNT(*) FROM images WHERE state = 'done'").fetchone()[0])  # type: ignore[index]


def verdicts(levels: list[dict[str, Any]], target: float, claimers: list[int]) -> list[dict[str, Any]]:
    rows = []
    for lv in levels:
        share = lv["tenant_share"]
        fair = all(abs(share[t] - 1 / len(TENANTS)) <= 0.1 for t in TENANTS)
        beta_spread = lv["beta_claims_per_job_max"] - lv["beta_claims_per_job_min"]
        exact = lv["lost"] == 0 and lv["duplicated"] == 0 and lv["errors"] == 0 and lv["stored_done"] == lv["images_finished"]
        rows.append({"open_images": lv["open_images"], "claimers": lv["claimers"], "limit": lv["limit"], "fair_across_tenants": fair,
                     "beta_jobs_spread": beta_spread, "exactly_once": exact,
                     "meets_target": lv["finished_per_s"] >= target})
    return rows


def markdown(info: dict[str, Any]) -> str:
    m, target = info["machine"], info["target_images_per_s"]
    lines = [
        "# The PostgreSQL job store at cluster scale (issue #64 item 3)", "",
        f"Run {info['started']} by `python -m benchmarks.store_scale {' '.join(info['argv'])}`, {info['wall_s']:.0f} s in all.", "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['platform']}; load average "
        f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'])} at the start, "
        f"{', '.join(f'{x:.1f}' for x in info['load_average_at_end'])} at the end",
        f"- store: {m['postgresql']}; {', '.join(f'{k} {v}' for k, v in m['postgresql_settings'].items())} "
        "(the tests' throwaway server, tests/service/jobs/postgres_server.py), on loopback, "
        + (f"pinned to CPU {info['store_cpu']} and the claimers to the other{'s' if m['cores'] > 2 else ''} (a core of its own)"
           if info.get("store_cpu") is not None else "on the same 2 cores as the claimers"),
        f"- claimers: threads of one Python process, each with its own `PostgresStore` (own pool); each claims up to "
        f"{' or '.join(str(x) for x in info['limits'])} images (its free slots: `IDG_JOBS_IN_FLIGHT`, "
        f"default 2), then stores a {info['answer_bytes']}-byte answer for each, "
        + ("one transaction per answer" if info.get("finish_each") else
           "the claim's answers in one transaction (`finish_many`, the runner's group commit)")
        + f", no model time between; images of {info['image_bytes']} bytes; lease {LEASE_S:g} s",
        f"- tenants: `alpha` (jobs of up to {ALPHA_JOB} images) and `beta` (jobs of {BETA_JOB}), half the open images each",
        f"- a level runs {info['seconds']:g} s or until a fifth of its open images are answered; then they are made pending again",
        f"- target: {TARGET_FACTOR} x one H200's Lite0 job rate = {TARGET_FACTOR} x {info['h200_lite0_per_s']:.1f} "
        f"(`{H200_CHECK}`, check-service-lite0, 128 clients) = **{target:.0f} images/s** at 100k open images", "",
        "| open images | claimers | images per claim | images finished/s | claims/s (empty of all) | claim ms p50 / p99 | "
        "finish ms p50 / p99 (per answer, or per claim's answers together) | CPU ms per image: store / claimers | images | "
        "alpha / beta share | beta claims per job min-max | lost / duplicated / errors | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv, v in zip(info["levels"], info["verdicts"], strict=True):
        share = lv["tenant_share"]
        lines.append(
            f"| {lv['open_images']:,} | {lv['claimers']} | {lv['limit']} | **{lv['finished_per_s']:.0f}** | "
            f"{lv['claims_per_s']:.0f} ({lv['empty_claims']} of {lv['claims']}) | "
            f"{lv['claim_ms_p50']:.1f} / {lv['claim_ms_p99']:.1f} | {lv['finish_ms_p50']:.1f} / {lv['finish_ms_p99']:.1f} | "
            f"{lv['store_cpu_ms_per_image']:.2f} / {lv['claimers_cpu_ms_per_image']:.2f} | "
            f"{lv['images_finished']} in {lv['seconds']:.1f} s | {share['alpha']:.2f} / {share['beta']:.2f} | "
            f"{lv['beta_claims_per_job_min']}-{lv['beta_claims_per_job_max']} | {lv['lost']} / {lv['duplicated']} / {lv['errors']} | "
            f"{'met' if v['meets_target'] else 'missed'} |")
    lines += ["", "One claim of 2 images alone (the store's whole claim, timed, right after loading): "
              + ", ".join(f"{int(k):,} open images {v['execution_ms']:.0f} ms" for k, v in info["claim_plans"].items())
              + " (the plans are in the JSON)."]
    lines += ["", f"Loading the open images: {', '.join(f'{int(k):,} in {v:.0f} s' for k, v in info['load_s'].items())}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--open-images", type=int, nargs="+", default=[1000, 20000, 100000])
    p.add_argument("--claimers", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--limits", type=int, nargs="+", default=[2, 16, 64],
                   help="images per claim (a runner's free slots: IDG_JOBS_IN_FLIGHT, default 2; a GPU replica needs more)")
    p.add_argument("--seconds", type=float, default=8.0, help="longest run of one level")
    p.add_argument("--finish-each", action="store_true",
                   help="one transaction per answer (the runner before group commit), not one per claim's answers")
    p.add_argument("--image-bytes", type=int, default=2048)
    p.add_argument("--answer-bytes", type=int, default=4096, help="the stored answer's result JSON, about")
    p.add_argument("--store-cpu", type=int, default=None,
                   help="pin the PostgreSQL server to this CPU and the claimers to the others (default: all share every CPU)")
    p.add_argument("--out", type=Path, default=Path(f"results/benchmarks/store-scale-{datetime.now(UTC):%Y-%m-%d}"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="store-scale %(asctime)s %(message)s", datefmt="%H:%M:%S")
    from tests.service.jobs.postgres_server import postgres_server

    began, started = time.monotonic(), f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    target = TARGET_FACTOR * h200_lite0()
    answer = Answer(200, {"label": "espresso", "score": 0.9}, {"attribution": "x" * args.answer_bytes})
    levels: list[dict[str, Any]] = []
    load_s: dict[int, float] = {}
    plans: dict[int, dict[str, Any]] = {}
    with postgres_server() as url:
        if args.store_cpu is not None:
            log.info("PostgreSQL processes %s pinned to CPU %d, the claimers to the others", pin(args.store_cpu), args.store_cpu)
        info_machine = machine(url)
        log.info("machine: %s", info_machine)
        for n in args.open_images:
            t0 = time.monotonic()
            tenants, beta_jobs, data = load(url, n, args.image_bytes)
            load_s[n] = time.monotonic() - t0
            log.info("%d open images in %d jobs loaded in %.1f s", n, len(tenants), load_s[n])
            plans[n] = claim_plan(url)
            log.info("%d open images: one claim alone took %.1f ms", n, plans[n]["execution_ms"])
            for limit, c in ((limit, c) for limit in args.limits for c in args.claimers):
                level = Level(n, c, limit)
                run_level(url, level, tenants, args.seconds, answer, args.finish_each)
                figures = level.figures(beta_jobs)
                levels.append(figures)
                log.info("open %d, claimers %d, limit %d: %.0f images/s, claim p50 %.1f ms p99 %.1f ms, finish p50 %.1f ms, shares %s, "
                         "lost %d duplicated %d errors %d", n, c, limit, figures["finished_per_s"], figures["claim_ms_p50"],
                         figures["claim_ms_p99"], figures["finish_ms_p50"], figures["tenant_share"], level.lost,
                         level.duplicated, level.errors)
                reset(url, data)
    info = {"started": started, "argv": argv if argv is not None else sys.argv[1:], "machine": info_machine,
            "load_average_at_end": list(os.getloadavg()), "limits": args.limits, "claim_plans": plans, "seconds": args.seconds,
            "finish_each": args.finish_each, "store_cpu": args.store_cpu,
            "image_bytes": args.image_bytes, "answer_bytes": args.answer_bytes, "h200_check": str(H200_CHECK),
            "h200_lite0_per_s": target / TARGET_FACTOR, "target_images_per_s": target, "load_s": load_s, "levels": levels,
            "verdicts": verdicts(levels, target, args.claimers), "wall_s": time.monotonic() - began}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "store-scale.json").write_text(json.dumps(info, indent=1) + "\n")
    (args.out / "store-scale.md").write_text(markdown(info))
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
