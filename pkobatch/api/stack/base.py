"""What every model of the Stack API shares: strict camelCase models, bounds of numbers."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from pkobatch.api.crd_hints import FREE_FORM_OBJECT, INT64

Int64 = Annotated[int, INT64]
# Bound of every duration in seconds in the spec (365 days). Larger magnitudes overflow time
# arithmetic: Python's timedelta in the controller, Go's time.Duration in the Job controller.
MAX_SPEC_SECONDS: Final = 31_536_000
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
FreeFormObject = Annotated[dict[str, Any], FREE_FORM_OBJECT]


class ApiModel(BaseModel):
    """A pulumi.com model: strict, camelCase on the wire, no unknown fields."""

    model_config = ConfigDict(
        strict=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )

    def to_manifest(self) -> dict[str, Any]:
        """The wire form: camelCase keys, only the fields that were set, JSON types."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class OpenApiModel(ApiModel):
    """A template: pkobatch reads the typed fields; everything else is kept as given."""

    model_config = ConfigDict(extra="allow")


LooseTime = Annotated[datetime, Field(strict=False)]


def to_snake(name: str) -> str:
    """Attribute name of a wire field (``appID`` -> ``app_id``)."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()
