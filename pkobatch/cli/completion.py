"""Shell completion: ``pkobatch completion bash|zsh|fish`` prints click's completion script
for ``pkobatch``, and ``kubectl_complete-pkobatch`` (a console script) answers kubectl.

kubectl (1.26 and later) completes a plugin's arguments by running the executable
``kubectl_complete-<plugin>`` found on ``PATH`` with the words after ``kubectl pkobatch``,
the last one being the word to complete, and reads cobra's answer: one completion per line
(``value<TAB>description``), then ``:<directive>`` (``k8s.io/kubectl/pkg/cmd/plugin``).
So ``kubectl completion bash`` (or zsh, fish) completes ``kubectl pkobatch ...`` too, Stack
names included: both completions come from the same click definitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import click
from click.shell_completion import ShellComplete, get_completion_class

from pkobatch.cli.session import command

PROG_NAME: Final = "pkobatch"
# click's variable for pkobatch's completion requests (derived from the program's name).
COMPLETE_VAR: Final = "_PKOBATCH_COMPLETE"
SHELLS: Final = ("bash", "zsh", "fish")
# cobra.ShellCompDirective: what the shell does besides offering the completions.
SHELL_COMPLETES_FILES: Final = 0
SHELL_COMPLETES_DIRECTORIES: Final = 16
NO_FILE_COMPLETION: Final = 4


def completion_script(cli: click.Command, shell: str) -> str:
    """The script that makes ``shell`` complete ``pkobatch`` (click's)."""
    completion = get_completion_class(shell)
    if completion is None:
        raise click.BadParameter(f"no completion for {shell}", param_hint="SHELL")
    return completion(cli, {}, PROG_NAME, COMPLETE_VAR).source()


def kubectl_completions(cli: click.Command, words: Sequence[str]) -> str:
    """What ``kubectl_complete-pkobatch WORDS...`` prints: the completions of the last word
    after the others, in cobra's format."""
    args, incomplete = list(words[:-1]), (words[-1] if words else "")
    items = ShellComplete(cli, {}, f"kubectl {PROG_NAME}", COMPLETE_VAR).get_completions(
        args, incomplete
    )
    types = {item.type for item in items}
    if "file" in types:
        return f":{SHELL_COMPLETES_FILES}\n"
    if "dir" in types:
        return f":{SHELL_COMPLETES_DIRECTORIES}\n"
    lines = [
        f"{item.value}\t{' '.join(item.help.split())}" if item.help else str(item.value)
        for item in items
    ]
    return "".join(f"{line}\n" for line in [*lines, f":{NO_FILE_COMPLETION}"])


@command(
    "completion",
    short_help="Print the shell completion script (bash, zsh, fish).",
    epilog="""\b
Examples:
  pkobatch completion bash > /etc/bash_completion.d/pkobatch
  pkobatch completion zsh > "${fpath[1]}/_pkobatch"
  pkobatch completion fish > ~/.config/fish/completions/pkobatch.fish""",
)
@click.argument("shell", type=click.Choice(SHELLS))
def completion_command(shell: str) -> None:
    """Print the script that makes SHELL complete pkobatch's commands, options and Stack
    names (of the namespace the command line names so far). Source it, or install it where
    the shell loads completions, as in the examples; bash: `source <(pkobatch completion
    bash)` in ~/.bashrc.

    `kubectl pkobatch` is completed by kubectl's own completion (`kubectl completion SHELL`,
    kubectl 1.26 or later): it asks `kubectl_complete-pkobatch`, which pkobatch installs next
    to `kubectl-pkobatch`, on PATH."""
    cli = click.get_current_context().find_root().command
    click.echo(completion_script(cli, shell), nl=False)
