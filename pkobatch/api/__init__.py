"""The Stack API (pulumi.com/v1): models, validation, CRD generation. No I/O."""

from pkobatch.api.noop import NOOP_FIELDS, NoopField, noop_fields_in_use
from pkobatch.api.stack import (
    SpecAliasError,
    SpecCheck,
    Stack,
    StackSpec,
    StackStatus,
    load_stack_spec,
    normalize_spec,
    validate_stack_spec,
)

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
