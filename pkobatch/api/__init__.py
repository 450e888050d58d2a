"""The Stack API (pulumi.com/v1): models, validation, CRD generation. No I/O."""

from pkobatch.api.ignored_fields import NOOP_FIELDS, NoopField, noop_fields_in_use
from pkobatch.api.stack.normalize import SpecAliasError, normalize_spec
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.stack.status import Stack, StackStatus
from pkobatch.api.stack.validation import SpecCheck, load_stack_spec, validate_stack_spec

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
