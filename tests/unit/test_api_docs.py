"""docs/api.md and docs/migration.md cannot drift from the models and NOOP_FIELDS."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from pkobatch.api import NOOP_FIELDS
from pkobatch.api.stack.normalize import SPEC_ALIASES
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.stack.status import StackStatus

DOCS = Path(__file__).resolve().parents[2] / "docs"


def models_under(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> None:
    seen[model.__name__] = model
    pending: list[Any] = [info.annotation for info in model.model_fields.values()]
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation.__name__ not in seen:
                models_under(annotation, seen)
        elif get_origin(annotation) is not None:  # list[...], dict[...], X | None, Annotated
            pending.extend(get_args(annotation))


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^### `(\w+)`\s*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_api_reference_documents_every_field_of_every_model() -> None:
    models: dict[str, type[BaseModel]] = {}
    models_under(StackSpec, models)
    models_under(StackStatus, models)
    assert len(models) > 25
    documented = sections((DOCS / "api.md").read_text())
    assert set(models) - set(documented) == set(), "models without a section in docs/api.md"
    for name, model in models.items():
        fields = {info.alias or field for field, info in model.model_fields.items()}
        if model is StackSpec:
            fields |= set(SPEC_ALIASES)
        missing = {f for f in fields if f"`{f}`" not in documented[name]}
        assert missing == set(), f"docs/api.md section {name} does not mention {sorted(missing)}"


def test_noop_fields_are_documented() -> None:
    migration = (DOCS / "migration.md").read_text()
    api = (DOCS / "api.md").read_text()
    for noop in NOOP_FIELDS:
        assert f"`{noop.path}`" in migration, f"docs/migration.md does not list {noop.path}"
        leaf = noop.path.rsplit(".", 1)[1]
        assert re.search(rf"`{leaf}`[^\n]*\| no-op \|", api), f"docs/api.md: {noop.path}"
