"""The GPU check's table (benchmarks/gpu_check.py): the figures it reads, the targets it judges, and (slow) the whole
check end to end on the CPU with the simulated device, as ``bash benchmarks/gpu_run.sh check --dry-run`` runs it."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.gpu_check import Stage, Target, agrees, gpu_busy_percent, pytest_counts, render, summarise

ROOT = Path(__file__).resolve().parents[1]


def test_pytest_counts_reads_the_closing_line() -> None:
    text = "....F.\nFAILED tests/x.py::test_y\n6 passed, 1 failed, 2 skipped, 30 deselected in 4.2s\n"
    assert pytest_counts(text) == {"passed": 6, "failed": 1, "skipped": 2, "deselected": 30}
    assert pytest_counts("no closing line") == {}


def test_a_target_is_met_missed_or_not_measured() -> None:
    assert Target("a", 301, ">=", 300).met is True
    assert Target("a", 299, ">=", 300).met is False
    assert Target("b", 12.5, "<=", 12, " ms").met is False
    assert Target("b", None, "<=", 12).met is None
    assert "**missed**" in Target("a", 299, ">=", 300).row() and "not measured" in Target("b", None, "<=", 1).row()


def test_gpu_busy_is_the_sm_utilisation_where_nvidia_smi_read_it() -> None:
    assert gpu_busy_percent({"gpu_sm_util_mean": 38.0, "device_busy_fraction": 0.67}) == 38.0  # two processes: 67% is summed
    assert gpu_busy_percent({"gpu_sm_util_mean": None, "device_busy_fraction": 0.9}) == pytest.approx(90.0)


def _level(clients: object, throughput: float, p50: float, p99: float, **extra: object) -> dict[str, object]:
    return {"clients": clients, "throughput_per_s": throughput, "p50_s": p50, "p99_s": p99, "p99_over_p50": p99 / p50,
            "device_busy_fraction": 0.9, "gpu_sm_util_mean": None, "unwarmed_calls": 0, "requests": 768, "ok": 768,
            "rejected_503": 0, "models": [{"name": "m", "precision": "bf16"}], **extra}


def test_summarise_judges_each_promise_from_the_stages_reports(tmp_path: Path) -> None:
    lite0 = [_level("first after ready", 20, 0.05, 0.05), _level("1 (next 99)", 30, 0.03, 0.07), _level(128, 310, 0.4, 0.7)]
    gil = ["MainThread: 40% of samples; Runner.run 3.0%", "idg-worker: 35% of samples; run_call 2.0%"]
    (tmp_path / "check-service-lite0.json").write_text(json.dumps({"meta": {"gil_profile": gil}, "rows": lite0}))
    (tmp_path / "check-service-resnet101-bf16.json").write_text(json.dumps({"rows": [_level(128, 140, 0.5, 0.6)]}))
    speed = {"batch": 32, "ours_default_s_per_attr": 0.005, "ours_idg_s_per_attr": 0.011, "ours_ig_s_per_attr": 0.01,
             "captum_ig_default_s_per_attr": 0.023, "default_vs_captum_default": 4.6, "ours_idg_tflops": 180.0}
    for label in ("check-library-auto", "check-library-bf16"):
        (tmp_path / f"{label}.json").write_text(json.dumps({"meta": {"precision": "bf16"}, "speed": [speed]}))
    variants = [{"variant": v, "ms_per_attribution": ms, "setup_s": 1.0, "cosine_to_first_min": low, "cosine_to_first_mean": mean}
                for v, ms, low, mean in (("eager", 17.0, 1, 1), ("graphs", 16.9, 0.98, 0.999), ("compiled", 11.0, 0.48, 0.98),
                                         ("compiled+graphs", 11.5, 0.97, 0.995))]
    kernels = {"wall_ms_per_attribution": 18.0, "busy_ms_per_attribution": 15.5,
               "top": [{"name": "sm90_xmma_dgrad_implicit_gemm_bf16", "count": 400, "ms_per_attribution": 6.0, "share": 0.39}]}
    passes = {"calls": 25, "forward_rows": 1600, "gradient_rows": 1600, "forward_ms_per_row": 0.08, "gradient_ms_per_row": 0.24,
              "passes_ms_per_attribution": 16.0, "kernels": kernels}
    (tmp_path / "check-paper-speed.json").write_text(json.dumps({"model": "resnet101", "precision": "bf16", "images": 32,
                                                                 "rows": variants, "passes": passes}))
    tests = Stage("gpu-tests", [], 1, status="ok", output="17 passed, 30 deselected in 90s\n")
    rows, targets, figures = summarise(tmp_path, [tests], 128, 99)
    verdicts = {t.name: t.met for t in targets}
    assert verdicts["GPU tests failed"] is True
    assert verdicts["Lite0 service: attributions/s at 128 clients"] is True
    assert verdicts["Lite0 service: p99 / p50"] is True
    assert verdicts["ResNet-101 bf16 service: attributions/s at 128 clients"] is False  # 140 < 150
    head = "library, IDG-50/50 at its fastest with the reference's answers (or as near fp32's) (compiled+graphs"
    fastest = [t for t in targets if t.name.startswith(head)]
    # the fastest that answers as eager does: not eager's 17, not "compiled" (11.0 ms, but a cosine of 0.48 on one image)
    assert len(fastest) == 1 and fastest[0].met is True and fastest[0].value == 11.5
    assert "not judged, answering otherwise: compiled" in fastest[0].name
    assert verdicts["Lite0 service: first request / p50 of the next (as fast as the hundredth)"] is True
    assert figures["gpu_tests"] == {"passed": 17, "deselected": 30}
    table = render(["- GPU: none"], [tests], rows, targets, dry_run=False, total_s=1.0)
    assert "310.0 attributions/s" in table and "compiled+graphs 11.5 ms" in table
    assert "under py-spy) | MainThread: 40% of samples; idg-worker: 35% of samples |" in table
    assert "| ResNet-101 bf16 service: attributions/s at 128 clients | 140 | >= 150 | **missed** |" in table
    assert ("| library, where eager IDG-50/50's time goes | the model's passes alone 16.0 ms (gradient pass 3.00x a forward); "
            "profiled run 18.0 ms, kernels busy 15.5 ms; largest kernel 39%: `sm90_xmma_dgrad_implicit_gemm_bf16`") in table


def test_a_way_agrees_with_eager_or_is_no_further_from_fp32s_answers_than_eagers_own() -> None:
    def row(to_eager: float, to_fp32: tuple[float, float] | None) -> dict[str, object]:
        exact = {"cosine_to_fp32_min": to_fp32[0], "cosine_to_fp32_mean": to_fp32[1]} if to_fp32 else {}
        return {"cosine_to_first_min": to_eager, "cosine_to_first_mean": 0.9 if to_eager < 0.95 else 0.999, **exact}

    eager = {"variant": "eager", **row(1.0, (0.55, 0.80))}
    assert agrees(row(0.98, None), eager)  # CUDA graphs: eager's answers
    # another bf16 rounding: far from eager's (0.48) but as near the exact function's as eager's own
    assert agrees(row(0.48, (0.52, 0.80)), eager)
    # further from fp32's than eager's: on the worst image, or on average
    assert not agrees(row(0.48, (0.40, 0.80)), eager)
    assert not agrees(row(0.48, (0.60, 0.78)), eager)
    # no fp32 run (an fp32 reference itself, or an older report): eager's answers are the only test
    assert not agrees(row(0.48, None), {"variant": "eager"})
    assert not agrees(row(0.48, (0.9, 0.9)), None)


def test_a_stage_that_did_not_report_is_not_measured_never_met(tmp_path: Path) -> None:
    rows, targets, _ = summarise(tmp_path, [Stage("gpu-tests", [], 1, status="timed out", output="")], 128, 99)
    assert all(t.met is None for t in targets)
    assert any("not measured" in r for r in rows)


@pytest.mark.slow  # 3.5-6 minutes on the 2-core VM: every stage end to end
def test_the_dry_run_prints_every_figure_of_the_table(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "benchmarks/gpu_run.sh", "check", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OUT": str(tmp_path)}, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "gpu-check.md").read_text()
    for figure in ("attributions/s", "p99/p50", "unwarmed calls", "padding/real rows", "first request after ready",
                   "IDG-50/50", "Captum IG-50 at its defaults", "torch", "GPU tests", "where eager IDG-50/50's time goes"):
        assert figure in table
    if (ROOT / ".venv" / "bin" / "py-spy").exists():  # the bench extra's; the GPU's comes with the wheels
        assert "idg-worker: " in table  # where the CPU went in the profiled Lite0 level
    judged = table.split("| target |")[1].split("| stage |")[0].splitlines()
    unmeasured = [line for line in judged if "not measured" in line and not line.startswith("| GPU tests failed")]
    assert not unmeasured, unmeasured  # on a CPU no GPU test runs; every other figure is there
