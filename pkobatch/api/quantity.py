"""Kubernetes resource quantities (``256Mi``, ``1G``, ``10Gi``) as bytes: what the controller
reads from its settings and the node agent from a pod's limits."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

_SUFFIXES: Final[dict[str, int]] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY: Final = re.compile(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)(|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)")


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity (``256Mi``, ``1G``, ``1.5Gi``, ``128974848``), rounded
    up as the kubelet does; ValueError for anything else."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation as exc:
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from exc
    return int(number.to_integral_value(rounding="ROUND_CEILING"))
