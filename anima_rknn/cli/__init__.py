"""`anima-rknn`: one click group; each command lives in its own module and registers itself here."""

from __future__ import annotations

import signal
import sys

import click

from ..errors import AnimaError, Terminated


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="anima-rknn")
def cli() -> None:
    """Anima text-to-image on small machines: CPU (PyTorch, ONNX Runtime) and the RK3588 NPU."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 1, never a traceback.

    SIGTERM and SIGHUP (a closed ssh session) unwind like Ctrl-C, so no temporary file outlives them."""
    from . import commands  # noqa: F401  (registers the commands)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)
    try:
        cli.main(standalone_mode=False)
    except AnimaError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Terminated as e:
        click.echo(f"terminated by {signal.Signals(e.signum).name}", err=True)
        sys.exit(128 + e.signum)
