"""How GitOps tools read a Stack's health, and act on it, with their real code.

- Argo CD: its built-in health check for ``pulumi.com/Stack``
  (``resource_customizations/pulumi.com/Stack/health.lua`` of module
  ``github.com/argoproj/argo-cd/v3``, fetched by ``scripts/tools.sh argocd_health``), run
  by lupa's Lua 5.1 — the language version of gopher-lua, which Argo CD embeds. As Argo CD
  does, the object is handed to the script as the global ``obj`` (JSON decoded into Lua
  tables) and the script's returned table is the health.
- Argo CD resource actions (``ArgoCDActions``, deploy/argocd): run as Argo CD v3's
  ``util/lua`` runs them — in a Lua state with only the base, table and package libraries
  and its "safe" os (``os.time``, ``os.date``), the result encoded back to JSON as
  gopher-json does and cleaned (``cleanReturnedObj``), and the change sent to the API
  server as the JSON merge patch from the live object to that result
  (``server/application`` ``patchResource``).
- kstatus (Flux's ``healthChecks``): ``sigs.k8s.io/cli-utils``' ``status.Compute``, built
  as a small program by ``scripts/tools.sh kstatus`` (scripts/kstatus/main.go).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import lupa.lua51
import yaml

from pkobatch.dev.tools import ARGOCD_STACK_HEALTH, Tools


@dataclass(frozen=True)
class Health:
    status: str
    message: str


def _lua_value(runtime: Any, value: Any) -> Any:
    """JSON → Lua as Argo CD converts it: objects and arrays become tables (arrays
    1-based), numbers Lua numbers, null nil."""
    if isinstance(value, Mapping):
        table = runtime.table()
        for key, item in value.items():
            if item is not None:
                table[key] = _lua_value(runtime, item)
        return table
    if isinstance(value, list):
        table = runtime.table()
        for index, item in enumerate(value, start=1):
            table[index] = _lua_value(runtime, item)
        return table
    return value


class ArgoCDHealth:
    """Argo CD's health check for Stacks, evaluated as Argo CD evaluates it."""

    def __init__(self, tools: Tools) -> None:
        self.script_path = tools.bin_dir("argocd_health") / ARGOCD_STACK_HEALTH
        self.script = self.script_path.read_text(encoding="utf-8")

    def __call__(self, stack: Mapping[str, Any]) -> Health:
        runtime = lupa.lua51.LuaRuntime(unpack_returned_tuples=False)
        # Round-trip through JSON: the object is exactly what the API server returned.
        runtime.globals().obj = _lua_value(runtime, json.loads(json.dumps(stack)))
        result = runtime.execute(self.script)
        return Health(str(result["status"]), str(result["message"] or ""))


# Argo CD's safe os.date (util/lua/oslib_safe.go) formats with Go layouts; the flags this
# harness reproduces, as Python strftime directives. Others fail the test that uses them.
_OS_DATE_FLAGS = {
    "d": "%d",
    "F": "%Y-%m-%d",
    "H": "%H",
    "I": "%I",
    "m": "%m",
    "M": "%M",
    "S": "%S",
    "X": "%H:%M:%S",
    "y": "%y",
    "Y": "%Y",
    "z": "%z",
}
# What Argo CD's resource-action state has of Lua's standard libraries (SkipOpenLibs, then
# package, base and table): the others are removed from lupa's full set.
_NOT_IN_ARGO = ("string", "math", "io", "debug", "coroutine")


def _os_date(layout: str | None = None, seconds: float | None = None) -> str:
    """``os.date`` as Argo CD's safe os library formats (a "!" prefix: UTC)."""
    layout = layout or "%c"
    utc = layout.startswith("!")
    layout = layout.lstrip("!")
    moment = datetime.fromtimestamp(time.time() if seconds is None else seconds, UTC)
    if not utc:
        moment = moment.astimezone()
    out, index = [], 0
    while index < len(layout):
        char = layout[index]
        if char == "%" and index + 1 < len(layout):
            flag = layout[index + 1]
            if flag == "%":
                out.append("%")
            elif flag in _OS_DATE_FLAGS:
                out.append(moment.strftime(_OS_DATE_FLAGS[flag]))
            else:
                raise NotImplementedError(f"os.date flag %{flag} is not reproduced here")
            index += 2
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _os_time(table: Any = None) -> int:
    if table is not None:
        raise NotImplementedError("os.time(table) is not reproduced here")
    return int(time.time())


def _json_value(value: Any) -> Any:
    """Lua → JSON as gopher-json encodes it: an empty table is ``[]``, a table with keys
    1..n an array, one with string keys an object; whole numbers are integers."""
    if lupa.lua51.lua_type(value) == "table":
        items = list(value.items())
        keys = [key for key, _ in items]
        if not keys:
            return []
        if all(isinstance(key, int) for key in keys):
            if sorted(keys) != list(range(1, len(keys) + 1)):
                raise ValueError("sparse array")
            return [_json_value(item) for _, item in sorted(items)]
        if not all(isinstance(key, str) for key in keys):
            raise ValueError("a table mixing string and number keys")
        return {key: _json_value(item) for key, item in items}
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _cleaned(new: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """Argo CD's ``cleanReturnedObj``: where the live object had an object and the script
    returns an empty table (encoded ``[]``), it is the empty object again."""
    for key, before in old.items():
        if key not in new:
            continue
        after = new[key]
        if isinstance(after, dict) and isinstance(before, Mapping):
            new[key] = _cleaned(after, before)
        elif isinstance(after, list) and isinstance(before, Mapping) and not after:
            new[key] = {}
        elif isinstance(after, list) and isinstance(before, list):
            new[key] = _cleaned_array(after, before)
    return new


def _cleaned_array(new: list[Any], old: list[Any]) -> list[Any]:
    for index, (after, before) in enumerate(zip(new, old, strict=False)):
        if isinstance(after, dict) and isinstance(before, Mapping):
            new[index] = _cleaned(after, before)
        elif isinstance(after, list) and isinstance(before, list):
            new[index] = _cleaned_array(after, before)
    return new


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch from ``old`` to ``new`` (evanphx/json-patch CreateMergePatch)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif isinstance(value, Mapping) and isinstance(old[key], Mapping):
            inner = merge_patch(old[key], value)
            if inner:
                patch[key] = inner
        elif value != old[key]:
            patch[key] = value
    patch.update({key: None for key in old if key not in new})
    return patch


class ArgoCDActions:
    """The resource actions of one argocd-cm ``resource.customizations.actions.<group>_<kind>``
    value (``discovery.lua`` and ``definitions``), run as Argo CD runs them."""

    def __init__(self, value: str) -> None:
        actions = yaml.safe_load(value)
        self.discovery = str(actions["discovery.lua"])
        self.definitions = {str(d["name"]): str(d["action.lua"]) for d in actions["definitions"]}

    def _run(self, script: str, obj: Mapping[str, Any]) -> Any:
        runtime = lupa.lua51.LuaRuntime(unpack_returned_tuples=False)
        # Without the string library no string has methods either.
        runtime.execute('debug.setmetatable("", nil)')
        lua = runtime.globals()
        safe_os = runtime.table(time=_os_time, date=_os_date)
        for name in _NOT_IN_ARGO:
            lua[name] = None
            lua.package.loaded[name] = None
        lua.os = safe_os
        lua.package.loaded.os = safe_os
        lua.actionParams = runtime.table()
        lua.obj = _lua_value(runtime, json.loads(json.dumps(obj)))
        return runtime.execute(script)

    def available(self, obj: Mapping[str, Any]) -> dict[str, bool]:
        """Action name -> whether Argo CD offers it enabled (``discovery.lua``)."""
        found = _json_value(self._run(self.discovery, obj))
        return {name: not (entry or {}).get("disabled", False) for name, entry in found.items()}

    def result(self, action: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object ``action`` returns, as Argo CD reads it back."""
        live = json.loads(json.dumps(obj))
        returned = _json_value(self._run(self.definitions[action], obj))
        assert isinstance(returned, dict), f"action {action} returned {returned!r}"
        return _cleaned(returned, live)

    def patch(self, action: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The merge patch Argo CD sends to the API server for ``action`` on ``obj``."""
        return merge_patch(json.loads(json.dumps(obj)), self.result(action, obj))


class KStatus:
    """kstatus' reading of objects (cli-utils ``status.Compute``)."""

    def __init__(self, tools: Tools) -> None:
        self.binary = tools.binary("kstatus", "kstatus")

    def __call__(self, stacks: Sequence[Mapping[str, Any]]) -> list[Health]:
        completed = subprocess.run(
            [self.binary],
            input=json.dumps(list(stacks)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr
        return [Health(v["status"], v["message"]) for v in json.loads(completed.stdout)]

    def one(self, stack: Mapping[str, Any]) -> Health:
        return self([stack])[0]


def argocd_test_cases(tools: Tools) -> list[tuple[Path, Health]]:
    """Argo CD's own cases for the script (health_test.yaml next to it)."""
    directory = (tools.bin_dir("argocd_health") / ARGOCD_STACK_HEALTH).parent
    cases = yaml.safe_load((directory / "health_test.yaml").read_text(encoding="utf-8"))
    return [
        (
            directory / case["inputPath"],
            Health(case["healthStatus"]["status"], case["healthStatus"].get("message", "")),
        )
        for case in cases["tests"]
    ]
