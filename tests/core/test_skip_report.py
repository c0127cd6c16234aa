"""The evaluation report groups PIC's skipped images by the rule's name and the value it carries,
not by re-reading numbers out of the sentence."""

from __future__ import annotations

from idg_core.metrics import SKIP_RULES
from idg_evaluation.report import _skip_lines


def _record(image: str, skipped: dict[str, object]) -> dict[str, object]:
    return {"image": image, "methods": {"IDG": {"sic_skipped": None, "aic_skipped": None, **skipped}}}


def test_skips_group_by_rule_with_the_values_from_the_field() -> None:
    records = [
        # the sentence's number (0.99) is not the value: the report must read ``sic_skip_value``
        _record("n1_jay.JPEG",
                {"sic_skipped": "the original prediction 0.99 is below 0.5", "sic_skip_rule": "low_confidence", "sic_skip_value": 0.31}),
        _record("n2_owl.JPEG", {"sic_skipped": "anything", "sic_skip_rule": "low_confidence", "sic_skip_value": 0.12}),
        _record("n3_cat.JPEG",
                {"sic_skipped": SKIP_RULES["blurred_information"], "sic_skip_rule": "blurred_information", "sic_skip_value": None}),
        _record("n4_dog.JPEG", {}),
    ]
    lines = _skip_lines(records)
    assert lines == [
        f"- SIC, 2 images: {SKIP_RULES['low_confidence']} (from 0.12 to 0.31): jay, owl",
        f"- SIC, 1 images: {SKIP_RULES['blurred_information']}: cat",
    ]


def test_records_written_before_rules_group_by_their_sentence() -> None:
    old = [_record("n1_jay.JPEG", {"aic_skipped": "some older sentence 0.40"})]
    assert _skip_lines(old) == ["- AIC, 1 images: some older sentence 0.40: jay"]
    assert _skip_lines([_record("n1_jay.JPEG", {})]) == ["- none"]
