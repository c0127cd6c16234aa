"""Settings: device-dependent batch defaults, explicit values win, bad values are refused at start."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from app.core.config import Settings
from idg_core.presets import preset_cost
from tests.service.conftest import AppFactory, image_bytes, serve

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_batch_defaults_follow_the_device() -> None:
    s = Settings()
    assert (s.batch_images(CPU), s.round_images(CPU)) == (8, 64)
    assert (s.batch_images(CUDA), s.round_images(CUDA)) == (128, 512)


def test_explicit_batch_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDG_MAX_BATCH_IMAGES", "24")
    monkeypatch.setenv("IDG_MAX_ROUND_IMAGES", "48")
    s = Settings()
    assert (s.batch_images(CPU), s.round_images(CUDA)) == (24, 48)


def test_compile_sizes_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDG_COMPILE_SIZES", "64, 16,128")
    assert Settings().compile_sizes == [64, 16, 128]


@pytest.mark.parametrize(("name", "value"), [("IDG_PRECISION", "fp8"), ("IDG_MAX_BATCH_IMAGES", "0"), ("IDG_CHANNELS_LAST", "maybe"),
                                             ("IDG_COMPILE_SIZES", "0,8"), ("IDG_COMPILE_SIZES", "eight")])
def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("IDG_").lower()):
        Settings()


@pytest.mark.parametrize("keep", [True, False])
async def test_start_up_keeps_freed_memory_unless_told_not_to(tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch,
                                                              keep: bool) -> None:
    calls: list[None] = []
    monkeypatch.setattr("app.assembly.keep_freed_memory", lambda: calls.append(None) or True)
    async with serve(tiny_app(keep_freed_memory=keep)) as client:
        assert (await client.get("/health/ready")).status_code == 200
    assert len(calls) == int(keep)


@pytest.mark.parametrize("freeze", [True, False])
async def test_start_up_freezes_its_objects_out_of_the_collector_until_the_app_stops(tiny_app: AppFactory, freeze: bool) -> None:
    import gc

    assert gc.get_freeze_count() == 0
    async with serve(tiny_app(gc_freeze=freeze)) as client:
        assert (await client.get("/health/ready")).status_code == 200
        frozen = gc.get_freeze_count()
        assert (await client.post("/predict", files={"file": ("a.png", image_bytes())})).status_code == 200
    assert (frozen > 10_000) is freeze  # the modules, the app and the models made before ready
    assert gc.get_freeze_count() == 0  # stopped: a process that goes on can collect them again


@pytest.mark.parametrize(("extra", "while_running"), [({"simulated_call_ms": 1.0}, 1), ({}, None),
                                                      ({"simulated_call_ms": 1.0, "torch_threads": 3}, 3)])
async def test_torch_threads_are_one_on_an_accelerator_and_as_they_were_once_the_app_stops(
        tiny_app: AppFactory, extra: dict[str, object], while_running: int | None) -> None:
    """The simulated device stands for an accelerator: its host's small tensor ops run on one intra-op thread each
    (IDG_TORCH_THREADS wins); on the CPU torch keeps its own count. Process-wide, so restored at the end."""
    original = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        async with serve(tiny_app(**extra)) as client:
            assert (await client.post("/predict", files={"file": ("a.png", image_bytes())})).status_code == 200
            assert torch.get_num_threads() == (while_running or 2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(original)


def test_a_value_that_cannot_be_used_is_one_line_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.core.config import SettingsError, load_settings

    monkeypatch.setenv("IDG_MAX_QUEUE", "abc")
    monkeypatch.setenv("IDG_SHUTDOWN_GRACE_S", "inf")  # had been taken, and crashed the shutdown watchdog
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert "\n" not in message
    assert "invalid setting IDG_MAX_QUEUE='abc': Input should be a valid integer" in message
    assert "invalid setting IDG_SHUTDOWN_GRACE_S='inf': Input should be a finite number" in message


def test_a_value_of_a_union_type_is_one_sentence_listing_every_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """IDG_PRECISION is a precision or auto: pydantic fails each alternative, and the message had said the setting twice."""
    from app.core.config import SettingsError, load_settings

    monkeypatch.setenv("IDG_PRECISION", "bf17")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert str(err.value) == "invalid setting IDG_PRECISION='bf17': Input should be 'fp32', 'tf32', 'bf16' or 'auto'"


def test_an_empty_variable_is_an_unset_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("IDG_MODELS_FILE", "IDG_CALIBRATION_FILE", "IDG_API_KEYS_FILE", "IDG_DATA_DIR", "IDG_MAX_QUEUE"):
        monkeypatch.setenv(name, "")  # as docker-compose passes ${X:-}: a path "" had been the current folder
    s = Settings()
    assert s.models_file is None and s.calibration_file is None and s.api_keys_file is None
    assert s.data_dir == Settings.model_fields["data_dir"].default and s.max_queue == Settings.model_fields["max_queue"].default


def test_an_unknown_idg_name_is_warned_with_the_nearest_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from app.core import config
    from app.core.config import load_settings

    monkeypatch.setattr(config, "_WARNED", set())  # each warning is logged once a process: this test's afresh
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("IDG_MAXQUEUE=3\nOTHER=1\n")
    monkeypatch.setenv("IDG_MODEL", "resnet50")
    monkeypatch.setenv("IDG_URL", "http://x")  # the client's: known
    with caplog.at_level(logging.WARNING, logger="app.core.config"):
        load_settings()
    warned = [r.getMessage() for r in caplog.records]
    assert "unknown setting IDG_MODEL, ignored (did you mean IDG_MODELS?)" in warned
    assert "unknown setting IDG_MAXQUEUE, ignored (did you mean IDG_MAX_QUEUE?)" in warned
    assert not any("IDG_URL" in w or "OTHER" in w for w in warned)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.core.config"):
        load_settings()  # read again (the launcher, then the app it imports): not warned again
    assert not caplog.records


def test_the_server_refuses_to_start_in_one_line_naming_the_setting(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDG_")} | {"IDG_MAX_QUEUE": "0", "IDG_PORT": "0"}
    done = subprocess.run([sys.executable, "-m", "app.server"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 3
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    wanted = "cannot start: invalid setting IDG_MAX_QUEUE='0': Input should be greater than or equal to 1"
    assert len(lines) == 1 and wanted in lines[0], done.stderr
    refused = subprocess.run([sys.executable, "-m", "app.server", "--port", "70000"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "'70000': a port number, 0 to 65535" in refused.stderr


def test_start_up_failures_name_their_setting_in_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.core.model_loading import ModelLoadError, pick_device
    from app.doors.keys import load_keys
    from app.jobs.runner import open_store

    with pytest.raises(ModelLoadError, match=r"IDG_DEVICE='gpu' is not a device: auto, cpu, cuda or cuda:N"):
        pick_device("gpu")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("IDG_DATA_DIR", str(blocked / "data"))
    with pytest.raises(ModelLoadError, match=r"IDG_DATA_DIR=.*a-file/data: the job store cannot be made there \(Not a directory\)"):
        open_store(Settings())
    monkeypatch.setenv("IDG_API_KEYS_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"IDG_API_KEYS_FILE=.*missing cannot be read \(No such file or directory\)"):
        load_keys(Settings())
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDG_")} | {"IDG_API_KEYS_FILE": str(tmp_path / "missing")}
    done = subprocess.run([sys.executable, "-m", "app.server", "--port", "0"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert "cannot start: IDG_API_KEYS_FILE=" in done.stderr


@pytest.mark.parametrize(("limits", "words"), [({"max_passes": 1}, f"may cost up to {preset_cost('idg').forward + 1} model "
                                                                   "passes, more than the limit of 1"),
                                               ({"max_steps": 2}, "probe_steps must be >= 3, got 2")])
def test_limits_under_which_a_default_attribution_cannot_run_stop_the_start(limits: dict, words: str) -> None:
    from app.assembly import check_defaults_fit
    from app.core.model_loading import ModelLoadError
    from tests.models import tiny_classifier

    model = tiny_classifier()
    check_defaults_fit(Settings(models=["tiny"]), {"tiny": model})  # the defaults fit the default limits
    with pytest.raises(ModelLoadError, match="a default /attribute on tiny could not run under this server's limits") as err:
        check_defaults_fit(Settings(models=["tiny"], **limits), {"tiny": model})
    assert words in str(err.value)


def test_settings_that_others_make_void_are_warned(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from app.core import config
    from app.core.config import load_settings

    monkeypatch.setattr(config, "_WARNED", set())
    for name, value in {"IDG_METRICS_NEED_KEY": "true", "IDG_FIXED_CALL_SIZES": "false", "IDG_CALL_SIZES": "3,7",
                        "IDG_COMPILE_SIZES": "3,5", "IDG_SIMULATED_IMAGE_MS": "50", "IDG_TORCH_THREADS": "100000",
                        "IDG_PRECISION": "fp32", "IDG_CALIBRATION_FILE": "/nowhere/calibration.json"}.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="app.core.config"):
        load_settings()
    warned = " | ".join(r.getMessage() for r in caplog.records)
    for words in ("IDG_METRICS_NEED_KEY=true but no key is set", "IDG_CALL_SIZES is ignored: IDG_FIXED_CALL_SIZES=false",
                  "IDG_COMPILE_SIZES is ignored", "IDG_SIMULATED_IMAGE_MS is ignored", "IDG_TORCH_THREADS=100000 is more than",
                  "IDG_CALIBRATION_FILE ignored: IDG_PRECISION=fp32 is explicit"):
        assert words in warned
    caplog.clear()
    monkeypatch.setenv("IDG_FIXED_CALL_SIZES", "true")
    monkeypatch.setenv("IDG_CALL_SIZES", "4,99999")
    with caplog.at_level(logging.WARNING, logger="app.core.config"):
        sizes = Settings().sizes_for(torch.device("cpu"), max_batch=16)
    limit = min(Settings().batch_images(torch.device("cpu")), 16)
    assert sizes == (4, limit) and f"IDG_CALL_SIZES 4,99999: sizes above this model's largest call, {limit}" in caplog.text


def test_a_host_that_does_not_resolve_is_named_before_the_models_load() -> None:
    from app.server import _host_error

    assert _host_error("127.0.0.1", "IDG_HOST") is None and _host_error("0.0.0.0", "IDG_HOST") is None
    error = _host_error("bad host!", "IDG_HOST")
    assert error is not None and error.startswith("IDG_HOST='bad host!' is not an address or a name this machine resolves")


def test_a_busy_port_is_named_with_what_to_do_before_the_models_load(tmp_path: Path) -> None:
    """A real server process on a port another program listens on: it stops at once, in one line that names the port
    and `make run PORT=` (it had loaded the models, then ended in uvicorn's "Address already in use")."""
    import socket

    from app.server import SUGGESTED_PORTS, _bind_error

    with socket.socket() as holder, socket.socket() as first:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        held = next(p for p in SUGGESTED_PORTS if _bind_error("127.0.0.1", p) is None)
        first.bind(("127.0.0.1", held))  # the first port the hint would name, now busy: it names the next free one
        first.listen()
        free = next(p for p in SUGGESTED_PORTS if p > held and _bind_error("127.0.0.1", p) is None)
        env = {**os.environ, "IDG_DATA_DIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "-m", "app.server", "--port", str(port)], capture_output=True, text=True,
                              timeout=120, env=env, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 3, done.stderr[-2000:]
    line = (f"cannot start: port {port} on 127.0.0.1 is in use (another server?): "
            f"choose another with --port, e.g. `make run PORT={free}` or `idg-serve --port {free}`")
    assert line in done.stderr and "loading" not in done.stderr.lower(), done.stderr[-2000:]


def test_the_ports_the_busy_port_hint_names_are_used_by_no_page_but_for_that() -> None:
    """The hint's ports are not the service's, the docs site's, the gRPC example's or Ray's metrics port: no page,
    script or default names them but the README and the getting-started page, for the busy port, with the port the hint
    names first (the hint had named 8001, the docs site's, and the README 8080)."""
    import re

    from app.server import SUGGESTED_PORTS

    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", root / "Makefile", root / "mkdocs.yml", *(root / "docs").rglob("*.md"), *(root / "deploy").rglob("*.y*ml")]
    lines = [(page.relative_to(root).as_posix(), line) for page in pages for line in page.read_text().splitlines()]
    used = {int(p) for _, line in lines for p in re.findall(r"(?<![\d.])(8\d{3})(?![\d.])", line)}
    assert {8000, 8001, 8080} <= used and used & set(SUGGESTED_PORTS) == {SUGGESTED_PORTS[0]}, sorted(used)
    naming = [(page, line) for page, line in lines if re.search(rf"(?<![\d.]){SUGGESTED_PORTS[0]}(?![\d.])", line)]
    assert {page for page, _ in naming} == {"README.md", "docs/getting-started.md"}, naming
    assert all(f"PORT={SUGGESTED_PORTS[0]}" in line for _, line in naming), naming
