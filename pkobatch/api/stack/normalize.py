"""The alias dialect of a Stack spec: names and shapes PKO also accepts, read as canonical.

``normalize_spec`` rewrites ``projectPath``, ``destroyOnDelete``, ``envSecrets: [{name}]``
and ``backend: {url}`` into PKO's canonical fields before model validation
(``StackSpec`` calls it), with one note per alias used, for an Event; an alias that disagrees
with its canonical field is a ``SpecAliasError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# Alias dialect: alias wire name -> canonical wire name (see normalize_spec).
SPEC_ALIASES: Final[Mapping[str, str]] = {
    "projectPath": "repoDir",
    "destroyOnDelete": "destroyOnFinalize",
}
ALIAS_FIELD_DESCRIPTIONS: Final[Mapping[str, str]] = {
    "projectPath": "Alias of repoDir (prefer repoDir).",
    "destroyOnDelete": "Alias of destroyOnFinalize (prefer destroyOnFinalize).",
}


class SpecAliasError(ValueError):
    """An alias and its canonical field disagree, or an alias has the wrong shape."""


def _alias_note(alias: str, canonical: str) -> str:
    return f"{alias} was read as {canonical}; prefer the canonical name {canonical}"


_ENV_SECRETS_NOTE: Final = (
    "spec.envSecrets entries of the form {name: <secret>} (spec.envSecrets[].name) were read "
    "as Secret names; prefer the canonical form, a list of names: spec.envSecrets: [<secret>]"
)


def _set_canonical(
    spec: dict[str, Any], alias_path: str, canonical: str, value: Any, notes: list[str]
) -> None:
    if canonical in spec and spec[canonical] is not None and spec[canonical] != value:
        raise SpecAliasError(
            f"{alias_path} is an alias of spec.{canonical}, and they disagree "
            f"({value!r} vs {spec[canonical]!r}): remove {alias_path} (spec.{canonical} is "
            "the canonical name) or give both the same value"
        )
    spec[canonical] = value
    notes.append(_alias_note(alias_path, f"spec.{canonical}"))


def normalize_spec(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Rewrite the alias dialect into canonical PKO fields.

    Returns the canonical spec (a new dict; ``raw`` is not modified) and one note per alias
    used, for an Event. Raises ``SpecAliasError`` when an alias conflicts with its canonical
    field or has a shape pkobatch cannot read.
    """
    spec = dict(raw)
    notes: list[str] = []
    for alias, canonical in SPEC_ALIASES.items():
        if alias in spec:
            value = spec.pop(alias)
            if value is not None:
                _set_canonical(spec, f"spec.{alias}", canonical, value, notes)

    env_secrets = spec.get("envSecrets")
    if isinstance(env_secrets, list) and any(isinstance(e, Mapping) for e in env_secrets):
        names: list[Any] = []
        for index, entry in enumerate(env_secrets):
            if isinstance(entry, Mapping):
                if set(entry) != {"name"} or not isinstance(entry["name"], str):
                    raise SpecAliasError(
                        f"spec.envSecrets[{index}] must be a Secret name or {{name: <secret>}} "
                        f"with a string name and no other keys, got {dict(entry)!r}"
                    )
                names.append(entry["name"])
            else:
                names.append(entry)
        spec["envSecrets"] = names
        notes.append(_ENV_SECRETS_NOTE)

    backend = spec.get("backend")
    if isinstance(backend, Mapping):
        if set(backend) != {"url"} or not isinstance(backend["url"], str):
            raise SpecAliasError(
                "spec.backend must be a URL string or {url: <backend URL>} with no other "
                f"keys, got {dict(backend)!r}"
            )
        spec["backend"] = backend["url"]
        notes.append(_alias_note("spec.backend.url", "spec.backend"))
    return spec, notes
