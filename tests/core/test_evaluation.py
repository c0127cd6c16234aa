"""The evaluation command end to end on a tiny model: report files, and resuming from the cache."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from PIL import Image

from idg_core.metrics.curves import mean_ci
from idg_evaluation import EvalConfig, evaluate_folder, write_report
from tests.models import tiny_classifier


def _images(folder: Path) -> list[Path]:
    paths = []
    for i, wnid in enumerate(("n01440764", "n01580077", "n02017213")):
        img = Image.new("RGB", (40, 36), (60 * i, 200 - 50 * i, 90))
        for j in range(30):
            img.putpixel((j, (j * 7) % 36), (255, 255 - 80 * i, 0))
        path = folder / f"{wnid}_sample{i}.png"
        img.save(path)
        paths.append(path)
    return paths


def test_evaluation_writes_the_report_and_resumes(tmp_path: Path) -> None:
    model = tiny_classifier()
    cfg = EvalConfig(model="tiny", methods={"IG": ("ig", {"steps": 4, "rule": "uniform"}), "IDG": ("idg", {"steps": 4, "probe_steps": 4}),
                                            "GIG": ("guided_ig", {"steps": 3})},
                     rise_step=128, pic_min_confidence=0.0, batch_size=16)
    images = _images(tmp_path)
    records = evaluate_folder(model, images, tmp_path / "out", cfg, workers=0, progress=False)
    assert [r["image"] for r in records] == [p.name for p in images]
    assert all(set(r["methods"]) == {"IG", "IDG", "GIG"} for r in records)
    first = records[0]["methods"]["IDG"]
    assert len(first["insertion_curve"]) == 32 * 32 // 128 + 1 and 0 <= first["insertion"] <= 1
    assert records[0]["label"] == 0 and len(records[0]["idg_curve"]["alphas"]) == 4

    model.net.calls.clear()
    again = evaluate_folder(model, images, tmp_path / "out", cfg, workers=0, progress=False)
    assert model.net.calls == [] and again == records  # everything came from the cache

    summary = write_report(records, tmp_path / "report", machine="test", date="today", model="tiny", total_images=3)
    text = summary.read_text()
    assert "Top-1 of the model on these images: " in text
    assert "3 of 3 images" in text and "| insertion ↑ |" in text and "Rank of IDG" in text
    with (tmp_path / "report" / "per_image.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 3 * 3
    assert (tmp_path / "report" / "curves.png").stat().st_size > 0 and (tmp_path / "report" / "idg_curves.png").is_file()


def test_a_cache_scored_before_saliency_summed_magnitudes_is_not_read_back(tmp_path: Path) -> None:
    """Until 2026-11-27 pixels were ranked by |sum of a| and the cache key had no saliency field: a run today must not
    take those scores for the defined ranking's. Its record, planted under the old key, is not read; this run's is."""
    import hashlib
    import json
    from dataclasses import asdict

    model = tiny_classifier()
    cfg = EvalConfig(model="tiny", methods={"IDG": ("idg", {"steps": 4, "probe_steps": 4})}, rise_step=128,
                     pic_min_confidence=0.0, batch_size=16, metrics=("insertion", "deletion"))
    images = _images(tmp_path)[:1]
    old = {k: v for k, v in asdict(cfg).items() if k not in ("fold_bn", "channels_last", "precision")}
    old["baseline"] = "model_mean"  # the key as EvalConfig.key made it for fp32 without the CPU settings
    old_key = hashlib.sha1(json.dumps(old, sort_keys=True).encode()).hexdigest()[:10]
    assert old_key != cfg.key()
    stale = tmp_path / "out" / "cache" / old_key
    stale.mkdir(parents=True)
    (stale / f"{images[0].stem}.json").write_text(json.dumps({"image": images[0].name, "methods": {"IDG": {"insertion": -1.0}}}))
    records = evaluate_folder(model, images, tmp_path / "out", cfg, workers=0, progress=False)
    assert records[0]["methods"]["IDG"]["insertion"] >= 0 and model.net.calls


def test_mean_ci_of_known_values() -> None:
    mean, half, n = mean_ci([1.0, 2.0, 3.0, None])  # type: ignore[list-item]
    assert (mean, n) == (2.0, 3) and abs(half - 1.96 * 1.0 / 3**0.5) < 1e-12


def test_paired_differences_favour_the_better_method_with_the_right_sign() -> None:
    from idg_evaluation.report import _paired

    def rec(i: int) -> dict:
        base = {"insertion": 0.5 + 0.01 * i, "deletion": 0.2 + 0.01 * i, "sic": None, "aic": 0.3}
        better = {**base, "insertion": base["insertion"] + 0.1, "deletion": base["deletion"] - 0.05, "aic": 0.3 + (0.1 if i % 2 else -0.1)}
        return {"methods": {"IG": base, "IDG": better}}

    lines = _paired([rec(i) for i in range(10)], ["IG", "IDG"])
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in lines[2:]}
    assert rows["insertion"].startswith("**+0.100 ± 0.000**") and "wins 10/10" in rows["insertion"]
    assert rows["deletion"].startswith("**+0.050 ± 0.000**") and "wins 10/10" in rows["deletion"]  # lower deletion is better
    assert rows["sic"] == "n/a"
    assert rows["aic"].startswith("+0.000") and "wins 5/10" in rows["aic"] and "**" not in rows["aic"]


def test_a_variant_run_pairs_with_an_earlier_runs_scores_by_image(tmp_path: Path) -> None:
    """``--pair-with``: IDG and AGI scored once; a later run of a post-step is paired with them image by image."""
    from idg_evaluation.report import merge_earlier

    model = tiny_classifier()
    images = _images(tmp_path)
    kw = {"rise_step": 128, "pic_min_confidence": 0.0, "batch_size": 16}
    first = evaluate_folder(model, images, tmp_path / "a", EvalConfig(model="tiny", methods={
        "IDG": ("idg", {"steps": 4, "probe_steps": 4}), "AGI": ("agi", {"epsilon": 0.05, "max_iter": 3, "seed": 0})}, **kw),
        workers=0, progress=False)
    write_report(first, tmp_path / "a", machine="test", date="today", model="tiny", total_images=3)
    later = evaluate_folder(model, images, tmp_path / "b", EvalConfig(model="tiny", methods={
        "IDG+IDGI": ("idg", {"steps": 4, "probe_steps": 4, "postprocess": "idgi"})}, **kw), workers=0, progress=False)
    added = merge_earlier(later, tmp_path / "a" / "per_image.csv")
    assert added == ["IDG", "AGI"]
    for old, new in zip(first, later, strict=True):  # the earlier scores, to the CSV's 5 decimals
        assert abs(new["methods"]["IDG"]["insertion"] - old["methods"]["IDG"]["insertion"]) < 1e-5
    text = write_report(later, tmp_path / "b", machine="test", date="today", model="tiny", total_images=3,
                        earlier=(tmp_path / "a" / "per_image.csv", added)).read_text()
    assert "| metric | IDG+IDGI vs IDG | IDG+IDGI vs AGI |" in text and "IDG, AGI: per-image scores of an earlier run" in text
    other_prediction = {**later[0], "pred": later[0]["pred"] + 1, "methods": {}}
    with pytest.raises(ValueError, match="not the same model"):
        merge_earlier([other_prediction], tmp_path / "a" / "per_image.csv")


def test_the_evaluation_command_takes_a_users_own_model(tmp_path: Path) -> None:
    """`python -m idg_evaluation --model NAME=SOURCE --models-file F`: a 10-class TorchScript CNN, scored on
    its own predictions; the photos' WNIDs name ImageNet classes, not its, so no accuracy is claimed."""
    from idg_evaluation.__main__ import main
    from tests.models import tiny_model_maker

    entry = tiny_model_maker().MAKERS["torchscript"](tmp_path)
    folder = tmp_path / "images"
    folder.mkdir()
    _images(folder)
    out = tmp_path / "out"
    argv = ["--images", str(folder), "--out", str(out), "--model", entry, "--models-file", str(tmp_path / "models.toml"),
            "--device", "cpu", "--methods", "IG", "IDG", "--no-ablation", "--rise-step", "576", "--workers", "0"]
    assert main(argv) == 0
    with (out / "per_image.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["image"] for r in rows} == {p.name for p in folder.iterdir()} and all(r["label"] == "" for r in rows)
    assert all(0 <= int(r["pred"]) < 10 for r in rows)
    summary = (out / "summary.md").read_text()
    assert {r["method"] for r in rows} == {"IG", "IDG"} and entry in summary and "Top-1 not known" in summary


def test_rows_are_named_or_composed_of_a_method_and_its_post_steps() -> None:
    from idg_evaluation.runner import parse_row

    assert parse_row("IDG+IDGI+SmoothGrad") == ("idg", {"steps": 50, "probe_steps": 50, "postprocess": "idgi",
                                                        "smooth_samples": 10, "smooth_std": 0.15})
    assert parse_row("idg@fast+Blur:blur_sigma=2.5") == ("idg", {"probe_steps": 8, "steps": 16, "blur_sigma": 2.5})
    for bad, words in (("IDG+Sharpen", "unknown post-step"), ("shap", "neither a row"), ("IDG:steps", "not key=value")):
        with pytest.raises(ValueError, match=words):
            parse_row(bad)


@pytest.mark.slow
def test_the_summary_ranks_every_row_with_road_and_diffid(tmp_path: Path) -> None:
    """`--methods IDG IDG+IDGI+SmoothGrad:... eg:samples=3 LA:...`: composed rows run beside the named ones, and
    the summary ranks every row on the four metrics, DiffID and ROAD."""
    from idg_evaluation.__main__ import main

    folder = tmp_path / "images"
    folder.mkdir()
    _images(folder)
    out = tmp_path / "out"
    rows = ["IDG:steps=4,probe_steps=4", "IDG+IDGI+SmoothGrad:steps=4,probe_steps=4,smooth_samples=2", "eg:samples=3",
            "LA:max_iter=2,classes=2", "AGI:max_iter=2"]
    argv = ["--images", str(folder), "--out", str(out), "--model", "tiny-test", "--device", "cpu", "--methods", *rows,
            "--rise-step", "256", "--workers", "0", "--pic-min-confidence", "0"]
    import idg_evaluation.__main__ as cli

    original = cli.load_entry
    cli.load_entry = lambda *a, **k: tiny_classifier()  # type: ignore[assignment]
    try:
        assert main(argv) == 0
    finally:
        cli.load_entry = original
    summary = (out / "summary.md").read_text()
    for metric in ("insertion ↑", "deletion ↓", "sic ↑", "aic ↑", "diffid ↑", "road_morf ↓", "road_lerf ↑"):
        assert f"| {metric} |" in summary
    assert "### Ranks (1 = best mean)" in summary and all(f"| {r} |" in summary for r in rows)


def test_shards_share_one_cache_and_cache_what_one_run_would(tmp_path: Path) -> None:
    """Two processes each take every other image into one cache folder: each computes only its own
    images, a report meanwhile reads what is cached and computes nothing, and the records (ROAD's noise
    and PIC's mask are seeded by an image's position in the whole list) equal one unsharded run's; a run
    without a shard then reads all from the cache."""
    from idg_evaluation.runner import WITH_ROAD

    model = tiny_classifier()
    cfg = EvalConfig(model="tiny", methods={"IDG": ("idg", {"steps": 4, "probe_steps": 4})}, rise_step=128,
                     pic_min_confidence=0.0, batch_size=16, metrics=WITH_ROAD)
    images = _images(tmp_path)
    odd = evaluate_folder(model, images, tmp_path / "sharded", cfg, workers=0, progress=False, shard=(1, 2))
    assert [r["image"] for r in odd] == [images[1].name]
    model.net.calls.clear()
    so_far = evaluate_folder(model, images, tmp_path / "sharded", cfg, workers=0, progress=False, compute=False)
    assert so_far == odd and model.net.calls == []  # a report of the run so far evaluates nothing
    even = evaluate_folder(model, images, tmp_path / "sharded", cfg, workers=0, progress=False, shard=(0, 2))
    assert [r["image"] for r in even] == [images[0].name, images[2].name]
    model.net.calls.clear()
    merged = evaluate_folder(model, images, tmp_path / "sharded", cfg, workers=0, progress=False)
    assert model.net.calls == []  # every image came from the shards' cache
    whole = evaluate_folder(model, images, tmp_path / "whole", cfg, workers=0, progress=False)
    for a, b in zip(merged, whole, strict=True):
        a.pop("seconds"), b.pop("seconds")
        assert a == b
    with pytest.raises(ValueError, match="shard"):
        evaluate_folder(model, images, tmp_path / "bad", cfg, workers=0, progress=False, shard=(2, 2))


def test_the_quality_rule_takes_the_row_first_on_most_within_budget_and_ahead_of_agi() -> None:
    """AGI costs at most 40 passes, so the budget is 400. B is first everywhere but costs 1000; C is first
    on three but behind AGI on deletion; A (within budget, ahead of AGI on all four, first on SIC and AIC)
    is chosen, and the report says how far it trails on insertion and deletion."""
    from idg_evaluation.report import _table, preset_choice

    def row(ins: float, dele: float, sic: float, aic: float, passes: int) -> dict[str, float | int | None]:
        return {"insertion": ins, "deletion": dele, "sic": sic, "aic": aic, "forward_passes": passes, "backward_passes": passes}

    records = [{"methods": {"AGI": row(0.40 + e, 0.20, 0.40, 0.40, 40 - 20 * i), "A": row(0.45 + e, 0.18, 0.50 + e, 0.50, 384),
                            "B": row(0.50 + e, 0.10, 0.40, 0.45, 1000), "C": row(0.48 + e, 0.21, 0.45, 0.45, 96)}}
               for i, e in enumerate((0.0, 0.01, 0.02))]
    names = ["AGI", "A", "B", "C"]
    ranks = _table(records, names)[1]
    assert ranks["sic"][0] == "A" and ranks["insertion"][0] == "B"
    chosen, lines = preset_choice(records, names, ranks)
    text = "\n".join(lines)
    assert chosen == "A"
    assert "(400 forward passes)" in text and "| B | 1000 (1000) | no |" in text
    assert "first on sic, aic; insertion: behind B by 0.050" in text and "deletion: behind B by 0.080" in text
    assert preset_choice(records, ["AGI", "B", "C"], _table(records, ["AGI", "B", "C"])[1])[0] is None
