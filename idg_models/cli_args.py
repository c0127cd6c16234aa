"""Argument types and checks shared by the library's command-line tools (``idg-evaluate``, ``idg-calibrate``): each
refusal one sentence naming the option, before any model loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch


def count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (argparse names the option in its one-line error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value
    parse.__name__ = "count"  # argparse's message for a ValueError names the type; ours says more
    return parse


def device(name: str) -> torch.device:
    """``--device name`` as a device this machine has; a ``ValueError`` sentence otherwise."""
    try:
        found = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device: give cpu, cuda or cuda:N") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available here; give --device cpu")
    return found
