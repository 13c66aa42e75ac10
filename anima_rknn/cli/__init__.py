"""`anima-rknn`: the entry points (main, and run: the console script). The click group is in group.py; each
command lives in its own module and registers itself there (commands.py imports them all)."""

from __future__ import annotations

import os
import signal
import sys

import click

from ..errors import AnimaError, Terminated
from .group import cli


def _raise_terminated(signum: int, frame: object) -> None:
    # Once: a second SIGTERM (systemd signals the whole group, the supervisor forwards) must not cut the
    # clean-up of the first short.
    for other in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(other, signal.SIG_IGN)
    raise Terminated(signum)


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 1, never a traceback.

    SIGTERM and SIGHUP (a closed ssh session) unwind like Ctrl-C, so no temporary file outlives them. The group
    imports the command that runs, and only it (group.py)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup and friends stay in force
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


# How a worker that the kernel killed is reported: what the user can do about it.
_KILLED = {
    signal.SIGBUS: "a model file was truncated or changed on disk while in use (bus error); no output was written",
    signal.SIGKILL: "killed (SIGKILL; out of memory?); no output was written",
}


def _die_with_parent(watcher: int) -> None:
    """Linux: SIGTERM this process when the watcher dies (so a killed watcher leaves no orphan working on)."""
    import ctypes
    import ctypes.util

    libc_name = ctypes.util.find_library("c")
    if libc_name and sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(libc_name).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != watcher:  # it died before the request above took effect
        os._exit(128 + signal.SIGTERM)


def run() -> None:
    """The `anima-rknn` console script: main() in a forked worker, watched by this small process.

    Model files are memory-mapped; one truncated on disk while mapped kills the process with SIGBUS, which
    Python cannot catch. The watcher turns that (and the OOM killer's SIGKILL) into one error line and exit
    code 1 instead of a bare "Bus error". It forks before torch is imported, so the fork is cheap and safe.
    The worker has its own process group, so a terminal's Ctrl-C reaches it once, through the watcher.
    """
    forwarded = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN]
    job_control = (signal.SIGTSTP, signal.SIGCONT)
    # Held back until the watcher's handlers are in place, so that none lands on a default handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, [*forwarded, *job_control])
    watcher = os.getpid()
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [*forwarded, *job_control])
        _die_with_parent(watcher)
        main()
        sys.exit(0)

    def forward(signum: int, frame: object) -> None:
        os.kill(child, signum)

    def suspend(signum: int, frame: object) -> None:  # Ctrl-Z: stop the worker too, then this process
        os.kill(child, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)

    for signum in forwarded:
        signal.signal(signum, forward)
    signal.signal(signal.SIGTSTP, suspend)
    signal.signal(signal.SIGCONT, forward)  # fg / bg: the worker goes on too
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [*forwarded, *job_control])
    _, status = os.waitpid(child, 0)  # retried by Python after every forwarded signal
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        reason = _KILLED.get(signum, f"killed by {signal.Signals(signum).name}; no output was written")
        click.echo(f"error: {reason}", err=True)
        sys.exit(1 if signum == signal.SIGBUS else 128 + signum)
    sys.exit(os.waitstatus_to_exitcode(status))
