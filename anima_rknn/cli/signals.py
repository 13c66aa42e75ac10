"""Ctrl-C, SIGTERM and SIGHUP as a request to stop at the next step boundary, for the commands that run jobs."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[int]]:
    """The first SIGINT/SIGTERM/SIGHUP asks the run to stop after its current step (the list gets the signal's
    number); a second one aborts at once, as the handlers outside this block would."""
    stops: list[int] = []
    # Signals the user chose to ignore (nohup, a background job) stay ignored.
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
             if signal.getsignal(signum) is not signal.SIG_IGN}

    def request_stop(signum: int, frame: object) -> None:
        if stops:
            if signum == signal.SIGINT:  # a second Ctrl-C: the user means it
                signal.signal(signum, saved[signum])
                signal.raise_signal(signum)
            return  # a repeated SIGTERM/SIGHUP (systemd signals every process of the unit) changes nothing
        stops.append(signum)
        # os.write, not click.echo: a handler must not re-enter a buffered stream (tqdm may be writing to it),
        # and on a hung-up terminal the write fails, which must not end the run.
        with contextlib.suppress(OSError):
            os.write(2, f"\n{signal.Signals(signum).name}: stopping after this step "
                        "(Ctrl-C again to abort at once)\n".encode())

    for signum in saved:
        signal.signal(signum, request_stop)
    try:
        yield stops
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
