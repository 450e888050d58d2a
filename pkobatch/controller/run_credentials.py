"""The run container's environment: every credential as a reference, never a value.

Secrets reach the Job only as ``secretKeyRef`` or ``envFrom.secretRef``, resolved by the
kubelet; references to the Stack's Secrets and ConfigMaps are ``optional``, so a missing one
fails the run fast with the runner's message instead of leaving the pod stuck in
``CreateContainerConfigError``. Values the Stack holds inline (``spec.secrets``, ``Literal``
refs in ``secretsRef`` and ``gitAuth``) go into the run's own Secret (``<job>-secrets``,
``InlineSecrets``), referenced like any other. ``run_environment`` also returns the names of
the variables that hold each value, for the ``RunSnapshot``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pkobatch.api.objects import JSON
from pkobatch.api.run import GitAuthEnv, ValueFromEnv
from pkobatch.api.stack.spec import ResourceRef, StackSpec
from pkobatch.controller.run_pod import JobBuildError

# Environment variables the builder fills from references (values never pass through here).
ENV_BACKEND: Final = "PULUMI_BACKEND_URL"
ENV_ACCESS_TOKEN: Final = "PULUMI_ACCESS_TOKEN"
ACCESS_TOKEN_KEY: Final = "accessToken"
ENV_CONFIG_PREFIX: Final = "PKOBATCH_CONFIG_"
ENV_SECRET_PREFIX: Final = "PKOBATCH_SECRET_"
ENV_INLINE_SECRET_PREFIX: Final = "PKOBATCH_INLINE_SECRET_"
ENV_GIT_USERNAME: Final = "PKOBATCH_GIT_USERNAME"
ENV_GIT_PASSWORD: Final = "PKOBATCH_GIT_PASSWORD"
ENV_GIT_TOKEN: Final = "PKOBATCH_GIT_TOKEN"
ENV_GIT_SSH_PRIVATE_KEY: Final = "PKOBATCH_GIT_SSH_PRIVATE_KEY"
ENV_GIT_SSH_PASSPHRASE: Final = "PKOBATCH_GIT_SSH_PASSPHRASE"
ENV_GIT_GITHUB_APP_ID: Final = "PKOBATCH_GIT_GITHUB_APP_ID"
ENV_GIT_GITHUB_APP_INSTALLATION_ID: Final = "PKOBATCH_GIT_GITHUB_APP_INSTALLATION_ID"
ENV_GIT_GITHUB_APP_PRIVATE_KEY: Final = "PKOBATCH_GIT_GITHUB_APP_PRIVATE_KEY"
# An inline secret travels in an environment variable: Linux caps one at 128 KiB.
MAX_INLINE_SECRET_BYTES: Final = 128 * 1024 - 256


def _secret_ref(name: str, key: str) -> JSON:
    return {"secretKeyRef": {"name": name, "key": key, "optional": True}}


def _ref_env(env_name: str, ref: ResourceRef, path: str) -> JSON:
    """An EnvVar for a Secret or Literal ResourceRef (other types fail validation earlier)."""
    if ref.type == "Secret" and ref.secret is not None:
        return {"name": env_name, "valueFrom": _secret_ref(ref.secret.name, ref.secret.key)}
    if ref.type == "Literal" and ref.literal is not None:
        return {"name": env_name, "value": ref.literal.value}
    raise JobBuildError(f"{path}: use type Secret (secret: {{name, key}}) or type Literal")


def run_secret_name(job: str) -> str:
    return f"{job}-secrets"


@dataclass
class InlineSecrets:
    """Secret values the Stack holds inline, on their way into the run's Secret."""

    secret_name: str
    values: dict[str, str]  # variable name -> value (the Secret's keys are variable names)

    def env(self, env_name: str, value: str, path: str) -> JSON:
        if len(value.encode("utf-8")) > MAX_INLINE_SECRET_BYTES:
            raise JobBuildError(
                f"{path}: the value is larger than {MAX_INLINE_SECRET_BYTES} bytes, more than a "
                "process environment variable can hold; put it in a file the program reads, "
                "or split it into several keys"
            )
        self.values[env_name] = value
        return {
            "name": env_name,
            "valueFrom": {"secretKeyRef": {"name": self.secret_name, "key": env_name}},
        }

    def ref_env(self, env_name: str, ref: ResourceRef, path: str) -> JSON:
        """Like ``_ref_env``, for a ref whose value is secret: a literal moves to the Secret."""
        if ref.type == "Literal" and ref.literal is not None:
            return self.env(env_name, ref.literal.value, path)
        return _ref_env(env_name, ref, path)


@dataclass
class RunEnvironment:
    env: list[JSON]
    env_from: list[JSON]
    config_from_env: dict[str, ValueFromEnv]
    secrets_from_env: dict[str, str]
    git_auth: GitAuthEnv | None


def run_environment(
    spec: StackSpec, workspace_env: list[JSON], inline: InlineSecrets
) -> RunEnvironment:
    env: list[JSON] = []
    env_from: list[JSON] = []
    explicit = {*(spec.env_refs or {}), *(str(item.get("name")) for item in workspace_env)}
    if spec.backend:
        env.append({"name": ENV_BACKEND, "value": spec.backend})
    for name in spec.envs or ():
        env_from.append({"configMapRef": {"name": name, "optional": True}})
    for name in spec.env_secrets or ():
        env_from.append({"secretRef": {"name": name, "optional": True}})
    if ENV_ACCESS_TOKEN not in explicit:
        # PKO v1 read key accessToken of these Secrets as the Pulumi access token.
        token_secrets = [*(spec.env_secrets or ())]
        if spec.access_token_secret:
            token_secrets.append(spec.access_token_secret)
        for name in token_secrets:
            env.append({"name": ENV_ACCESS_TOKEN, "valueFrom": _secret_ref(name, ACCESS_TOKEN_KEY)})
    for key, ref in sorted((spec.env_refs or {}).items()):
        env.append(_ref_env(key, ref, f"spec.envRefs.{key}"))

    config_from_env: dict[str, ValueFromEnv] = {}
    for index, (key, cm_ref) in enumerate(sorted((spec.config_ref or {}).items())):
        env_name = f"{ENV_CONFIG_PREFIX}{index}"
        env.append(
            {
                "name": env_name,
                "valueFrom": {
                    "configMapKeyRef": {"name": cm_ref.name, "key": cm_ref.key, "optional": True}
                },
            }
        )
        config_from_env[key] = ValueFromEnv(env=env_name, json_value=bool(cm_ref.json_value))
    for index, (key, ref) in enumerate(sorted((spec.secrets_ref or {}).items())):
        env_name = f"{ENV_SECRET_PREFIX}{index}"
        env.append(inline.ref_env(env_name, ref, f"spec.secretsRef.{key}"))
        config_from_env[key] = ValueFromEnv(env=env_name, secret=True)
    secrets_from_env: dict[str, str] = {}
    for index, (key, value) in enumerate(sorted((spec.secrets or {}).items())):
        env_name = f"{ENV_INLINE_SECRET_PREFIX}{index}"
        env.append(inline.env(env_name, value, f"spec.secrets.{key}"))
        secrets_from_env[key] = env_name

    git_env, git_auth = _git_auth(spec, inline)
    env.extend(git_env)
    return RunEnvironment(env, env_from, config_from_env, secrets_from_env, git_auth)


def _git_auth(spec: StackSpec, inline: InlineSecrets) -> tuple[list[JSON], GitAuthEnv | None]:
    auth = spec.git_auth
    if auth is not None:
        if auth.github_app is not None:
            app = auth.github_app
            env = [
                _ref_env(ENV_GIT_GITHUB_APP_ID, app.app_id, "githubApp.appID"),
                _ref_env(
                    ENV_GIT_GITHUB_APP_INSTALLATION_ID,
                    app.installation_id,
                    "githubApp.installationID",
                ),
                inline.ref_env(
                    ENV_GIT_GITHUB_APP_PRIVATE_KEY, app.private_key, "githubApp.privateKey"
                ),
            ]
            return env, GitAuthEnv.model_validate(
                {
                    "githubAppIDEnv": ENV_GIT_GITHUB_APP_ID,
                    "githubAppInstallationIDEnv": ENV_GIT_GITHUB_APP_INSTALLATION_ID,
                    "githubAppPrivateKeyEnv": ENV_GIT_GITHUB_APP_PRIVATE_KEY,
                }
            )
        if auth.ssh_auth is not None:
            env = [
                inline.ref_env(ENV_GIT_SSH_PRIVATE_KEY, auth.ssh_auth.ssh_private_key, "sshAuth")
            ]
            names: dict[str, str] = {"sshPrivateKeyEnv": ENV_GIT_SSH_PRIVATE_KEY}
            if auth.ssh_auth.password is not None:
                env.append(
                    inline.ref_env(ENV_GIT_SSH_PASSPHRASE, auth.ssh_auth.password, "sshAuth")
                )
                names["sshPassphraseEnv"] = ENV_GIT_SSH_PASSPHRASE
            return env, GitAuthEnv.model_validate(names)
        if auth.access_token is not None:
            env = [inline.ref_env(ENV_GIT_TOKEN, auth.access_token, "spec.gitAuth.accessToken")]
            return env, GitAuthEnv.model_validate({"tokenEnv": ENV_GIT_TOKEN})
        if auth.basic_auth is not None:
            env = [
                _ref_env(ENV_GIT_USERNAME, auth.basic_auth.user_name, "basicAuth.userName"),
                inline.ref_env(ENV_GIT_PASSWORD, auth.basic_auth.password, "basicAuth.password"),
            ]
            return env, GitAuthEnv.model_validate(
                {"usernameEnv": ENV_GIT_USERNAME, "passwordEnv": ENV_GIT_PASSWORD}
            )
        return [], None
    if spec.git_auth_secret:
        # Deprecated form: the runner picks ssh, then token, then basic by which keys exist.
        secret = spec.git_auth_secret
        env = [
            {"name": ENV_GIT_SSH_PRIVATE_KEY, "valueFrom": _secret_ref(secret, "sshPrivateKey")},
            {"name": ENV_GIT_PASSWORD, "valueFrom": _secret_ref(secret, "password")},
            {"name": ENV_GIT_TOKEN, "valueFrom": _secret_ref(secret, "accessToken")},
            {"name": ENV_GIT_USERNAME, "valueFrom": _secret_ref(secret, "username")},
        ]
        return env, GitAuthEnv.model_validate(
            {
                "sshPrivateKeyEnv": ENV_GIT_SSH_PRIVATE_KEY,
                "sshPassphraseEnv": ENV_GIT_PASSWORD,
                "tokenEnv": ENV_GIT_TOKEN,
                "usernameEnv": ENV_GIT_USERNAME,
                "passwordEnv": ENV_GIT_PASSWORD,
            }
        )
    return [], None
