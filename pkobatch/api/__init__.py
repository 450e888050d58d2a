"""The Stack API (pulumi.com/v1): models, validation, CRD generation. No I/O.

The names below load on first use (PEP 562): every import of a ``pkobatch.api`` module runs
this file first, and a run's pod (``pkobatch job run``) needs the spec but not the status
models, whose pydantic schemas take tens of milliseconds to build at every start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pkobatch.api.ignored_fields import NOOP_FIELDS, NoopField, noop_fields_in_use
    from pkobatch.api.stack.normalize import SpecAliasError, normalize_spec
    from pkobatch.api.stack.spec import StackSpec
    from pkobatch.api.stack.status import Stack, StackStatus
    from pkobatch.api.stack.validation import SpecCheck, load_stack_spec, validate_stack_spec

_MODULE_OF = {
    "NOOP_FIELDS": "pkobatch.api.ignored_fields",
    "NoopField": "pkobatch.api.ignored_fields",
    "noop_fields_in_use": "pkobatch.api.ignored_fields",
    "SpecAliasError": "pkobatch.api.stack.normalize",
    "normalize_spec": "pkobatch.api.stack.normalize",
    "StackSpec": "pkobatch.api.stack.spec",
    "Stack": "pkobatch.api.stack.status",
    "StackStatus": "pkobatch.api.stack.status",
    "SpecCheck": "pkobatch.api.stack.validation",
    "load_stack_spec": "pkobatch.api.stack.validation",
    "validate_stack_spec": "pkobatch.api.stack.validation",
}

__all__ = [
    "NOOP_FIELDS",
    "NoopField",
    "SpecAliasError",
    "SpecCheck",
    "Stack",
    "StackSpec",
    "StackStatus",
    "load_stack_spec",
    "noop_fields_in_use",
    "normalize_spec",
    "validate_stack_spec",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
