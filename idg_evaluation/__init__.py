"""Evaluate methods x metrics over a folder of images: ``python -m idg_evaluation --help``."""

from idg_evaluation.report import write_report
from idg_evaluation.runner import ABLATION, MAIN_METHODS, EvalConfig, evaluate_folder

__all__ = ["ABLATION", "MAIN_METHODS", "EvalConfig", "evaluate_folder", "write_report"]
