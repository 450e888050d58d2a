"""The run's log: Pulumi's output and the runner's own steps, scrubbed, one line at a time.

In a Job this is the pod's log (stdout). Every line goes through the run's ``Redactor``
first, and is flushed at once so ``kubectl logs -f`` follows the run live. Lines of one stream
(Pulumi's stdout, its stderr, the program's own output) are scrubbed as a sequence, so a
secret Pulumi printed across several lines is replaced on each (``Redactor.scrub_stream``).
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

from pkobatch.runner.redact import Redactor

RUNNER_PREFIX = "[pkobatch] "


class RunLog:
    def __init__(self, stream: TextIO, redactor: Redactor) -> None:
        self._stream = stream
        self.redactor = redactor
        self._lock = threading.Lock()  # Pulumi's stdout and stderr arrive on two threads
        # Per stream: the braces of a Go-printed secret its last line left open.
        self._open: dict[str, int] = {}

    def _write(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def step(self, message: str) -> None:
        """A line from the runner itself."""
        with self._lock:
            self._write(self.redactor.scrub(RUNNER_PREFIX + message))

    def _line(self, stream: str, line: str) -> None:
        with self._lock:
            scrubbed, self._open[stream] = self.redactor.scrub_stream(
                line, self._open.get(stream, 0)
            )
            self._write(scrubbed)

    def pulumi(self, line: str) -> None:
        """A line of Pulumi's (or the program's) standard output."""
        self._line("stdout", line)

    def pulumi_error(self, line: str) -> None:
        """A line of Pulumi's (or the program's) standard error."""
        self._line("stderr", line)


class ScrubbingWriter(io.TextIOBase):
    """A text stream that writes whole lines, scrubbed, to another stream.

    The program runs inline, in the runner's process: what it prints goes straight to the
    runner's stdout/stderr instead of through Pulumi (whose output the run scrubs), so
    ``scrubbed_output`` puts these in front of ``sys.stdout`` and ``sys.stderr`` for the run.
    """

    def __init__(self, target: TextIO, redactor: Redactor) -> None:
        self._target = target
        self._redactor = redactor
        self._pending = ""
        self._open = 0  # the braces of a Go-printed secret the last line left open
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            if "\n" in self._pending:
                complete, self._pending = self._pending.rsplit("\n", 1)
                scrubbed, self._open = self._redactor.scrub_stream(complete, self._open)
                self._target.write(scrubbed + "\n")
                self._target.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                scrubbed, self._open = self._redactor.scrub_stream(self._pending, self._open)
                self._target.write(scrubbed)
                self._pending = ""
            self._target.flush()


@contextlib.contextmanager
def scrubbed_output(redactor: Redactor) -> Iterator[None]:
    """Scrub everything printed through ``sys.stdout``/``sys.stderr`` in this block."""
    saved = sys.stdout, sys.stderr
    sys.stdout = ScrubbingWriter(saved[0], redactor)
    sys.stderr = ScrubbingWriter(saved[1], redactor)
    try:
        yield
    finally:
        for writer in (sys.stdout, sys.stderr):
            writer.flush()
        sys.stdout, sys.stderr = saved
