"""What `flwr run --stream` shows a cuvil-edge user: our report, not Flower's log.

The ServerApp's stdout and stderr reach `flwr run --stream` as one stream, Flower's own log lines
(``INFO :  [ROUND 1/2]``, a hundred a run) and tracebacks among them. The ServerApp marks each line
of cuvil-edge's own report with :data:`MARK` (an invisible character, :class:`MarkedFormatter`);
:class:`StreamFilter` passes those (unmarked) and, without ``verbose``, only Flower's warnings and
errors, each as its one first line (a ServerApp failure's reason comes back as the run's status
details, see :func:`failure_reason`).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections import deque

#: Starts every line of cuvil-edge's own report in the stream (U+2063 INVISIBLE SEPARATOR).
MARK = "\u2063"
#: A line of Flower's console log: an optional colour, the level, an optional time, ":".
_FLOWER_LINE = re.compile(
    r"^(?:\x1b\[[0-9;]*m)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r"(?: [0-9-]+ [0-9:,.]+)?\s*(?:\x1b\[0m)?\s*:"
)
#: Flower's warnings and errors that say nothing to a cuvil-edge user: a ServerApp that raised (the
#: run's final line gives its error instead), and the simulation's notice about its default size
#: (ours is set).
_NOT_SHOWN = ("raised an exception", "default simulated SuperNodes changed")
#: Lines of the `flwr` CLI itself that are worth a cuvil-edge user's eye.
_CLI_KEPT = ("Successfully started run",)
#: How Flower words a failed ServerApp in the run's status details (flwr/superlink/runtime/run_serverapp.py).
_FAILED_PREFIX = "ServerApp failed with exception: "
#: Unshown lines kept to explain a `flwr run` that failed before a run existed.
TAIL_LINES = 12


class MarkedFormatter(logging.Formatter):
    """Each line of a record at ``marked_level`` or above, its traceback included, starts with
    :data:`MARK` (and ``marked_prefix``); records below it are left plain, for ``--verbose``."""

    def __init__(self, fmt: str = "%(message)s", marked_level: int = logging.NOTSET, marked_prefix: str = "") -> None:
        super().__init__(fmt)
        self.marked_level, self.marked_prefix = marked_level, marked_prefix

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno < self.marked_level:
            return text
        return "\n".join(MARK + line for line in (self.marked_prefix + text).split("\n"))


class StreamFilter:
    """Decides, line by line, what of the stream is shown; ``verbose`` shows everything (unmarked)."""

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self._in_flower_record = False
        self.hidden: deque[str] = deque(maxlen=TAIL_LINES)  # the last lines not shown

    def __call__(self, line: str) -> str | None:
        """The line to show (with its newline), or None."""
        if line.startswith(MARK):
            self._in_flower_record = False
            return line.replace(MARK, "")
        if self.verbose:
            return line.replace(MARK, "")
        match = _FLOWER_LINE.match(line)
        if match:  # its traceback and other continuation lines stay hidden
            self._in_flower_record = True
            if match.group(1) in ("WARNING", "ERROR", "CRITICAL") and not any(w in line for w in _NOT_SHOWN):
                return line
        elif not self._in_flower_record and line.startswith(_CLI_KEPT):
            return line
        self.hidden.append(line)
        return None


def relay(
    command: list[str], env: dict, timeout: float, verbose: bool
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run ``command``, copying what :class:`StreamFilter` shows of its output to our stdout; the
    finished process and the last lines not shown."""
    import threading

    shown = StreamFilter(verbose)
    proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:  # type: ignore[union-attr]  # stdout=PIPE
            out = shown(line)
            if out is not None:
                sys.stdout.write(out)
                sys.stdout.flush()
        proc.wait()
    except BaseException:  # Ctrl-C: `flwr run` got the SIGINT too; do not leave it behind
        proc.kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    return subprocess.CompletedProcess(command, proc.returncode), list(shown.hidden)


def failure_reason(run: dict) -> str:
    """Why a run ended as it did, from `flwr ls --format json`'s entry for it: the ServerApp's own
    error message where it raised one (Flower's wrapper words removed), on one line."""
    details = " ".join(str(run.get("status-details") or "").split())
    return details[len(_FAILED_PREFIX) :] if details.startswith(_FAILED_PREFIX) else details
