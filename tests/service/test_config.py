"""Settings: device-dependent batch defaults, explicit values win, bad values are refused at start."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from app.core.config import Settings
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
