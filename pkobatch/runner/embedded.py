"""``pkobatch run -f stack.yaml``: a Stack manifest run on this machine, with no cluster.

It is the same runner: this module only does, on the command line, what the controller's Job
builder and the kubelet do in a cluster — turn the Stack's references into a ``RunSnapshot``
plus environment variables holding the values:

- a Secret ref ``{name, key}`` takes its value from ``--secret NAME/KEY=VALUE``, else from the
  environment variable ``PKOBATCH_SECRET_<NAME>_<KEY>`` (upper case, other characters ``_``);
- a ConfigMap ref (``configRef``) likewise from ``--configmap NAME/KEY=VALUE`` or
  ``PKOBATCH_CONFIGMAP_<NAME>_<KEY>``;
- an ``envRefs`` variable of type Secret that is already set in the environment keeps its
  value when no ``--secret`` gives one;
- ``envs``/``envSecrets`` (whole ConfigMaps/Secrets as environment) cannot be resolved without
  a cluster: export their variables instead (reported as a warning).

Everything here is pure; every value it is missing is reported at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from pkobatch.api.constants import API_VERSION, KIND, Operation
from pkobatch.api.git_transport import SETTING_ENV as INSECURE_HTTP_SETTING
from pkobatch.api.run import GitAuthEnv, RunSnapshot, StackRef, ValueFromEnv
from pkobatch.api.stack.spec import ResourceRef, StackSpec
from pkobatch.api.stack.validation import load_stack_spec

RefKey = tuple[str, str]  # (object name, key)
DEFAULT_NAMESPACE: Final = "default"


class LocalRunError(Exception):
    """The manifest cannot be run locally; the message lists every problem."""


@dataclass(frozen=True)
class LocalRun:
    snapshot: RunSnapshot
    env: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def parse_ref_values(items: Iterable[str], option: str) -> dict[RefKey, str]:
    """``NAME/KEY=VALUE`` arguments by (name, key)."""
    values: dict[RefKey, str] = {}
    for item in items:
        ref, sep, value = item.partition("=")
        name, slash, key = ref.partition("/")
        if not sep or not slash or not name or not key:
            raise LocalRunError(f"{option} {item.split('=', 1)[0]!r}: expected NAME/KEY=VALUE")
        values[(name, key)] = value
    return values


def load_stack_manifest(text: str) -> dict[str, Any]:
    """The one Stack in a YAML file (other documents are ignored)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    except yaml.YAMLError as error:
        raise LocalRunError(f"the file is not valid YAML: {error}") from None
    stacks = [d for d in documents if d.get("kind") == KIND]
    if len(stacks) != 1:
        raise LocalRunError(
            f"the file must hold exactly one {KIND} ({API_VERSION}), found {len(stacks)}"
        )
    return stacks[0]


def fallback_env_name(prefix: str, name: str, key: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", f"{prefix}_{name}_{key}".upper())


class _Resolver:
    def __init__(
        self,
        secrets: Mapping[RefKey, str],
        configmaps: Mapping[RefKey, str],
        env: Mapping[str, str],
    ) -> None:
        self.secrets = secrets
        self.configmaps = configmaps
        self.env = env
        self.missing: list[str] = []

    def secret(self, name: str, key: str, path: str, variable: str = "") -> str:
        if (name, key) in self.secrets:
            return self.secrets[(name, key)]
        fallback = fallback_env_name("PKOBATCH_SECRET", name, key)
        if fallback in self.env:
            return self.env[fallback]
        ways = [f"--secret {name}/{key}=...", f"${fallback}"] + (
            [f"${variable}"] if variable else []
        )
        self.missing.append(f"{path}: Secret {name}/{key} ({', '.join(ways[:-1])} or {ways[-1]})")
        return ""

    def configmap(self, name: str, key: str, path: str) -> str:
        if (name, key) in self.configmaps:
            return self.configmaps[(name, key)]
        fallback = fallback_env_name("PKOBATCH_CONFIGMAP", name, key)
        if fallback in self.env:
            return self.env[fallback]
        self.missing.append(
            f"{path}: ConfigMap {name}/{key} (--configmap {name}/{key}=... or ${fallback})"
        )
        return ""

    def ref(self, ref: ResourceRef, path: str, variable: str = "") -> str:
        if ref.type == "Literal" and ref.literal is not None:
            return ref.literal.value
        if ref.type == "Secret" and ref.secret is not None:
            return self.secret(ref.secret.name, ref.secret.key, path, variable)
        self.missing.append(f"{path}: a {ref.type} ref cannot be resolved")
        return ""


def _git_auth(spec: StackSpec, resolve: _Resolver, env: dict[str, str]) -> GitAuthEnv | None:
    values: dict[str, str] = {}
    auth = spec.git_auth
    if auth is not None:
        if auth.ssh_auth is not None:
            values["sshPrivateKeyEnv"] = resolve.ref(
                auth.ssh_auth.ssh_private_key, "spec.gitAuth.sshAuth.sshPrivateKey"
            )
            if auth.ssh_auth.password is not None:
                values["sshPassphraseEnv"] = resolve.ref(
                    auth.ssh_auth.password, "spec.gitAuth.sshAuth.password"
                )
        elif auth.access_token is not None:
            values["tokenEnv"] = resolve.ref(auth.access_token, "spec.gitAuth.accessToken")
        elif auth.basic_auth is not None:
            values["usernameEnv"] = resolve.ref(
                auth.basic_auth.user_name, "spec.gitAuth.basicAuth.userName"
            )
            values["passwordEnv"] = resolve.ref(
                auth.basic_auth.password, "spec.gitAuth.basicAuth.password"
            )
        else:
            resolve.missing.append(
                "spec.gitAuth: only accessToken, basicAuth and sshAuth run locally"
            )
    elif spec.git_auth_secret:
        name = spec.git_auth_secret
        given = {key for (secret, key) in resolve.secrets if secret == name}
        keys = {
            "sshPrivateKey": "sshPrivateKeyEnv",
            "password": "sshPassphraseEnv" if "sshPrivateKey" in given else "passwordEnv",
            "accessToken": "tokenEnv",
            "username": "usernameEnv",
        }
        for key in sorted(given):
            if key in keys:
                values[keys[key]] = resolve.secret(name, key, "spec.gitAuthSecret")
        if not values:
            resolve.missing.append(
                f"spec.gitAuthSecret: Secret {name} (--secret {name}/accessToken=..., or "
                f"{name}/username and {name}/password, or {name}/sshPrivateKey)"
            )
    if not values:
        return None
    names = {}
    for field_name, value in values.items():
        variable = "PKOBATCH_LOCAL_GIT_" + re.sub(r"(?<!^)(?=[A-Z])", "_", field_name[:-3]).upper()
        env[variable] = value
        names[field_name] = variable
    return GitAuthEnv.model_validate(names)


def plan_local_run(
    manifest: Mapping[str, Any],
    operation: Operation | None,
    secrets: Mapping[RefKey, str],
    configmaps: Mapping[RefKey, str],
    env: Mapping[str, str],
) -> LocalRun:
    """The snapshot and environment that run ``manifest`` here, as its Job would."""
    metadata = manifest.get("metadata") or {}
    name = str(metadata.get("name") or "")
    namespace = str(metadata.get("namespace") or DEFAULT_NAMESPACE)
    raw_spec = manifest.get("spec")
    if not name or not isinstance(raw_spec, Mapping):
        raise LocalRunError("the Stack needs metadata.name and a spec")
    check = load_stack_spec(raw_spec, namespace)
    if check.spec is None or check.problems:
        raise LocalRunError("the Stack's spec is invalid:\n  " + "\n  ".join(check.problems))
    spec = check.spec
    resolve = _Resolver(secrets, configmaps, env)
    run_env = dict(env)
    warnings: list[str] = []
    secret_env: list[str] = []

    for variable, ref in sorted((spec.env_refs or {}).items()):
        if ref.type == "Secret" and ref.secret is not None:
            secret_env.append(variable)
            if (ref.secret.name, ref.secret.key) not in secrets and variable in env:
                continue
        run_env[variable] = resolve.ref(ref, f"spec.envRefs.{variable}", variable)
    if spec.access_token_secret:
        secret_env.append("PULUMI_ACCESS_TOKEN")
        run_env["PULUMI_ACCESS_TOKEN"] = resolve.secret(
            spec.access_token_secret, "accessToken", "spec.accessTokenSecret"
        )

    config_from_env: dict[str, ValueFromEnv] = {}
    for index, (key, cm_ref) in enumerate(sorted((spec.config_ref or {}).items())):
        variable = f"PKOBATCH_LOCAL_CONFIG_{index}"
        run_env[variable] = resolve.configmap(cm_ref.name, cm_ref.key, f"spec.configRef.{key}")
        config_from_env[key] = ValueFromEnv(env=variable, json_value=bool(cm_ref.json_value))
    for index, (key, ref) in enumerate(sorted((spec.secrets_ref or {}).items())):
        if ref.type == "Literal":
            continue  # the runner reads literals from the spec
        variable = f"PKOBATCH_LOCAL_SECRET_{index}"
        run_env[variable] = resolve.ref(ref, f"spec.secretsRef.{key}")
        config_from_env[key] = ValueFromEnv(env=variable, secret=True)

    git_auth = _git_auth(spec, resolve, run_env)
    for field_name, value in (("envs", spec.envs), ("envSecrets", spec.env_secrets)):
        if value:
            warnings.append(
                f"spec.{field_name} ({', '.join(value)}) needs a cluster: export those "
                "variables in your shell"
            )
    if resolve.missing:
        raise LocalRunError(
            "values for these references are missing:\n  " + "\n  ".join(resolve.missing)
        )
    snapshot = RunSnapshot(
        operation=operation or ("preview" if spec.preview else "up"),
        stack=StackRef(name=name, namespace=namespace, uid=str(metadata.get("uid") or "")),
        job_name=f"local-{name}",
        generation=int(metadata.get("generation") or 0),
        spec=dict(check.spec.to_manifest()),
        config_from_env=config_from_env,
        git_auth=git_auth,
        secret_env=secret_env,
        # As in a cluster, credentials go over plain http:// only to hosts named here.
        insecure_http_git_hosts=[
            host.strip() for host in env.get(INSECURE_HTTP_SETTING, "").split(",") if host.strip()
        ],
    )
    return LocalRun(snapshot, run_env, warnings)
