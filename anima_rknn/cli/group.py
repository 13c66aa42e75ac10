"""The `anima-rknn` click group, which every command module registers itself on.

The group loads a command's module only when that command runs (or its help is asked for): torch and transformers
load with the command modules, so `anima-rknn --help` and `--version` answer in a fraction of a second instead of
the seconds those imports take. commands.py names each command's module and its one-line help, which the group's
listing shows without importing anything (tests/cli/test_lazy_cli.py checks it against the commands' own).
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    """A click group whose commands are imported from their modules on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from .commands import COMMANDS

        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        from .commands import COMMANDS

        if cmd_name not in self.commands and cmd_name in COMMANDS:
            from ..core.memory import freeze_long_lived  # (its ctypes is a tenth of --help's time)

            importlib.import_module(f"{__package__}.{COMMANDS[cmd_name][0]}")  # registers the command on `cli`
            freeze_long_lived()  # every module the command imports is loaded now
        return self.commands.get(cmd_name)

    def load_all(self) -> dict[str, click.Command]:
        """Every command, each module imported (what a test that looks at all of them needs)."""
        from .commands import COMMANDS

        ctx = click.Context(self)
        return {name: self.get_command(ctx, name) for name in COMMANDS}

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from .commands import COMMANDS

        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in sorted(COMMANDS)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="anima-rknn")
def cli() -> None:
    """Anima text-to-image on small machines: CPU (PyTorch, ONNX Runtime) and the RK3588 NPU."""
