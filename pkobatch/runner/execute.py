"""One run, start to finish: source -> program -> stack -> config -> operation -> result.

``execute`` never raises: whatever happens becomes a ``RunResult`` (state ``failed`` with a
reason from the closed set and a scrubbed, bounded message). It reads no Kubernetes object;
everything comes from the snapshot and the environment it is given. Writing the result
is the caller's job (``pkobatch.runner.report`` in a Job, the terminal for ``pkobatch run``).

Operations:

- ``up``, ``preview``, ``refresh``, ``destroy`` with the spec's ``refresh`` and
  ``runProgram``, ``targets`` and ``targetDependents`` (``up`` and ``preview`` only, as in
  PKO: a destroy is never partial), and ``updateTemplate.spec`` overrides (parallel, message,
  expectNoChanges, continueOnError, replace, target, targetDependents, refresh, runProgram,
  remove).
- ``unlock`` selects the stack (never creates it) and runs ``pulumi cancel --yes``, which
  releases its lock; it runs no program and sets no config.
- A drift check (``snapshot.driftCheck``) is ``pulumi refresh --preview-only``: it changes
  nothing and reports the number of resources that differ in ``driftedResources``.
- ``spec.exportOutputs``: after a successful ``up`` the outputs go to a ConfigMap and a
  Secret, after a successful destroy those are deleted (``pkobatch.runner.exports``; the
  caller gives the ``OutputsSink``, none for ``pkobatch run``, which then only says so).
- ``destroy`` of a stack that does not exist succeeds with nothing to do. When the source is
  gone (``SourceUnavailable``) and the snapshot carries the project's name and runtime, a
  destroy without ``runProgram`` runs from the backend's state with a minimal Pulumi.yaml.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pkobatch.api.constants import FailedStep, ResultReason
from pkobatch.api.messages import bound_message
from pkobatch.api.run import (
    CACHE_DIR_ENV,
    PlannedStep,
    ProjectInfo,
    RunResult,
    RunSnapshot,
    plan_id,
)
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.stack.validation import load_stack_spec
from pkobatch.runner import git, locks
from pkobatch.runner.cancel import Cancellation
from pkobatch.runner.dynamic_env import read_dynamic_env
from pkobatch.runner.exports import (
    ExportFailed,
    OutputsSink,
    export_objects,
    export_targets,
    hidden_values,
    plan_export,
)
from pkobatch.runner.failures import RunFailure, command_output, pulumi_command_failure, stopping_at
from pkobatch.runner.memory import ContainerMemory, out_of_memory_failure
from pkobatch.runner.plans import (
    PlanStore,
    encryption_from_secret,
    load_plan,
    plan_from_secret,
    plan_secret,
    planned_steps,
)
from pkobatch.runner.pulumi_start import PulumiStart
from pkobatch.runner.redact import PASSPHRASE_FILE_ENV, PULUMI_SECRET_ENV, secret_output_keys
from pkobatch.runner.result import bound_result, count_drift, find_permalink, normalize_changes
from pkobatch.runner.rights import AccessReview, check_rights, needed_rights
from pkobatch.runner.run_cache import CacheFull, RunCache, cache_settings, is_disk_full
from pkobatch.runner.run_log import RunLog, scrubbed_output
from pkobatch.runner.runtimes import (
    INSTALL_ARGS,
    INSTALL_TIMEOUT_SECONDS,
    ProgramHost,
    cache_environment,
    choose_program_host,
    is_frozen,
    pulumi_home,
    search_path,
)
from pkobatch.runner.stack_config import (
    ConfigItem,
    check_cli_supports,
    collect_config,
    plan_config,
    secret_values,
)
from pkobatch.runner.workspace import (
    Project,
    cache_dir_from,
    copy_program,
    load_project,
    prepare_python_program,
    write_state_only_project,
)

if TYPE_CHECKING:
    # The Automation API loads on a thread while the source is fetched (pulumi_start); the
    # functions that run after that import it where they use it.
    from pulumi.automation import CommandError, Stack

    from pkobatch.runner.pulumi_cli import RunnerPulumiCommand, RunnerWorkspace

# Backends that are not Pulumi Cloud, and so cannot resolve ESC environments.
DIY_BACKEND_SCHEMES: Final = ("file://", "s3://", "gs://", "azblob://", "postgres://")
UNLOCK_TIMEOUT_SECONDS: Final = 30.0


@dataclass
class OperationOutput:
    """What a successful operation produced."""

    changes: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    secret_outputs: list[str] = field(default_factory=list)
    drifted: int | None = None
    permalink: str = ""
    message: str = ""
    plan_id: str = ""
    planned: list[PlannedStep] = field(default_factory=list)
    planned_count: int = 0


def secret_env_names(snapshot: RunSnapshot, spec: StackSpec) -> list[str]:
    """Environment variables whose values are secret: those the snapshot names, envRefs of
    type Secret, workspaceTemplate env from a secretKeyRef, and Pulumi's credentials."""
    names = [*snapshot.secret_env, *PULUMI_SECRET_ENV]
    names += [name for name, ref in (spec.env_refs or {}).items() if ref.type == "Secret"]
    template = spec.workspace_template.spec if spec.workspace_template else None
    for item in (template.env if template else None) or []:
        if "secretKeyRef" in (item.get("valueFrom") or {}):
            names.append(str(item.get("name")))
    return names


def known_secrets(
    snapshot: RunSnapshot,
    spec: StackSpec,
    env: Mapping[str, str],
    config: Mapping[str, ConfigItem],
    credentials: git.GitCredentials | None,
    dynamic_env: Mapping[str, str],
) -> list[str | None]:
    """Every secret value a run knows before it starts (None: not given): git credentials,
    secret config values (secretsRef, inline secrets), the secret variables
    (``secret_env_names``: envRefs of type Secret, Pulumi's passphrase and token, ...), the
    passphrase file's content and every value of the dynamic environment (``$PULUMI_ENV``)."""
    return [
        *(credentials.secrets() if credentials else []),
        *secret_values(config),
        *(env.get(name) for name in secret_env_names(snapshot, spec)),
        _passphrase_from_file({**env, **dynamic_env}),
        *dynamic_env.values(),
    ]


def _passphrase_from_file(env: Mapping[str, str]) -> str | None:
    """The passphrase Pulumi reads from ``$PULUMI_CONFIG_PASSPHRASE_FILE``, if any."""
    path = env.get(PASSPHRASE_FILE_ENV)
    if not path:
        return None
    try:
        return Path(path).read_text(errors="surrogateescape")
    except OSError:
        return None  # Pulumi fails on it too, and says so


def runner_only_env_names(snapshot: RunSnapshot) -> set[str]:
    """Variables only the runner reads — git credentials and config values, which it passes
    on in its own way — so neither Pulumi nor the program gets them."""
    auth = snapshot.git_auth
    names = {source.env for source in snapshot.config_from_env.values()}
    names |= set(snapshot.secrets_from_env.values())
    if auth is not None:
        names |= {n for n in auth.model_dump().values() if n}
    return names


@dataclass
class _Run:
    snapshot: RunSnapshot
    env: Mapping[str, str]
    log: RunLog
    cancellation: Cancellation
    started: datetime
    # The environment of git, pip, Pulumi: without what only the runner needs.
    process_env: Mapping[str, str] = field(default_factory=dict)
    commit: str = ""
    project_info: ProjectInfo | None = None
    pulumi_version: str = ""
    language_host: str = ""
    notes: list[str] = field(default_factory=list)
    cleared_locks: list[str] = field(default_factory=list)
    # Where spec.exportOutputs go; None when there is no cluster (``pkobatch run``).
    outputs_sink: OutputsSink | None = None
    # Where saved plans go (spec.approval); None when there is no cluster.
    plan_store: PlanStore | None = None
    # Asks the API server for the rights the spec's features need; None without a cluster.
    access_review: AccessReview | None = None
    # The run's private directory (checkout, credential helpers, plan files).
    private: Path | None = None
    # The approved plan's file, for ``up --plan`` (spec.approval).
    plan_file: str | None = None


def execute(
    snapshot: RunSnapshot,
    env: Mapping[str, str],
    log: RunLog,
    cancellation: Cancellation,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    outputs_sink: OutputsSink | None = None,
    plan_store: PlanStore | None = None,
    access_review: AccessReview | None = None,
    memory: ContainerMemory | None = None,
) -> RunResult:
    """Run the snapshot's operation; the result is bounded and holds no secret value.
    With ``memory`` (the container's cgroup), a failure after an out-of-memory kill in the
    container is ``OOMKilled`` (``pkobatch.runner.memory``)."""
    kills_at_start = memory.oom_kills() if memory is not None else 0
    run = _Run(
        snapshot,
        env,
        log,
        cancellation,
        started=now(),
        outputs_sink=outputs_sink,
        plan_store=plan_store,
        access_review=access_review,
    )
    reason: ResultReason = "Succeeded"
    failed_step: FailedStep | None = None
    outcome = OperationOutput()
    message = ""
    cwd = os.getcwd()
    try:
        with scrubbed_output(log.redactor):
            outcome = _execute(run)
        message = "\n".join([*run.notes, outcome.message]).strip()
    except RunFailure as failure:
        reason, message, failed_step = failure.reason, failure.message, failure.step
    except Exception as error:
        command_failure = pulumi_command_failure(error)
        if command_failure is not None:
            reason, message = command_failure.reason, command_failure.message
        else:  # a bug: still report it, never die without a result
            log.step("internal error:\n" + traceback.format_exc())
            reason, message = "JobFailed", f"internal runner error: {type(error).__name__}: {error}"
    finally:
        with contextlib.suppress(OSError):
            os.chdir(cwd)
    if reason != "Succeeded" and cancellation.requested:
        stopped = cancellation.failure()
        reason, message = stopped.reason, f"{stopped.message}\n{message}".strip()
        failed_step = None
    elif reason != "Succeeded" and memory is not None:
        killed = out_of_memory_failure(kills_at_start, memory.oom_kills(), memory.limit_bytes())
        if killed is not None:
            reason, message = killed.reason, f"{killed.message}\n{message}".strip()
            failed_step = None
    scrub = log.redactor.scrub
    # The messages are scrubbed before they are cut to their bound: a cut secret would no
    # longer be recognised. Outputs were masked when they were read.
    result = RunResult(
        operation=snapshot.operation,
        drift_check=snapshot.drift_check,
        state="succeeded" if reason == "Succeeded" else "failed",
        reason=reason,
        failed_step=failed_step,
        message=bound_message(scrub(message)),
        stack=snapshot.stack,
        job_name=snapshot.job_name,
        generation=snapshot.generation,
        reconcile_request=snapshot.reconcile_request,
        commit=run.commit,
        start_time=run.started,
        end_time=now(),
        outputs=outcome.outputs,
        secret_outputs=outcome.secret_outputs,
        changes=outcome.changes,
        drifted_resources=outcome.drifted,
        permalink=outcome.permalink,
        pulumi_version=run.pulumi_version,
        project_info=run.project_info,
        language_host=run.language_host,
        cleared_locks=[bound_message(scrub(note)) for note in run.cleared_locks],
        plan_id=outcome.plan_id,
        planned_resources=outcome.planned,
        planned_resource_count=outcome.planned_count,
    )
    return bound_result(result)


def _execute(run: _Run) -> OperationOutput:
    snapshot, env, log = run.snapshot, run.env, run.log
    check = load_stack_spec(snapshot.spec, snapshot.stack.namespace)
    if check.spec is None or check.problems:
        raise RunFailure(
            "InvalidSpec", "the Stack's spec is invalid:\n" + "\n".join(check.problems)
        )
    spec = check.spec
    check_rights(needed_rights(snapshot, spec), run.access_review)
    if spec.environment:
        _check_environment_support(spec, env)
    credentials = (
        git.resolve_git_credentials(snapshot.git_auth, spec.git_auth, env)
        if spec.project_repo
        else None
    )
    config = collect_config(spec, snapshot.config_from_env, env, snapshot.secrets_from_env)
    dynamic_env = read_dynamic_env(env)
    log.redactor.add(*known_secrets(snapshot, spec, env, config, credentials, dynamic_env))
    hidden = runner_only_env_names(snapshot)
    run.process_env = {name: value for name, value in env.items() if name not in hidden}

    settings, problems = cache_settings(env)
    for problem in problems:
        log.step(f"warning: {problem}")
        run.notes.append(f"warning: {problem}")
    cache = RunCache(
        cache_dir_from(env),
        settings,
        env.get("TMPDIR"),
        log.step,
        manages_plugins=bool(env.get(CACHE_DIR_ENV)) and not env.get("PULUMI_HOME"),
    )
    # The dynamic environment wins over the pod's, as PKO's agent sets it for Pulumi.
    pulumi_env = {**_pulumi_env(spec), **dynamic_env}
    _use_cache(cache, env, pulumi_env)
    try:
        return _execute_with_cache(run, spec, credentials, config, cache, pulumi_env)
    finally:
        run.notes.extend(cache.warnings)
        cache.close()


def _use_cache(cache: RunCache, env: Mapping[str, str], pulumi_env: dict[str, str]) -> None:
    """Point the package caches and the Pulumi home in ``pulumi_env`` at the cache's
    current directory."""
    pulumi_env.update(cache_environment(cache.directory, env))
    home = pulumi_home(env, bool(env.get(CACHE_DIR_ENV)), cache.directory)
    if home:
        pulumi_env["PULUMI_HOME"] = home


def _execute_with_cache(
    run: _Run,
    spec: StackSpec,
    credentials: git.GitCredentials | None,
    config: Mapping[str, ConfigItem],
    cache: RunCache,
    pulumi_env: dict[str, str],
) -> OperationOutput:
    snapshot, env, log = run.snapshot, run.env, run.log
    with _private_dir(env) as private, PulumiStart({**run.process_env, **pulumi_env}) as pulumi:
        run.private = private
        project, state_only = _source(run, spec, credentials, private)
        run.project_info = project.info
        command = pulumi.command(run.cancellation)
        run.pulumi_version = str(command.version or "")
        check_cli_supports(config, run.pulumi_version, env)
        from pkobatch.runner.pulumi_cli import RunnerWorkspace

        program: Callable[[], None] | None = _no_program if state_only else None
        # An unlock runs no program: `pulumi cancel` needs only the project and the stack.
        if not state_only and snapshot.operation != "unlock":
            host = _program_host(run, project, command, pulumi_env.get("PULUMI_HOME"))
            run.language_host = host.label
            if host.inline:
                run.log.step(
                    "runtime python: pulumi-language-python is not in the image; running "
                    "the program inline with the runner's interpreter"
                )
                # Dynamic providers and other Python plugins run with that interpreter too.
                pulumi_env["PULUMI_PYTHON_CMD"] = env.get("PULUMI_PYTHON_CMD") or sys.executable
                python_program = cache.install(
                    lambda: prepare_python_program(
                        project,
                        cache.directory,
                        log.step,
                        lambda argv: run.cancellation.run(
                            argv,
                            {**run.process_env, **pulumi_env},
                            timeout=INSTALL_TIMEOUT_SECONDS,
                        ),
                        cache.held,
                    ),
                    lambda: _use_cache(cache, env, pulumi_env),
                )
                program = python_program.function()
            else:
                run.log.step(f"runtime {host.runtime}: running the program with {host.host}")
                cache.install(
                    lambda: _install_dependencies(run, project, command, pulumi_env),
                    lambda: _use_cache(cache, env, pulumi_env),
                )
        with stopping_at("stackInitialization"):
            workspace = RunnerWorkspace(
                work_dir=str(project.directory),
                program=program,
                env_vars=pulumi_env,
                secrets_provider=spec.secrets_provider,
                pulumi_command=command,
                pulumi_home=pulumi_env.get("PULUMI_HOME"),
            )
            stack = _select_stack(run, spec, workspace)
        if stack is None:
            _remove_exported(run, spec)
            return OperationOutput(message=f"stack {spec.stack} does not exist; nothing to destroy")
        if snapshot.operation == "unlock":
            return _cancel_update(run, workspace, stack.name)
        if snapshot.apply_plan is not None:
            run.plan_file = _approved_plan(run, workspace, stack.name)
        with stopping_at("stackInitialization"):
            if config:
                log.step(f"setting {len(config)} config value(s)")
                workspace.set_planned_config(stack.name, plan_config(config))
            if spec.environment:
                log.step(f"adding ESC environment(s) {', '.join(spec.environment)}")
                stack.add_environments(*spec.environment)
        try:
            outcome = _operate_uncached_on_full(run, spec, stack, workspace, cache, pulumi_env)
            if snapshot.operation == "up":
                _export(run, spec, workspace, stack.name, outcome)
            elif snapshot.operation == "destroy" and not snapshot.drift_check:
                _remove_exported(run, spec)
            return outcome
        finally:
            if run.cancellation.killed:
                _unlock(run, spec, project.directory, {**run.process_env, **pulumi_env})


@contextlib.contextmanager
def _private_dir(env: Mapping[str, str]) -> Iterator[Path]:
    """A 0700 directory for the checkout and credential helpers, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="pkobatch-run-", dir=env.get("TMPDIR")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _no_program() -> None:
    """The program of a destroy from state: never run (no --run-program)."""


def _source(
    run: _Run, spec: StackSpec, credentials: git.GitCredentials | None, private: Path
) -> tuple[Project, bool]:
    """The project to run, from git or the image; or, for a destroy whose source is gone, a
    minimal project to destroy from the stack's state (then the flag is True)."""
    try:
        return _fetch_source(run, spec, credentials, private), False
    except RunFailure as failure:
        info = run.snapshot.project_info
        update = spec.update_template.spec if spec.update_template else None
        run_program = bool(spec.run_program or (update and update.run_program))
        if (
            failure.reason != "SourceUnavailable"
            or run.snapshot.operation != "destroy"
            or run.snapshot.drift_check
            or run_program
            or info is None
        ):
            raise
        run.log.step(f"source unavailable ({failure.message}); destroying from the stack's state")
        run.notes.append(f"destroyed from the stack's state: {failure.message}")
        return write_state_only_project(private / "state-only", info), True


def _fetch_source(
    run: _Run, spec: StackSpec, credentials: git.GitCredentials | None, private: Path
) -> Project:
    kind = spec.source_kind()
    if kind == "git":
        assert spec.project_repo is not None
        source = git.GitSource(
            url=spec.project_repo,
            branch=spec.branch or "",
            commit=run.snapshot.commit or spec.commit or "",
            shallow=bool(spec.shallow),
        )
        git.check_transport(source.url, credentials, run.snapshot.insecure_http_git_hosts)
        if credentials is not None and credentials.github_app is not None:
            run.log.step("exchanging the GitHub App's credentials for an installation token")
            credentials = credentials.for_url(source.url, run.log.redactor)
        run.log.step(f"fetching {source.describe()}")
        helpers = private / "git-helpers"
        helpers.mkdir(mode=0o700)
        git_env = git.git_environment(run.process_env, credentials, source.url, helpers)
        checkout = private / "source"
        run.commit = git.checkout(
            source,
            checkout,
            git_env,
            run.log.redactor,
            lambda argv, env, cwd: run.cancellation.run(
                argv, env, cwd, timeout=git.GIT_TIMEOUT_SECONDS
            ),
        )
        run.log.step(f"checked out {run.commit}")
        directory = (checkout / (spec.repo_dir or "")).resolve()
        if not directory.is_relative_to(checkout.resolve()) or not directory.is_dir():
            raise RunFailure(
                "SourceUnavailable",
                f"spec.repoDir {spec.repo_dir!r} is not a directory of the repository at "
                f"{run.commit}",
            )
        return load_project(directory)
    if kind == "program":
        return _program_source(run, spec, private)
    if kind == "flux":
        return _flux_source(run, spec, private)
    template = spec.workspace_template.spec if spec.workspace_template else None
    local_dir = template.local.dir if template and template.local else None
    if not local_dir:
        raise RunFailure(
            "InvalidSpec",
            "the Stack has no source: set spec.projectRepo (with branch or commit) or "
            "workspaceTemplate.spec.local.dir (a program baked into the runner image)",
        )
    run.log.step(f"using the program in {local_dir}")
    return load_project(copy_program(Path(local_dir), private / "program"))


def _program_source(run: _Run, spec: StackSpec, private: Path) -> Project:
    """The Program the controller rendered into the snapshot, written as a YAML project."""
    program = run.snapshot.program
    assert spec.program_ref is not None
    if program is None:
        raise RunFailure(
            "SourceUnavailable",
            f"Program {spec.program_ref.name} did not exist when this run was created",
        )
    directory = private / "program"
    directory.mkdir(mode=0o700)
    (directory / "Pulumi.yaml").write_text(program.project)
    run.commit = program.revision
    run.log.step(f"using Program {program.name} at generation {program.revision}")
    return load_project(directory)


def _flux_source(run: _Run, spec: StackSpec, private: Path) -> Project:
    """The Flux source's artifact the controller observed: downloaded, verified, unpacked."""
    artifact = run.snapshot.flux
    assert spec.flux_source is not None
    ref = spec.flux_source.source_ref
    if artifact is None:
        raise RunFailure(
            "SourceUnavailable",
            f"{ref.kind} {ref.name} had no artifact when this run was created",
        )
    # Only Flux sources download over HTTP: urllib.request and http.client load here, not at
    # every run's start.
    from pkobatch.runner.artifact import fetch as fetch_artifact

    run.log.step(f"downloading the artifact of {ref.kind} {ref.name} at {artifact.revision}")
    unpacked = fetch_artifact(artifact, private, run.process_env, run.log.step)
    run.commit = artifact.revision
    directory = (unpacked / (spec.flux_source.dir or "")).resolve()
    if not directory.is_relative_to(unpacked.resolve()) or not directory.is_dir():
        raise RunFailure(
            "SourceUnavailable",
            f"spec.fluxSource.dir {spec.flux_source.dir!r} is not a directory of the artifact "
            f"of {ref.kind} {ref.name} at {artifact.revision}",
        )
    return load_project(directory)


def _pulumi_env(spec: StackSpec) -> dict[str, str]:
    """Variables every Pulumi command of the run gets on top of the process environment."""
    pulumi_env = {"PULUMI_SKIP_UPDATE_CHECK": "true"}
    if spec.backend:
        pulumi_env["PULUMI_BACKEND_URL"] = spec.backend
    return pulumi_env


def _program_host(
    run: _Run, project: Project, command: RunnerPulumiCommand, home: str | None
) -> ProgramHost:
    info = project.info
    runtime = project.settings.get("runtime")
    options = (runtime.get("options") or {}) if isinstance(runtime, Mapping) else {}
    return choose_program_host(
        info.runtime,
        options,
        project.directory,
        search_path(
            run.process_env, shutil.which(command.command, path=run.process_env.get("PATH"))
        ),
        Path(home) if home else Path.home() / ".pulumi",
        frozen=is_frozen(),
    )


def _install_dependencies(
    run: _Run, project: Project, command: RunnerPulumiCommand, pulumi_env: Mapping[str, str]
) -> None:
    """``pulumi install`` in the project directory, with the run's caches."""
    run.log.step("installing dependencies (pulumi install)")
    try:
        done = run.cancellation.run(
            [command.command, *INSTALL_ARGS],
            {**run.process_env, **pulumi_env},
            project.directory,
            timeout=INSTALL_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise RunFailure(
            "ProgramError", f"pulumi install took over {INSTALL_TIMEOUT_SECONDS:.0f}s"
        ) from None
    for line in (done.stdout + done.stderr).splitlines():
        run.log.pulumi(line)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        if is_disk_full(said):
            raise CacheFull(said)
        raise RunFailure("ProgramError", f"pulumi install failed: {said}")


def _select_stack(run: _Run, spec: StackSpec, workspace: RunnerWorkspace) -> Stack | None:
    """The stack, created if allowed; None for a destroy of a stack that does not exist."""
    from pulumi.automation import Stack, StackNotFoundError

    unlock = run.snapshot.operation == "unlock"
    try:
        stack = Stack.select(spec.stack, workspace)
        run.log.step(f"selected stack {spec.stack}")
        return stack
    except StackNotFoundError as error:
        if run.snapshot.operation == "destroy":
            return None
        if spec.use_local_stack_only or run.snapshot.drift_check or unlock:
            _, stderr = command_output(error)
            if spec.use_local_stack_only:
                why = (
                    "spec.useLocalStackOnly forbids creating it; create it with `pulumi stack "
                    "init` or unset useLocalStackOnly"
                )
            else:
                why = f"{'an unlock' if unlock else 'a drift check'} never creates it"
            raise RunFailure(
                "StackNotFound",
                f"stack {spec.stack} does not exist in the backend and {why} ({stderr.strip()})",
            ) from None
    run.log.step(f"creating stack {spec.stack}")
    return Stack.create(spec.stack, workspace)


def _check_environment_support(spec: StackSpec, env: Mapping[str, str]) -> None:
    backend = spec.backend or env.get("PULUMI_BACKEND_URL", "")
    if backend.startswith(DIY_BACKEND_SCHEMES):
        scheme = backend.split("://", 1)[0]
        raise RunFailure(
            "InvalidSpec",
            f"spec.environment needs Pulumi ESC, which only the Pulumi Cloud backend provides; "
            f"this stack's backend is a {scheme}:// backend: remove spec.environment or use a "
            "Pulumi Cloud backend",
        )


def _cancel_update(run: _Run, workspace: RunnerWorkspace, stack_name: str) -> OperationOutput:
    """The ``unlock`` operation: ``pulumi cancel`` releases the stack's lock, whoever holds
    it (the controller starts an unlock only while no run of this Stack is active)."""
    run.log.step(f"releasing the lock of stack {stack_name} (pulumi cancel)")
    done = workspace.cancel_update(stack_name, run.log.pulumi, run.log.pulumi_error)
    said = " ".join(f"{done.stdout}\n{done.stderr}".split())
    return OperationOutput(message=f"stack {stack_name} unlocked: {said or 'pulumi cancel'}")


def _operate_uncached_on_full(
    run: _Run,
    spec: StackSpec,
    stack: Stack,
    workspace: RunnerWorkspace,
    cache: RunCache,
    pulumi_env: dict[str, str],
) -> OperationOutput:
    """The operation; once more without the cache when a plugin it installed into the
    cache's Pulumi home ran out of space (Pulumi leaves that plugin partial, so a later run
    installs it again)."""
    from pulumi.automation import CommandError

    try:
        return _operate(run, spec, stack)
    except CommandError as error:
        stdout, stderr = command_output(error)
        if not (cache.cached and cache.plugins is not None and is_disk_full(f"{stderr}{stdout}")):
            raise
        cache.go_uncached("a plugin install ran out of space in it")
    _use_cache(cache, run.env, pulumi_env)  # the workspace's env_vars are this dict
    workspace.pulumi_home = pulumi_env.get("PULUMI_HOME")
    run.log.step(f"running {run.snapshot.operation} again without the cache")
    return _operate(run, spec, stack)


def _operate(run: _Run, spec: StackSpec, stack: Stack) -> OperationOutput:
    """The operation; once more after removing a stale lock that refused it."""
    from pulumi.automation import CommandError

    try:
        return _operate_once(run, spec, stack)
    except CommandError as error:
        if not _remove_stale_locks(run, error):
            raise
    run.log.step(f"running {run.snapshot.operation} again now that the stale lock is gone")
    return _operate_once(run, spec, stack)


def _remove_stale_locks(run: _Run, error: CommandError) -> bool:
    """Remove the locks that refused the operation if each provably belongs to a finished
    run of this Stack (``pkobatch.runner.locks``); True when they are gone."""
    stdout, stderr = command_output(error)
    found = locks.parse_locks(f"{stderr}\n{stdout}")
    if not found:
        return False
    ended = run.snapshot.ended_runs
    stale = locks.stale_locks(found, ended)
    if stale is None:
        run.log.step(locks.not_live_message(found, ended))
        return False
    files = [locks.lock_file(entry.lock) for entry in stale]
    if any(path is None for path in files):
        run.log.step(
            "the stack's lock was left by a finished run of this Stack, but only a file:// "
            "backend's lock can be removed precisely; release it with `pkobatch unlock` "
            "(`pulumi cancel`) when no other update runs: "
            + "; ".join(entry.describe() for entry in stale)
        )
        return False
    for entry, path in zip(stale, files, strict=True):
        assert path is not None
        path.unlink(missing_ok=True)
        locks.attributes_file(path).unlink(missing_ok=True)
        message = f"removed the stale {entry.describe()}"
        run.log.step(message)
        run.cleared_locks.append(message)
    return True


def _operate_once(run: _Run, spec: StackSpec, stack: Stack) -> OperationOutput:
    snapshot, log = run.snapshot, run.log
    update = spec.update_template.spec if spec.update_template else None

    def pick(override: Any, default: Any) -> Any:
        return override if override is not None else default

    common: dict[str, Any] = {"on_output": log.pulumi, "on_error": log.pulumi_error}
    level = (
        spec.workspace_template.spec.pulumi_log_level
        if (spec.workspace_template and spec.workspace_template.spec)
        else None
    )
    if level:
        common.update(log_verbosity=level, log_to_std_err=True, log_flow=True)
    if update is not None:
        if update.parallel is not None:
            common["parallel"] = update.parallel
        if update.message:
            common["message"] = update.message
    refresh = pick(update.refresh if update else None, spec.refresh)
    targets = pick(update.target if update else None, spec.targets) or None
    target_dependents = pick(update.target_dependents if update else None, spec.target_dependents)
    run_program = pick(update.run_program if update else None, spec.run_program)
    expect_no_changes = update.expect_no_changes if update else None
    continue_on_error = update.continue_on_error if update else None
    replace = update.replace if update else None

    if snapshot.drift_check:
        log.step("checking for drift (refresh --preview-only)")
        preview = stack.preview_refresh(**common)
        changes = normalize_changes(preview.change_summary)
        return OperationOutput(changes=changes, drifted=count_drift(changes))
    operation = snapshot.operation
    log.step(f"running {operation}")
    if operation == "up":
        up = stack.up(
            plan=run.plan_file,
            target=targets,
            target_dependents=target_dependents,
            refresh=refresh,
            expect_no_changes=expect_no_changes,
            continue_on_error=continue_on_error,
            replace=replace,
            show_secrets=False,
            **common,
        )
        masked = {key: value.value for key, value in up.outputs.items()}
        return OperationOutput(
            changes=normalize_changes(up.summary.resource_changes),
            outputs=run.log.redactor.mask_value(masked),
            secret_outputs=secret_output_keys(masked),
            permalink=find_permalink(up.stdout),
        )
    if operation == "preview":
        plan_file = _private_file(run, "saved-plan.json") if snapshot.save_plan else None
        preview = stack.preview(
            target=targets,
            target_dependents=target_dependents,
            refresh=refresh,
            expect_no_changes=expect_no_changes,
            replace=replace,
            plan=str(plan_file) if plan_file else None,
            **common,
        )
        previewed = OperationOutput(
            changes=normalize_changes(preview.change_summary),
            permalink=find_permalink(preview.stdout),
        )
        if plan_file is not None:
            _save_plan(run, plan_file, previewed, stack)
        return previewed
    if operation == "refresh":
        refreshed = stack.refresh(
            expect_no_changes=expect_no_changes,
            run_program=update.run_program if update else None,
            show_secrets=False,
            **common,
        )
        changes = normalize_changes(refreshed.summary.resource_changes)
        return OperationOutput(
            changes=changes,
            drifted=count_drift(changes),
            permalink=find_permalink(refreshed.stdout),
        )
    destroyed = stack.destroy(
        refresh=refresh,
        continue_on_error=continue_on_error,
        run_program=run_program or None,
        remove=update.remove if update else None,
        show_secrets=False,
        **common,
    )
    return OperationOutput(
        changes=normalize_changes(destroyed.summary.resource_changes),
        permalink=find_permalink(destroyed.stdout),
    )


def _private_file(run: _Run, name: str) -> Path:
    assert run.private is not None
    return run.private / name


def _save_plan(run: _Run, plan_file: Path, outcome: OperationOutput, stack: Stack) -> None:
    """Store the plan a preview saved in its Secret (spec.approval); fill in its id and steps."""
    save = run.snapshot.save_plan
    assert save is not None
    if run.plan_store is None:
        raise RunFailure("JobFailed", "a plan for approval can only be saved in a cluster")
    text = plan_file.read_bytes()
    outcome.plan_id = plan_id(text, run.commit, run.snapshot.spec)
    outcome.planned, outcome.planned_count = planned_steps(load_plan(text))
    try:
        settings = stack.workspace.stack_settings(stack.name)
        encryption = {
            "encryptionsalt": settings.encryption_salt or "",
            "encryptedkey": settings.encrypted_key or "",
        }
    except FileNotFoundError:
        encryption = {}
    body = plan_secret(
        save.secret,
        text,
        outcome.plan_id,
        run.snapshot.stack,
        run.snapshot.job_name,
        run.env,
        encryption,
    )
    try:
        run.plan_store.create_plan(body)
    except ExportFailed as error:
        raise RunFailure("JobFailed", f"the plan could not be saved: {error}") from None
    run.log.step(f"saved plan {outcome.plan_id} in Secret {save.secret}")


def _approved_plan(run: _Run, workspace: RunnerWorkspace, stack_name: str) -> str:
    """The approved plan's file for ``up --plan``, after checking it is the approved one;
    the stack settings its config ciphertexts need are restored first."""
    from pulumi.automation import StackSettings

    apply = run.snapshot.apply_plan
    assert apply is not None
    if run.plan_store is None:
        raise RunFailure("JobFailed", "an approved plan can only be read in a cluster")
    try:
        secret = run.plan_store.read_plan(apply.secret)
    except ExportFailed as error:
        raise RunFailure(
            "PlanMismatch", f"the approved plan {apply.id} cannot be read: {error}"
        ) from None
    text = plan_from_secret(secret, apply.secret)
    found = plan_id(text, run.commit, run.snapshot.spec)
    if found != apply.id:
        raise RunFailure(
            "PlanMismatch",
            f"Secret {apply.secret} holds plan {found} at commit {run.commit}, not the approved "
            f"plan {apply.id}; nothing was applied",
        )
    encryption = encryption_from_secret(secret)
    if encryption:
        try:
            settings = workspace.stack_settings(stack_name)
        except FileNotFoundError:
            settings = StackSettings()
        settings.encryption_salt = encryption.get("encryptionsalt") or settings.encryption_salt
        settings.encrypted_key = encryption.get("encryptedkey") or settings.encrypted_key
        workspace.save_stack_settings(stack_name, settings)
    path = _private_file(run, "approved-plan.json")
    path.write_bytes(text)
    run.log.step(f"applying approved plan {apply.id}")
    return str(path)


def _no_cluster_note(run: _Run) -> bool:
    """True (after saying so) when there is nowhere to write spec.exportOutputs."""
    if run.outputs_sink is not None:
        return False
    note = (
        "spec.exportOutputs skipped: `pkobatch run` has no cluster to write the ConfigMap and "
        "Secret to; they are written when the controller runs the Stack"
    )
    run.log.step(note)
    run.notes.append(note)
    return True


def _export(
    run: _Run,
    spec: StackSpec,
    workspace: RunnerWorkspace,
    stack_name: str,
    outcome: OperationOutput,
) -> None:
    """Write the outputs of a successful ``up`` where spec.exportOutputs says."""
    export = spec.export_outputs
    if export is None or run.snapshot.drift_check or _no_cluster_note(run):
        return
    assert run.outputs_sink is not None
    values = workspace.stack_outputs_with_secrets(stack_name)
    plan = plan_export(export, outcome.outputs, values)
    # Before anything else: from here on no secret value may reach a log or a message.
    run.log.redactor.add(*hidden_values(outcome.outputs, values), *plan.secret.values())
    for note in plan.notes:
        run.log.step(note)
    run.notes.extend(plan.notes)
    objects = export_objects(export, plan, run.snapshot.stack)
    try:
        for body in objects:
            run.outputs_sink.write(body)
    except ExportFailed as error:
        raise RunFailure(
            "JobFailed", f"the stack was updated, but its outputs were not exported: {error}"
        ) from None
    run.log.step(
        f"exported {len(plan.config_map)} plain output(s) and {len(plan.secret)} secret "
        "output(s): " + ", ".join(f"{body['kind']} {body['metadata']['name']}" for body in objects)
    )


def _remove_exported(run: _Run, spec: StackSpec) -> None:
    """After a successful destroy: delete the objects spec.exportOutputs names."""
    export = spec.export_outputs
    if export is None or _no_cluster_note(run):
        return
    assert run.outputs_sink is not None
    try:
        notes = [run.outputs_sink.remove(t, run.snapshot.stack) for t in export_targets(export)]
    except ExportFailed as error:
        raise RunFailure(
            "JobFailed", f"the stack was destroyed, but its exported outputs remain: {error}"
        ) from None
    for note in notes:
        run.log.step(note)


def _unlock(run: _Run, spec: StackSpec, directory: Path, env: Mapping[str, str]) -> None:
    """After Pulumi had to be killed: remove the lock it left (``pulumi cancel``)."""
    timeout = min(UNLOCK_TIMEOUT_SECONDS, run.cancellation.seconds_left())
    if timeout <= 1:
        return
    run.log.step("Pulumi was killed; running `pulumi cancel` to release the stack lock")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["pulumi", "cancel", "--yes", "--non-interactive", "--stack", spec.stack],
            cwd=directory,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        run.log.step(f"pulumi cancel: {(done.stdout + done.stderr).strip()}")
