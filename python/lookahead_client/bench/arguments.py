"""argparse types shared by the ``lookahead-bench`` commands."""

from __future__ import annotations

import argparse

__all__ = ["int_list", "ms_pair"]


def int_list(text: str) -> list[int]:
    """Comma-separated integers >= 1 (repeats dropped), e.g. ``--budget 4,8,16``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def ms_pair(text: str) -> tuple[float, float]:
    """``BASE,PER_TOKEN`` milliseconds, e.g. ``--step-ms 20,0.5``."""
    try:
        base, per_token = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BASE,PER_TOKEN in ms, got {text!r}") from None
    if base <= 0 or per_token < 0:
        raise argparse.ArgumentTypeError(f"expected BASE > 0 and PER_TOKEN >= 0, got {text!r}")
    return base, per_token
