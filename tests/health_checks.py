"""How GitOps tools read a Stack's health, with their real code.

- Argo CD: its built-in health check for ``pulumi.com/Stack``
  (``resource_customizations/pulumi.com/Stack/health.lua`` of module
  ``github.com/argoproj/argo-cd/v3``, fetched by ``scripts/tools.sh argocd_health``), run
  by lupa's Lua 5.1 — the language version of gopher-lua, which Argo CD embeds. As Argo CD
  does, the object is handed to the script as the global ``obj`` (JSON decoded into Lua
  tables) and the script's returned table is the health.
- kstatus (Flux's ``healthChecks``): ``sigs.k8s.io/cli-utils``' ``status.Compute``, built
  as a small program by ``scripts/tools.sh kstatus`` (scripts/kstatus/main.go).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
