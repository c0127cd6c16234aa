"""Command line on top of the client, for shell users and CI smoke tests.

    idg-client predict photo.jpg                      # or: python -m idg_client predict photo.jpg
    idg-client attribute photo.jpg --method idg --steps 50 --out heatmap.png [--overlay overlay.png]
    idg-client job submit photos/ --preset fast --faithfulness insertion    # prints the job id
    idg-client job wait ID                                                   # progress bar on stderr
    idg-client job results ID --summary > answers.jsonl                      # JSON Lines; --offset N resumes
    idg-client job results ID --follow       # until the job is done; exit 4 if it was deleted or the stream cut
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import httpx
from PIL import Image

from idg_client.client import Client, ServiceError

log = logging.getLogger("idg")


# Not a list of choices: the presets are the server's (its 422 names them), so a preset it adds works here at once.
PRESET_HELP = "cost preset: balanced (the service's default), fast, paper, quality, or any other the service takes"
MIN_POLL_S = 0.05
"""The shortest ``job wait --poll``: twenty status requests a second at most (0 had made about fifty, as fast as they came back)."""


def _seconds(least: float, *, inclusive: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds above ``least`` (or equal, where ``inclusive``); argparse names the option."""
    bound = f"at least {least:g}" if inclusive else f"> {least:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < least or (value == least and not inclusive):
            raise argparse.ArgumentTypeError(f"must be a number of seconds {bound}, got {text!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    """The command line; a reader that went away (``| head``) ends it quietly, as a shell tool does, not with a traceback."""
    try:
        return _main(argv)
    except BrokenPipeError:
        try:  # what is still buffered for stdout goes nowhere, not into a second BrokenPipeError at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141  # 128 + SIGPIPE, as a shell reports it


def _unauthorized(given: str | None) -> str:
    """A 401 in this command's words: its option and variable, not the HTTP headers the service names."""
    if given is None:
        return "this service needs an API key: give it with --api-key KEY or the IDG_API_KEY environment variable"
    return "the service refused the API key given (--api-key or IDG_API_KEY): check it"


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="idg-client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=os.environ.get("IDG_URL", "http://127.0.0.1:8000"),
                   help="the service, http:// or https:// (default: $IDG_URL or http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=os.environ.get("IDG_API_KEY"), help="the service's API key (default: $IDG_API_KEY)")
    p.add_argument("--timeout", type=_seconds(0, inclusive=False), default=300.0, help="seconds to wait for an answer (default 300)")
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("predict", help="top-k classes")
    pr.add_argument("image", type=Path)
    pr.add_argument("--model")
    pr.add_argument("--top-k", type=int, default=5)
    pr.add_argument("--explain-if", help="explain the prediction when this holds, e.g. 'confidence < 0.6'")
    at = sub.add_parser("attribute", help="heatmap and logit-α curve")
    at.add_argument("image", type=Path)
    at.add_argument("--model")
    at.add_argument("--method", default="idg")
    at.add_argument("--target", type=int)
    at.add_argument("--preset", help=PRESET_HELP)
    at.add_argument("--steps", type=int)
    at.add_argument("--probe-steps", type=int)
    at.add_argument("--baseline", choices=["mean", "black"])
    at.add_argument("--faithfulness", help="score the map: insertion, deletion or insertion,deletion")
    at.add_argument("--postprocess", choices=["none", "idgi", "rankmix", "xrai", "cam_regions", "cam_product"])
    at.add_argument("--smooth-samples", type=int, help="SmoothGrad over this many noisy copies")
    at.add_argument("--xrai-order", choices=["regions_then_pixels", "regions"], help="with --postprocess xrai: how the map ranks pixels")
    at.add_argument("--out", type=Path, default=Path("heatmap.png"), help="heatmap PNG to write")
    at.add_argument("--overlay", type=Path, help="also write the overlay PNG here")
    _job_parser(sub)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    out = sys.stdout
    if not args.url.lower().startswith(("http://", "https://")):  # httpx had said UnsupportedProtocol, as if unreachable
        sys.stderr.write(f"error: IDG_URL/--url must start with http:// or https:// (got {args.url!r})\n")
        return 2
    try:
        if args.command == "attribute":  # before the work: a path that cannot be written had failed after it, with a traceback
            _writable(args.out)
            if args.overlay is not None:
                _writable(args.overlay)
        with Client(args.url, api_key=args.api_key, timeout=args.timeout) as client:
            if args.command == "job":
                return _job(args, client, out)
            if args.command == "predict":
                res = client.predict(args.image, model=args.model, top_k=args.top_k, explain_if=args.explain_if)
                for s in res.top_k:
                    out.write(f"{s.index:4d}  {s.probability:.4f}  {s.name}\n")
                if res.raw.get("explained") is not None:
                    ex = res.explanation
                    which = f"; {ex.method} explanation of class {ex.target.index}" if ex else ""
                    out.write(f"explain_if held: {res.raw['explained']}{which}\n")
                return 0
            a = client.attribute(args.image, method=args.method, model=args.model, target=args.target, preset=args.preset, steps=args.steps,
                                 probe_steps=args.probe_steps, baseline=args.baseline, return_overlay=args.overlay is not None,
                                 faithfulness=args.faithfulness, postprocess=args.postprocess, smooth_samples=args.smooth_samples,
                                 xrai_order=args.xrai_order)
    except ServiceError as err:
        sys.stderr.write(f"error {err.status}: {_unauthorized(args.api_key) if err.status == 401 else err.message}\n")
        return 1
    except httpx.TimeoutException as err:  # reached, but no answer in time
        sys.stderr.write(f"error: the service at {args.url} did not answer within {args.timeout:g} s ({type(err).__name__}); "
                         "try again, or give it longer with --timeout\n")
        return 2
    except httpx.TransportError as err:  # refused, unreachable: one line, no traceback
        sys.stderr.write(f"error: could not reach the service at {args.url} ({type(err).__name__}); "
                         "start it (make run) or point --url / IDG_URL at it\n")
        return 2
    except (OSError, ValueError) as err:  # a missing file or directory, a directory without images
        sys.stderr.write(f"error: {err}\n")
        return 2
    assert a.heatmap is not None
    try:
        a.heatmap.save(args.out)
        if args.overlay and a.overlay is not None:
            a.overlay.save(args.overlay)
    except (OSError, ValueError) as err:  # the disk filled, or the folder went, meanwhile
        sys.stderr.write(f"error: the answer came but could not be written: {err}\n")
        return 2
    out.write(f"{a.model} {a.method}: class {a.target.index} {a.target.name} (p={a.target.probability:.4f}); heatmap -> {args.out}\n")
    if a.faithfulness:
        out.write("faithfulness: " + ", ".join(f"{k} {v:.3f}" for k, v in a.faithfulness.items() if k != "steps" and v is not None)
                  + f" ({a.faithfulness['steps']} steps)\n")
    if a.regions is not None:
        r = a.regions
        out.write(f"{r.source} regions ({r.order}): {len(r.areas)}; the first: gain {r.gains[0]:.4g}, "
                  f"{r.areas[0] / r.labels.size:.1%} of the image\n")
    c = a.curve
    out.write(f"alpha\t{c.output}\timportance\tweight\n")
    for i in range(len(c.alphas)):
        imp = f"{c.importance[i]:.5g}" if len(c.importance) else ""
        w = f"{c.weights[i]:.5g}" if len(c.weights) else ""
        out.write(f"{c.alphas[i]:.5f}\t{c.values[i]:.5g}\t{imp}\t{w}\n")
    return 0


def _job_parser(sub: Any) -> None:
    job = sub.add_parser("job", help="durable jobs: submit many images, wait, fetch the answers (survive server restarts)")
    jobs = job.add_subparsers(dest="job_command", required=True)
    submit = jobs.add_parser("submit", help="submit a directory of images, a tar/zip archive or images; prints the job id")
    submit.add_argument("source", nargs="+", type=Path, help="a directory (its images, recursively), an archive, or image files")
    submit.add_argument("--method", default="idg")
    submit.add_argument("--preset", help=PRESET_HELP)
    submit.add_argument("--model")
    submit.add_argument("--target", type=int)
    submit.add_argument("--steps", type=int)
    submit.add_argument("--probe-steps", type=int)
    submit.add_argument("--faithfulness", help="score each map: insertion, deletion or insertion,deletion")
    submit.add_argument("--explain-if", help="explain an image only when this holds of its prediction, e.g. 'confidence < 0.6'")
    submit.add_argument("--callback-url", help="http(s) URL the service POSTs the job's status to when it ends")
    submit.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="any other /attribute field (repeat)")
    wait = jobs.add_parser("wait", help="wait until the job is done, with a progress bar on stderr")
    wait.add_argument("id")
    wait.add_argument("--poll", type=_seconds(MIN_POLL_S, inclusive=True), default=1.0,
                      help=f"seconds between status checks (default 1, at least {MIN_POLL_S:g})")
    results = jobs.add_parser("results", help="the answers as JSON Lines on stdout")
    results.add_argument("id")
    results.add_argument("--offset", type=int, default=0, help="skip the first N answers (resume after the last seq read)")
    results.add_argument("--summary", action="store_true", help="only scores and classes, no images")
    results.add_argument("--follow", action="store_true", help="keep reading until the job is done")
    for name, text in (("status", "the job's state and counts (JSON)"), ("delete", "cancel and delete the job")):
        jobs.add_parser(name, help=text).add_argument("id")
    jobs.add_parser("list", help="the jobs, newest first")


def _job(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    cmd = args.job_command
    if cmd == "submit":
        extra = dict(_field(f) for f in args.set)
        params = {"preset": args.preset, "model": args.model, "target": args.target, "steps": args.steps,
                  "probe_steps": args.probe_steps, "faithfulness": args.faithfulness} | extra
        source = args.source[0] if len(args.source) == 1 and (args.source[0].is_dir() or not _is_image(args.source[0])) else args.source
        job = client.submit_job(source, method=args.method, explain_if=args.explain_if, callback_url=args.callback_url, **params)
        sys.stderr.write(f"job {job['id']}: {job['total']} image(s) queued; {job['url']}\n")
        out.write(job["id"] + "\n")
    elif cmd == "wait":
        status = client.wait_job(args.id, poll_s=args.poll, on_progress=_Progress(sys.stderr))
        sys.stderr.write("\n")
        out.write(f"{status['id']} {status['state']}: {status['done']} answered, {status['failed']} failed of {status['total']}\n")
        return 0 if status["failed"] == 0 else 3
    elif cmd == "results":
        answers = client.job_results(args.id, offset=args.offset, summary=args.summary, follow=args.follow)
        for line in answers:
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
        if args.follow and answers.end != "finished":  # deleted meanwhile, or the stream ended early: resumable
            sys.stderr.write(f"job {args.id}: the results stream ended ({answers.end or 'cut'}) after seq {answers.after or 0}\n")
            return 4
    elif cmd == "status":
        out.write(json.dumps(client.job(args.id), indent=2) + "\n")
    elif cmd == "delete":
        client.delete_job(args.id)
        out.write(f"deleted {args.id}\n")
    else:
        for j in client.jobs(limit=500)["jobs"]:
            out.write(f"{j['id']}  {j['state']:8s} {j['done'] + j['failed']:>6d}/{j['total']:<6d} failed {j['failed']}\n")
    return 0


def _writable(path: Path) -> None:
    """A ``ValueError`` for an image path that cannot be written: no such folder, or no format by its extension."""
    if not path.parent.is_dir():
        raise ValueError(f"{path}: the folder {path.parent} does not exist")
    if path.suffix.lower() not in Image.registered_extensions():
        raise ValueError(f"{path}: give it an image extension (.png, .jpg, ...) to say its format")


def _field(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set takes FIELD=VALUE, got {text!r}")
    return key.replace("-", "_"), value


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")


class _Progress:
    """A progress bar on a terminal (redrawn in place), a line per 10% elsewhere (logs, CI)."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.shown = -1
        self.began = time.monotonic()

    def __call__(self, status: dict[str, Any]) -> None:
        total, answered = max(status["total"], 1), status["done"] + status["failed"]
        eta = status.get("eta_s")
        filled = self.WIDTH * answered // total
        text = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {answered}/{status['total']} answered, {status['failed']} failed"
                + (f", ETA {_duration(eta)}" if eta else "") + f" ({status['state']}, {_duration(time.monotonic() - self.began)})")
        if self.tty:
            self.stream.write("\r" + text.ljust(100))
        elif answered == status["total"] or answered * 10 // total > self.shown:
            self.shown = answered * 10 // total
            self.stream.write(text + "\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


if __name__ == "__main__":
    raise SystemExit(main())
