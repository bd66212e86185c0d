"""Argument types shared by the command-line entry points (`cli`, `python -m keras_transformer.arrays`,
`python -m keras_transformer.distillation`). Standard library only.

Example:

>>> integer_at_least(1)("3"), number_at_least(0)("0.6")
(3, 0.6)
"""

import argparse
import math


def integer_at_least(minimum):
    """An argparse type: an integer of at least `minimum`, refused by name otherwise (exit status 2)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def number_at_least(minimum):
    """An argparse type: a finite number of at least `minimum` (nan and inf refused), refused by name otherwise."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value:g}")
        return value
    parse.__name__ = "number"
    return parse


_POSITIVE, _NON_NEGATIVE = integer_at_least(1), integer_at_least(0)
