"""What every user command shares: global options, the cluster connection, output, errors.

Global options (``--kubeconfig``, ``-n``, ``-o`` ...) are accepted both before the command
(``pkobatch -n team get``) and after it (``pkobatch get -n team``), as kubectl users type
them. They are click options with ``expose_value=False`` whose callbacks record only the
values the user actually gave (command line or environment) in the root context, so a
command's own copy of an option overrides the group's and command signatures stay free of
them. ``Session.from_context`` resolves them, with defaults, when a command runs.

The connection options are kubectl's: ``--kubeconfig``, ``--context``, and ``--server``,
``--token``, ``--as``, ``--as-group``, which change what the kubeconfig gives
(``pkobatch.kube.client.ClientOverrides``).

Output discipline: data goes to stdout (``Session.out``), everything else — progress,
spinners, run logs while waiting, warnings, errors — to stderr (``Session.err``), so
``pkobatch get -o json | jq`` always works. Tables go through ``Session.print_table``, which
leaves out the header line with ``--no-headers``. Exit codes: 0 success, 1 the operation
failed or timed out (``click.ClickException``), 2 usage error (``click.UsageError``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Final, Literal, NoReturn, TypeVar, cast

import click
import yaml
from rich.console import Console
from rich.text import Text

from pkobatch.api.durations import format_duration, parse_duration
from pkobatch.cli.default_namespace import default_namespace
from pkobatch.cli.text_format import Cell, format_table
from pkobatch.kube.client import (
    STACKS,
    ClientOverrides,
    Forbidden,
    Kube,
    KubeError,
    NotFound,
    Resource,
    Unauthorized,
    Unreachable,
)

OutputFormat = Literal["table", "wide", "json", "yaml", "name"]
OUTPUT_FORMATS: Final[tuple[OutputFormat, ...]] = ("table", "wide", "json", "yaml", "name")
DEFAULT_TIMEOUT: Final = "10m"
_META_KEY: Final = "pkobatch.global_options"

F = TypeVar("F", bound=Callable[..., Any])


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    source = ctx.get_parameter_source(param.name or "")
    if source in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT):
        ctx.find_root().meta.setdefault(_META_KEY, {})[param.name] = value
    return value


def _duration(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None:
        return None
    try:
        parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return _remember(ctx, param, value)


class GlobalOption(click.Option):
    """An option every user command accepts (listed apart in ``--help``)."""


def global_params() -> list[click.Parameter]:
    """A fresh set of the global options (one set per command and one for the group)."""
    return [
        GlobalOption(
            ["--kubeconfig"],
            metavar="PATH",
            type=click.Path(dir_okay=False),
            expose_value=False,
            callback=_remember,
            help="Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).",
        ),
        GlobalOption(
            ["--context"],
            metavar="NAME",
            expose_value=False,
            callback=_remember,
            help="Kubeconfig context to use.",
        ),
        GlobalOption(
            ["-s", "--server"],
            metavar="URL",
            expose_value=False,
            callback=_remember,
            help="The API server's address, instead of the kubeconfig's.",
        ),
        GlobalOption(
            ["--token"],
            metavar="TOKEN",
            expose_value=False,
            callback=_remember,
            help="Bearer token to authenticate with, instead of the kubeconfig's.",
        ),
        GlobalOption(
            ["--as", "impersonate"],
            metavar="USER",
            expose_value=False,
            callback=_remember,
            help="Act as this user (impersonation, which you must be allowed).",
        ),
        GlobalOption(
            ["--as-group", "impersonate_groups"],
            metavar="GROUP",
            multiple=True,
            expose_value=False,
            callback=_remember,
            help="Act in this group too (repeatable; needs --as).",
        ),
        GlobalOption(
            ["-n", "--namespace"],
            metavar="NS",
            expose_value=False,
            callback=_remember,
            help="Namespace (default: the context's namespace, else 'default').",
        ),
        GlobalOption(
            ["-A", "--all-namespaces"],
            is_flag=True,
            expose_value=False,
            callback=_remember,
            help="Work across all namespaces.",
        ),
        GlobalOption(
            ["--timeout"],
            metavar="DURATION",
            expose_value=False,
            callback=_duration,
            help=f"How long to follow a run, as a Go duration (default {DEFAULT_TIMEOUT}); "
            "with -w, how long to watch (default: until interrupted).",
        ),
        GlobalOption(
            ["-o", "--output"],
            type=click.Choice(OUTPUT_FORMATS),
            expose_value=False,
            callback=_remember,
            help="Output format (default table; name: only kind/name, as kubectl's).",
        ),
        GlobalOption(
            ["--no-headers"],
            is_flag=True,
            expose_value=False,
            callback=_remember,
            help="Tables without their header line.",
        ),
        GlobalOption(
            ["--no-color"],
            is_flag=True,
            expose_value=False,
            callback=_remember,
            help="No colours (also when NO_COLOR is set).",
        ),
    ]


@dataclass(frozen=True)
class GlobalOptions:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False
    # None: not given; waits use DEFAULT_TIMEOUT, watches run until interrupted.
    timeout: timedelta | None = None
    output: OutputFormat = "table"
    no_headers: bool = False
    no_color: bool = False
    server: str | None = None
    token: str | None = None
    impersonate: str | None = None
    impersonate_groups: tuple[str, ...] = ()

    @classmethod
    def from_context(cls, ctx: click.Context) -> GlobalOptions:
        given: dict[str, Any] = dict(ctx.find_root().meta.get(_META_KEY, {}))
        if "timeout" in given:
            given["timeout"] = parse_duration(given["timeout"])
        if "impersonate_groups" in given:
            given["impersonate_groups"] = tuple(given["impersonate_groups"])
        return cls(**given)

    def client_overrides(self) -> ClientOverrides:
        try:
            return ClientOverrides(
                self.server, self.token, self.impersonate, self.impersonate_groups
            )
        except ValueError as exc:
            raise click.UsageError(f"--as-group: {exc}") from None


class CommandFailed(click.ClickException):
    """The operation failed (exit code 1); the message is one line that says what to do."""


def exit_failed() -> NoReturn:
    """Exit 1 after the command printed why (a failed run, a failed check)."""
    raise click.exceptions.Exit(1)


def now() -> datetime:
    return datetime.now(UTC)


class Session:
    """One command's view of the world: options, the cluster connection and the consoles."""

    def __init__(self, options: GlobalOptions) -> None:
        self.options = options
        # urllib3 logs each connection retry as a warning, which Python's last-resort handler
        # would print to stderr; the error the command reports says it all in one line.
        logging.getLogger("urllib3").setLevel(logging.ERROR)
        # Data is printed as it is: no markup, emoji codes or highlighting, no wrapping.
        no_color = options.no_color or None
        self.out = Console(no_color=no_color, highlight=False, soft_wrap=True, emoji=False)
        self.err = Console(
            stderr=True, no_color=no_color, highlight=False, soft_wrap=True, emoji=False
        )
        self._started = time.monotonic()

    @classmethod
    def current(cls) -> Session:
        ctx = click.get_current_context()
        session = ctx.find_root().meta.get("pkobatch.session")
        if not isinstance(session, Session):
            session = cls(GlobalOptions.from_context(ctx))
            ctx.find_root().meta["pkobatch.session"] = session
            ctx.call_on_close(session.close)
        return session

    @cached_property
    def kube(self) -> Kube:
        return Kube.connect(
            self.options.kubeconfig,
            self.options.context,
            overrides=self.options.client_overrides(),
        )

    @cached_property
    def namespace(self) -> str:
        return self.options.namespace or default_namespace(
            self.options.kubeconfig, self.options.context
        )

    @property
    def list_namespace(self) -> str | None:
        """Where to list: None (every namespace) with ``-A``."""
        return None if self.options.all_namespaces else self.namespace

    @property
    def output(self) -> OutputFormat:
        return self.options.output

    def require_output(self, *allowed: OutputFormat) -> OutputFormat:
        if self.output not in allowed:
            raise click.UsageError(
                f"this command does not support -o {self.output}; use one of " + ", ".join(allowed)
            )
        return self.output

    @property
    def wait_timeout(self) -> timedelta:
        return self.options.timeout or parse_duration(DEFAULT_TIMEOUT)

    def remaining(self) -> float:
        """Seconds left of ``--timeout`` (counted from the start of the command)."""
        return self.wait_timeout.total_seconds() - (time.monotonic() - self._started)

    def timeout_text(self) -> str:
        return format_duration(self.wait_timeout)

    def close(self) -> None:
        if "kube" in self.__dict__:
            self.kube.close()

    # -- output ---------------------------------------------------------------------------

    def print_table(
        self, headers: Sequence[str], rows: Iterable[Sequence[Cell]], *, header: bool = True
    ) -> None:
        """A kubectl-style table (``text_format.format_table``); ``--no-headers`` drops the
        header line, as does ``header=False`` (rows that continue a printed table)."""
        self.print_lines(format_table(headers, rows, header=header and not self.options.no_headers))

    def print_names(self, resource: Resource, names: Iterable[str]) -> None:
        """``-o name``: one ``<kind>.<group>/<name>`` per object, as kubectl prints them."""
        kind = resource.kind.lower()
        prefix = f"{kind}.{resource.group}" if resource.group else kind
        self.print_lines(f"{prefix}/{name}" for name in names)

    def print_lines(self, lines: Iterable[Text | str]) -> None:
        for line in lines:
            self.out.print(line, markup=False, crop=False, overflow="ignore")

    def print_data(self, data: Any) -> None:
        """Print ``data`` as JSON or YAML (per ``-o``); tables are printed by the caller."""
        if self.output == "yaml":
            click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
        else:
            click.echo(json.dumps(data, indent=2, sort_keys=False))

    def warn(self, message: str) -> None:
        self.err.print(Text("Warning: ", style="yellow") + Text(message), markup=False)

    def progress(self, message: str) -> None:
        self.err.print(message, markup=False, highlight=False)


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def describe_unreachable(error: Unreachable, host: str) -> str:
    if error.reason == "NoConfiguration":
        return error.message
    match = _ERRNO.search(error.message)
    if match:
        cause = match.group(1).strip().lower()
    elif "timed out" in error.message.lower():
        cause = "timed out"
    else:
        cause = "connection failed"
    return (
        f"cannot reach the Kubernetes API server at {host} ({cause}): "
        "check --kubeconfig and --context, and that the cluster is running"
    )


def crd_missing(kube: Kube) -> bool:
    """True when the API server does not serve pulumi.com/v1 Stacks at all."""
    try:
        kube.request("GET", f"/apis/{STACKS.group}/{STACKS.version}")
    except NotFound:
        return True
    except KubeError:
        return False
    return False


CRD_MISSING_MESSAGE: Final = (
    "the Stack CRD (stacks.pulumi.com/v1) is not installed in this cluster: install it with "
    "`pkobatch crds | kubectl apply -f -` (run `pkobatch check` for details)"
)


def explain(error: KubeError, session: Session) -> str:
    """One line that says what went wrong and what to do about it."""
    first_line = " ".join(error.message.split())
    if isinstance(error, Unreachable):
        host = session.kube.host if "kube" in session.__dict__ else "the configured server"
        return describe_unreachable(error, host)
    if isinstance(error, Forbidden):
        return (
            f"forbidden: {first_line} (ask a cluster admin for access; "
            "`pkobatch check` lists what you may do)"
        )
    if isinstance(error, Unauthorized):
        return (
            "the API server rejected your credentials (401 Unauthorized): log in again or "
            "check --kubeconfig and --context"
        )
    if isinstance(error, NotFound) and crd_missing(session.kube):
        return CRD_MISSING_MESSAGE
    return first_line or f"{error.status} {error.reason}"


class PkobatchCommand(click.Command):
    """A user command: global options, and API errors turned into one line with exit 1."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(global_params())

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own: list[tuple[str, str]] = []
        shared: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                (shared if isinstance(param, GlobalOption) else own).append(record)
        for title, records in (("Options", own), ("Global options", shared)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KubeError as error:
            raise CommandFailed(explain(error, Session.current())) from None


def command(name: str, **kwargs: Any) -> Callable[[F], click.Command]:
    """``@click.command`` for user commands (80-column help, global options, errors)."""
    return cast(
        Callable[[F], click.Command],
        click.command(name, cls=PkobatchCommand, **kwargs),
    )
