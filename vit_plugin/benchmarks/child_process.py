"""Failures of the child processes the benchmarks measure in (one fresh interpreter per measurement)."""
import sys


def child_failure(what: str, error_output: str) -> str:
    """A one-line message for a failed child process. Its error output (a traceback, say) is written to
    this process's stderr first, so the message keeps only the last line."""
    sys.stderr.write(error_output)
    last = (error_output.strip().splitlines() or ['no error output'])[-1]
    return f'{what} failed: {last}'
