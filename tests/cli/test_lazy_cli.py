"""`anima-rknn --help` and `--version` load no command: neither torch nor transformers (measured: 0.12 s of CPU
instead of about 5 s), and the group's listing is the commands' own one-line help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from anima_rknn.cli import cli
from anima_rknn.cli.commands import COMMANDS

PROBE = """
import sys
from anima_rknn.cli import main
sys.argv = ["anima-rknn", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print("loaded:", sorted(name for name in ("torch", "transformers", "diffusers", "numpy") if name in sys.modules))
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-h"], ["nonsense"]])
def test_help_and_version_import_no_heavy_module(args):
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert "loaded: []" in result.stdout, result.stdout + result.stderr


def test_a_command_loads_only_its_own_module():
    result = subprocess.run([sys.executable, "-c", PROBE + "print(sorted(m for m in sys.modules if "
                             "m.startswith('anima_rknn.cli.') and m.split('.')[-1] in "
                             "{'generate', 'serve', 'batch', 'bench', 'rknn'}))", "make-tiny", "--help"],
                            capture_output=True, text=True, timeout=300)
    assert "Write a random-weight model set" in result.stdout and "[]" in result.stdout.splitlines()[-1], result


def test_the_listing_is_each_commands_own_help():
    commands = cli.load_all()
    assert set(commands) == set(COMMANDS)
    for name, command in commands.items():
        module, line = COMMANDS[name]
        assert command.callback.__module__ == f"anima_rknn.cli.{module}"
        assert command.get_short_help_str(limit=80) == line, name
