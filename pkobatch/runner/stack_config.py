"""The stack configuration a run sets, from the spec and the environment (pure).

Sources, applied in this order (a later source wins for the same key): ``spec.config``
(structured values allowed), ``spec.configRef``, ``spec.secrets`` (deprecated inline
secrets), ``spec.secretsRef``. Values from ConfigMaps and Secrets reach the run as
environment variables the kubelet fills; ``snapshot.configFromEnv`` maps each key to its
variable. In a Job, inline secret values (``spec.secrets``, ``Literal`` secretsRef) arrive the
same way, from the run's Secret (``snapshot.secretsFromEnv``, ``configFromEnv``): the spec in
the snapshot holds ``[secret]`` in their place. Without a mapping (``pkobatch run`` on a
workstation) the spec's own value is used.

Plain values are set with ``pulumi config set-all``, in as few calls as keep the arguments
small (``plan_config``): as ``--plaintext KEY=VALUE`` arguments when all of a call's values are
strings, which every Pulumi CLI understands, and as one ``--json`` document (strings and
structured values alike) only when one of them is structured. ``--json`` came with Pulumi CLI
v3.202.0, the version PKO requires for structured config: a run with structured config and an
older CLI fails at once with ``PulumiVersionTooLow`` (``check_cli_supports``), as PKO stalls.

A value never travels as an argument when it is secret (process listings show arguments) or
a string too large for one (Linux caps an argument at 128 KiB): ``pulumi config set
[--secret] KEY`` reads it from standard input, one call each. A structured value too large
for an argument goes the same way as its JSON text, which programs read with ``get_object``
just the same (a project that declares the key's type in ``Pulumi.yaml`` sees a string).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pkobatch.api.run import ValueFromEnv
from pkobatch.api.stack.spec import StackSpec
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


# The largest set-all argument, and the largest value sent inside one.
MAX_CONFIG_ARGUMENT_BYTES: Final = 64 * 1024
MAX_ARGUMENT_VALUE_BYTES: Final = 16 * 1024


@dataclass
class ConfigPlan:
    """How a run sets its config: ``pulumi config set-all`` calls (the arguments of each after
    ``--stack NAME``), then values one by one from stdin."""

    set_all: list[list[str]] = field(default_factory=list)
    from_stdin: list[tuple[str, ConfigItem]] = field(default_factory=list)


def plan_config(items: Mapping[str, ConfigItem]) -> ConfigPlan:
    """Split ``items`` so that no secret and no large value is a process argument."""
    plan = ConfigPlan()
    batch: dict[str, ConfigItem] = {}
    for key, item in sorted(items.items()):
        size = len(config_json({key: item}).encode("utf-8"))
        if isinstance(item.value, str) and (item.secret or size > MAX_ARGUMENT_VALUE_BYTES):
            plan.from_stdin.append((key, item))
            continue
        if size > MAX_CONFIG_ARGUMENT_BYTES:
            as_text = ConfigItem(json.dumps(item.value, separators=(",", ":")), item.secret)
            plan.from_stdin.append((key, as_text))
            continue
        if batch and len(config_json({**batch, key: item}).encode("utf-8")) > (
            MAX_CONFIG_ARGUMENT_BYTES
        ):
            plan.set_all.append(set_all_arguments(batch))
            batch = {}
        batch[key] = item
    if batch:
        plan.set_all.append(set_all_arguments(batch))
    return plan


def structured(items: Mapping[str, ConfigItem]) -> bool:
    """Whether any value is structured (an object, list, number or bool: not a string)."""
    return any(not isinstance(item.value, str) for item in items.values())


def set_all_arguments(items: Mapping[str, ConfigItem]) -> list[str]:
    """The arguments of one ``pulumi config set-all`` setting ``items``: ``--json`` only when
    a value is structured, so a CLI older than that flag can set string config."""
    if structured(items):
        return ["--json", config_json(items)]
    arguments: list[str] = []
    for key, item in sorted(items.items()):
        arguments += ["--secret" if item.secret else "--plaintext", f"{key}={item.value}"]
    return arguments


# The first Pulumi CLI with ``config set-all --json``: PKO's minimum for structured config.
JSON_CONFIG_MIN_VERSION: Final = "3.202.0"
_VERSION: Final = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")


def version_key(version: str) -> tuple[int, int, int, bool] | None:
    """A semantic version, as a key that sorts by precedence (a pre-release before its
    release; build metadata ignored); None when ``version`` is not one."""
    match = _VERSION.fullmatch(version.strip())
    if match is None:
        return None
    major, minor, patch, prerelease, _ = match.groups()
    return int(major), int(minor), int(patch), prerelease is None


# Raises the minimum above: only to prove the check with a current CLI (tests/e2e).
JSON_CONFIG_MIN_VERSION_ENV: Final = "PKOBATCH_JSON_CONFIG_MIN_PULUMI_VERSION"


def check_cli_supports(
    items: Mapping[str, ConfigItem], cli_version: str, env: Mapping[str, str]
) -> None:
    """Fail with PKO's reason when ``items`` has structured config and the run's Pulumi CLI
    (which printed ``cli_version``) is older than the minimum: it cannot set it."""
    if not structured(items):
        return
    minimum = env.get(JSON_CONFIG_MIN_VERSION_ENV) or JSON_CONFIG_MIN_VERSION
    current, required = version_key(cli_version), version_key(minimum)
    if required is None:
        raise RunFailure(
            "InvalidSpec",
            f"{JSON_CONFIG_MIN_VERSION_ENV} is {minimum!r}, not a version like 3.202.0; fix "
            "or remove it",
        )
    minimum = minimum.removeprefix("v")
    if current is None:
        raise RunFailure(
            "PulumiVersionTooLow",
            f"cannot parse the Pulumi CLI version {cli_version.strip()!r}; structured config "
            f"requires >= v{minimum}",
        )
    if current < required:
        raise RunFailure(
            "PulumiVersionTooLow",
            f"Pulumi CLI version v{cli_version.strip().removeprefix('v')} does not support "
            f"JSON configuration, require >= v{minimum}: use an image with a newer Pulumi CLI "
            "(spec.workspaceTemplate.spec.image), or make every config value a string",
        )


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
