"""The stack configuration a run sets, from the spec and the environment (pure).

Sources, applied in this order (a later source wins for the same key): ``spec.config``
(structured values allowed), ``spec.configRef``, ``spec.secrets`` (deprecated inline
secrets), ``spec.secretsRef``. Values from ConfigMaps and Secrets reach the run as
environment variables the kubelet fills; ``snapshot.configFromEnv`` maps each key to its
variable. In a Job, inline secret values (``spec.secrets``, ``Literal`` secretsRef) arrive the
same way, from the run's Secret (``snapshot.secretsFromEnv``, ``configFromEnv``): the spec in
the snapshot holds ``[secret]`` in their place. Without a mapping (``pkobatch run`` on a
workstation) the spec's own value is used.

Everything is set in one ``pulumi config set-all --json`` call, which takes strings and
structured values alike and encrypts the secret ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pkobatch.api.run import ValueFromEnv
from pkobatch.api.stack import StackSpec
from pkobatch.runner.failures import RunFailure


@dataclass(frozen=True)
class ConfigItem:
    value: Any  # a string, or a structured value (object, list, number, bool)
    secret: bool


def _from_env(
    key: str, source: ValueFromEnv, env: Mapping[str, str], origin: str, holder: str
) -> ConfigItem:
    """The value of config ``key`` from variable ``source.env``, which the kubelet filled
    from ``holder`` (e.g. "ConfigMap app/motd") — or left unset: the reference is optional."""
    if source.env not in env:
        raise RunFailure(
            "InvalidSpec",
            f"{origin}.{key}: {holder} does not exist (the run found no value in its "
            f"environment variable {source.env}); create it, or remove {origin}.{key}",
        )
    raw = env[source.env]
    if not source.json_value:
        return ConfigItem(raw, source.secret)
    try:
        return ConfigItem(json.loads(raw), source.secret)
    except json.JSONDecodeError as error:
        raise RunFailure(
            "InvalidSpec",
            f"{origin}.{key}: the value of {holder} is not valid JSON ({error.msg} at "
            f"position {error.pos}); fix it or remove json: true",
        ) from None


def _missing_mapping(origin: str, key: str) -> RunFailure:
    return RunFailure(
        "InvalidSpec",
        f"{origin}.{key}: the run's snapshot names no environment variable for it "
        "(snapshot.configFromEnv): the Job was not built by this pkobatch version; run again",
    )


def collect_config(
    spec: StackSpec,
    config_from_env: Mapping[str, ValueFromEnv],
    env: Mapping[str, str],
    secrets_from_env: Mapping[str, str] | None = None,
) -> dict[str, ConfigItem]:
    """Every config value the run sets, by key."""
    items: dict[str, ConfigItem] = {}
    for key, value in (spec.config or {}).items():
        items[key] = ConfigItem(value, secret=False)
    for key, cm_ref in sorted((spec.config_ref or {}).items()):
        source = config_from_env.get(key)
        if source is None:
            raise _missing_mapping("spec.configRef", key)
        holder = f"key {cm_ref.key} of ConfigMap {cm_ref.name}"
        items[key] = _from_env(key, source, env, "spec.configRef", holder)
    for key, value in (spec.secrets or {}).items():
        variable = (secrets_from_env or {}).get(key)
        if variable is None:
            items[key] = ConfigItem(value, secret=True)
            continue
        source = ValueFromEnv(env=variable, secret=True)
        items[key] = _from_env(key, source, env, "spec.secrets", "the run's Secret")
    for key, ref in sorted((spec.secrets_ref or {}).items()):
        source = config_from_env.get(key)
        if source is None and ref.type == "Literal" and ref.literal is not None:
            items[key] = ConfigItem(ref.literal.value, secret=True)
            continue
        if source is None or (ref.secret is None and ref.literal is None):
            raise _missing_mapping("spec.secretsRef", key)
        holder = (
            f"key {ref.secret.key} of Secret {ref.secret.name}"
            if ref.secret is not None
            else "the run's Secret"
        )
        secret_source = source.model_copy(update={"secret": True})
        items[key] = _from_env(key, secret_source, env, "spec.secretsRef", holder)
    return items


def config_json(items: Mapping[str, ConfigItem]) -> str:
    """The argument of ``pulumi config set-all --json`` (the format of ``pulumi config
    --json``): a string as ``value``; anything else also as ``objectValue``."""
    document: dict[str, dict[str, Any]] = {}
    for key, item in sorted(items.items()):
        entry: dict[str, Any] = {"secret": item.secret}
        if isinstance(item.value, str):
            entry["value"] = item.value
        else:
            entry["value"] = json.dumps(item.value, separators=(",", ":"))
            entry["objectValue"] = item.value
        document[key] = entry
    return json.dumps(document, separators=(",", ":"))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif value is not None:
        yield json.dumps(value)


def secret_values(items: Mapping[str, ConfigItem]) -> list[str]:
    """The plaintexts of the secret config values (what the redactor must look for)."""
    values: list[str] = []
    for item in items.values():
        if item.secret:
            values.extend(_strings(item.value))
            if not isinstance(item.value, str):
                values.append(json.dumps(item.value, separators=(",", ":")))
    return values
