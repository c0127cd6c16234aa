"""Attribution speed: our batched IDG-50/50 against Captum's IG and the authors' way, same run.

The authors' way is their computation pattern: one image at a time, path points in batches of 25
(probe, then main pass). Captum's IntegratedGradients (n_steps=50, internal batch) is the peer
library; it computes IG, which needs no probe pass, so IDG costs ~1.33x its passes by design.

The region rows (:func:`run_rows`: Grad-CAM, XRAI, the CAM post-steps) are measured against the service's default
answer and, for Grad-CAM and Grad-CAM++, against the peer library pytorch-grad-cam (:mod:`benchmarks.gradcam_peer`),
in the same run on the same images.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import resource
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from benchmarks.gradcam_peer import PEER_CLASSES, PEER_FOLDER, PEER_VERSION, load_peer, peer_cam, peer_target
from benchmarks.samples import bench_photos
from idg_core import idg, ig, resolve_baseline
from idg_core.presets import DEFAULT_PRESET, ROWS, attribute, preset_cost, row_post
from idg_models import ImageClassifier, decode_image, image_files, imagenet_label
from idg_models.compiled import compiled_part
from idg_models.fuse import fusion_available

log = logging.getLogger(__name__)
SAMPLES = bench_photos()
"""The photos the benchmarks read unless told: see :func:`benchmarks.samples.bench_photos`."""


def sample_batch(model: ImageClassifier, folder: Path, n: int) -> tuple[Tensor, list[int], list[Path]]:
    """The first ``n`` images of ``folder`` (by name) as the model's input, their labels and their paths.

    A label is the ImageNet class of a ``WNID_*`` file name for a 1000-class model; otherwise (your
    model's classes, your photos) it is the model's own prediction, so every target is in range."""
    files = image_files(folder)[:n]
    if not files:
        raise ValueError(f"no images (JPEG, PNG) in {folder}")
    images = torch.stack([model.prepare(decode_image(f.read_bytes())) for f in files])
    known = [label for f in files if (label := imagenet_label(f.name, model.num_classes)) is not None]
    if len(known) == len(files):
        return images, known, files
    device = model.mean.device  # its buffers: a fused network may keep its weights as buffers only
    with torch.no_grad():
        predicted = torch.cat([model(chunk.to(device)).argmax(1).cpu() for chunk in images.split(16)])
    return images, predicted.tolist(), files


def _fused_conv_flop(x_shape: list[int], w_shape: list[int], *args: Any, out_shape: list[int] | None = None, **kwargs: Any) -> int:
    """FLOPs of ``mkldnn::_convolution_pointwise`` (FlopCounterMode hands shapes in place of tensors)."""
    assert out_shape is not None
    return conv_flop_count(x_shape, w_shape, out_shape)


def forward_flops(model: torch.nn.Module, size: int, device: torch.device) -> int:
    """FLOPs of one image's forward pass (PyTorch's FLOP counter, taught the fused convolution of
    :mod:`idg_models.fuse`, which it would count as 0). A compiled model is counted on its
    uncompiled network: its graphs pad one image to their smallest batch size (and counting through
    them would count the padding)."""
    mapping = {torch.ops.mkldnn._convolution_pointwise: _fused_conv_flop} if fusion_available() else {}
    counter = FlopCounterMode(display=False, custom_mapping=mapping)
    part = compiled_part(model)
    net = model if part is None else part.net
    with counter, torch.no_grad():
        net(torch.rand(1, 3, size, size, device=device))
    return int(counter.get_total_flops())


def _timed(fn: Callable[[], Any], device: torch.device, repeats: int, warm: bool) -> float:
    if warm:
        fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _malloc_in_use() -> Callable[[], int] | None:
    """glibc's bytes in use (heap blocks + mmapped blocks, all arenas) as a function, or None off glibc 2.33+.
    Unlike the resident set it falls when tensors are freed, also where ``malloc`` keeps the memory."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype, mallinfo2.argtypes = _MallInfo2, []

    def in_use() -> int:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return in_use


_CPU_BYTES: Callable[[], int] = _malloc_in_use() or _rss_bytes
CPU_MEMORY = "RSS growth" if _CPU_BYTES is _rss_bytes else "malloc in use"
"""What :func:`_peak_memory` measures on the CPU here."""


def _peak_memory(fn: Callable[[], Any], device: torch.device) -> float | None:
    """Peak memory in MiB that ``fn`` adds: CUDA's allocator peak over what was allocated before;
    on the CPU, the peak growth of glibc's bytes in use (else of the resident set, which cannot fall
    back once ``malloc`` keeps freed memory), sampled every 2 ms: a lower bound. None where neither
    can be read."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    read = _CPU_BYTES
    try:
        base = read()
    except OSError:
        return None
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], read())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return (max(peak[0], read()) - base) / 2**20


def matmul_tflops(device: torch.device, dtype: torch.dtype = torch.float32, n: int | None = None) -> float:
    """Measured rate of an n x n x n matrix product on random data (median of repeats after warm-up):
    the device's practical compute ceiling for that dtype, under the current TF32 switches. On a CPU ``n`` defaults
    to the largest of 256, 512, ..., 2048 whose product takes under 0.1 s (bf16 without the CPU's bf16
    instructions runs a 2048 product in about 15 s on the project's 2-core AMD VM)."""
    if n is None and device.type != "cuda":
        n = 256
        while n < 2048:
            square = partial(torch.matmul, *(2 * [torch.randn(n, n, dtype=dtype)]))
            if _timed(square, device, 1, warm=True) > 0.1 / 8:  # the next size costs 8 times as much
                break
            n *= 2
    n = n or 8192
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(10 if device.type == "cuda" else 5):
        times.append(_timed(lambda: a @ b, device, 1, warm=False))
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def run_speed(model: ImageClassifier, images: Tensor, targets: list[int], batch_sizes: list[int], *, device: torch.device,
              batch_size: int = 32, repeats: int = 1, peak_tflops: float | None = None,
              ceiling_tflops: float | None = None, captum_batch: int | None = None,
              plain_model: ImageClassifier | None = None) -> list[dict[str, Any]]:
    """Seconds per attribution of: ours at the service's default (IDG at the ``fast`` preset, its post-steps included:
    :func:`idg_core.presets.attribute`), ours IDG-50/50
    (the paper), ours IG-50, Captum IG-50 at ``captum_batch`` images per call (its internal batch; default
    ours) on the same tuned model as ours, Captum IG-50 at PyTorch's defaults (``plain_model``, the
    model as loaded, without :func:`~idg_models.tune`, under PyTorch's own TF32 switches: what a
    Captum user gets without thinking) and the authors' one-image-at-a-time way, all on the same
    images in one run."""
    from captum.attr import IntegratedGradients

    captum_ig = IntegratedGradients(model)
    captum_plain = IntegratedGradients(plain_model) if plain_model is not None else None
    size = images.shape[-1]
    fwd = forward_flops(model, size, device)
    rows = []
    for b in batch_sizes:
        x, t = images[:b].to(device), targets[:b]
        base = resolve_baseline("mean", x, model.preprocessing.mean)  # what ours resolves "mean" to
        def authors_way(x: Tensor = x, t: list[int] = t) -> list[Any]:  # one image at a time, 25 points a call
            return [idg(model, x[i : i + 1], "mean", t[i], steps=50, probe_steps=50, batch_size=25) for i in range(len(t))]

        runs: dict[str, Callable[[], Any]] = {
            "ours_default": partial(attribute, model, x, "mean", t, batch_size=batch_size),  # the service's default answer
            "ours_idg": partial(idg, model, x, "mean", t, steps=50, probe_steps=50, batch_size=batch_size),
            "ours_ig": partial(ig, model, x, "mean", t, steps=50, batch_size=batch_size),
            "captum_ig": partial(captum_ig.attribute, x, base, target=t, n_steps=50, internal_batch_size=captum_batch or batch_size),
            "authors_way_idg": authors_way,
        }
        if captum_plain is not None:
            def captum_default(x: Tensor = x, base: Tensor = base, t: list[int] = t, explainer: Any = captum_plain) -> Any:
                with pytorch_default_tf32():
                    return explainer.attribute(x, base, target=t, n_steps=50, internal_batch_size=captum_batch or batch_size)
            runs["captum_ig_default"] = captum_default
        fast = preset_cost("idg")
        flops = {
            "ours_default": fwd * (fast.forward + 2 * fast.backward),  # a pass with a gradient costs about 3 forwards
            "ours_idg": fwd * (50 + 3 * 50),
            "ours_ig": fwd * 3 * 50,
            "captum_ig": fwd * 3 * 50,
            "captum_ig_default": fwd * 3 * 50,
            "authors_way_idg": fwd * (50 + 3 * 50),
        }
        row: dict[str, Any] = {"batch": b}
        for name, fn in runs.items():
            seconds = _timed(fn, device, repeats, warm=b == batch_sizes[0])
            row[f"{name}_s_per_attr"] = seconds / b
            row[f"{name}_attr_per_s"] = b / seconds
            row[f"{name}_tflops"] = flops[name] * b / seconds / 1e12
            row[f"{name}_peak_mib"] = _peak_memory(fn, device)
            log.info("batch %d %s: %.3f s per attribution", b, name, seconds / b)
        row["default_vs_captum_ig"] = row["captum_ig_s_per_attr"] / row["ours_default_s_per_attr"]
        if "captum_ig_default_s_per_attr" in row:
            row["default_vs_captum_default"] = row["captum_ig_default_s_per_attr"] / row["ours_default_s_per_attr"]
        row["idg_vs_captum_ig"] = row["captum_ig_s_per_attr"] / row["ours_idg_s_per_attr"]
        row["ig_vs_captum_ig"] = row["captum_ig_s_per_attr"] / row["ours_ig_s_per_attr"]
        row["idg_vs_authors_way"] = row["authors_way_idg_s_per_attr"] / row["ours_idg_s_per_attr"]
        if peak_tflops:
            row["idg_share_of_peak"] = row["ours_idg_tflops"] / peak_tflops
        if ceiling_tflops:
            row["idg_share_of_ceiling"] = row["ours_idg_tflops"] / ceiling_tflops
        rows.append(row)
    return rows


DEFAULT_ROW = f"idg@{DEFAULT_PRESET}"
"""The reference of the region rows: IDG at the default preset with its post-steps, the service's default answer."""


def row_ratios(row: dict[str, Any], reference: dict[str, Any], b: int) -> dict[str, float]:
    """At batch size ``b``, from the figures of a region row and of the default's (``reference``): the row's
    attributions/s over the default's (``vs_default``), its peer's over the default's (``peer_vs_default``) and the
    row's over its peer's (``vs_peer``); each only where both figures are there."""
    ours, peer, default = row.get(f"attr_per_s_{b}"), row.get(f"peer_attr_per_s_{b}"), reference.get(f"attr_per_s_{b}")
    pairs = {"vs_default": (ours, default), "peer_vs_default": (peer, default), "vs_peer": (ours, peer)}
    return {name: top / bottom for name, (top, bottom) in pairs.items() if top and bottom}


def run_rows(model: ImageClassifier, images: Tensor, targets: list[int], batch_sizes: list[int], rows: list[str], *,
             device: torch.device, batch_size: int = 32, repeats: int = 1,
             peer_folder: Path = PEER_FOLDER) -> list[dict[str, Any]]:
    """Attributions per second of the region rows (:data:`idg_core.presets.ROWS`: Grad-CAM, XRAI and Grad-CAM's
    post-steps over IDG), each as the service answers it (:func:`idg_core.presets.attribute`), with their references
    measured in the same run on the same images at each batch size, the first size after a warm-up run (the CAM layer
    found, SciPy loaded):

    - the default answer first (:data:`DEFAULT_ROW`, ``reference: True``); each row's ``vs_default_{b}`` is its
      attributions/s over the default's;
    - for ``gradcam`` and ``gradcam_pp``, the peer library pytorch-grad-cam's GradCAM and GradCAMPlusPlus on the same
      model and layer (:func:`benchmarks.gradcam_peer.peer_target`), all images in one call as it is used:
      ``peer_attr_per_s_{b}``, ``peer_vs_default_{b}`` and ours over it, ``vs_peer_{b}``; ``peer_installed: False``
      where ``peer_folder`` has none, ``peer_error`` where it cannot run on the model.

    A row the model cannot run (no CAM layer) keeps its reason (``error``) instead of figures. No rows: nothing
    measured, not even the default."""
    if not rows:
        return []
    peer = load_peer(peer_folder) if set(rows) & set(PEER_CLASSES) else None  # its import takes seconds
    hooked: tuple[torch.nn.Module, torch.nn.Module] | ValueError | None = None
    found = []
    for name, fields in [(DEFAULT_ROW, {"method": "idg", "preset": DEFAULT_PRESET}), *((n, ROWS[n][0]) for n in rows)]:
        post = row_post(fields)
        row: dict[str, Any] = {"row": name, **({"reference": True} if name == DEFAULT_ROW else {})}
        if name in PEER_CLASSES:
            row |= {"peer": f"pytorch-grad-cam {PEER_VERSION} {PEER_CLASSES[name]}", "peer_installed": peer is not None}
        for b in batch_sizes:
            x, t = images[:b].to(device), targets[:b]
            run = partial(attribute, model, x, "mean", t, method=fields["method"],
                          preset=fields.get("preset", DEFAULT_PRESET), batch_size=batch_size, **post)
            try:
                seconds = _timed(run, device, repeats, warm=b == batch_sizes[0])
            except ValueError as err:  # e.g. a model without a CAM layer: Grad-CAM's rows cannot run on it
                row["error"] = str(err)
                break
            row[f"attr_per_s_{b}"] = b / seconds
            log.info("batch %d %s: %.2f attributions/s", b, name, b / seconds)
            if peer is None or name not in PEER_CLASSES or "peer_error" in row:
                continue
            if hooked is None:
                try:
                    hooked = peer_target(model)
                except ValueError as err:
                    hooked = err
            if isinstance(hooked, ValueError):
                row["peer_error"] = str(hooked)
                continue
            with peer_cam(peer, name, *hooked) as cam:
                seconds = _timed(partial(cam, x, t), device, repeats, warm=b == batch_sizes[0])
            hooked[0].zero_grad(set_to_none=True)  # the peer's backward leaves the weights' gradients
            row[f"peer_attr_per_s_{b}"] = b / seconds
            log.info("batch %d %s: %.2f attributions/s", b, row["peer"], b / seconds)
        found.append(row)
    for row in found[1:]:
        for b in batch_sizes:
            row |= {f"{name}_{b}": value for name, value in row_ratios(row, found[0], b).items()}
    return found


@contextlib.contextmanager
def pytorch_default_tf32() -> Any:
    """PyTorch's own TF32 switches for the duration (TF32 convolutions, IEEE matrix products): what a
    Captum user gets without touching anything. Restores the switches that were set."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                            "threads": torch.get_num_threads(), "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info
