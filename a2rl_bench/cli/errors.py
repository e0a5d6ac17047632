"""How the command line answers a mistake: one line on stderr that says what is wrong and what to do, exit 2.

argparse's own error (a usage block, then the message) and pydantic's (a paragraph with a link) both become
that one line here; SIGTERM becomes the Ctrl-C path, so a terminated run is recorded and says so.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the command and where its help is. Subcommand
    parsers made by `add_subparsers` are of the same class (argparse's default), so they answer alike."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        for dest, word in (("command", "command"), ("action", "action")):  # subcommand names, not option names
            message = message.replace(f"argument {dest}: invalid choice:", f"unknown {word}", 1)
        message = message.removeprefix("argument ")
        command = self.prog.partition(" ")[2]  # `run`, `drivers add`; "" for the top level
        self.exit(USAGE_ERROR, f"a2rl: {command + ': ' if command else ''}{message}; see `{self.prog} --help`\n")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default, except where there is none to show (None, False) or the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def validation_line(error: Exception, option_of=None) -> str:
    """A pydantic ValidationError as one line: each bad field as its option (`option_of(field)`, default
    `--field-name`), the value given and what is allowed. Anything else: its text on one line."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return " ".join(str(error).split())
    parts = []
    for e in errors():
        field = str(e["loc"][0]) if e.get("loc") else ""
        option = option_of(field) if option_of else "--" + field.replace("_", "-")
        given = f" {e['input']!r}" if "input" in e and not isinstance(e["input"], dict) else ""
        parts.append(f"{option}{given}: {e['msg'][:1].lower()}{e['msg'][1:]}" if field else e["msg"])
    return "; ".join(parts)


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as the interrupt Ctrl-C raises: the run in progress is recorded as interrupted."""

    signal_name = "SIGTERM"


_deferred: dict[str, int | bool | None] = {"on": False, "signum": None}
"""Inside `stops_deferred`: whether a stop is deferred, and the signal of one that came meanwhile."""


def _stop_error(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _on_stop(signum, frame) -> None:
    """SIGTERM (and Ctrl-C) in the main thread: stop, unless the run is already recorded completed and only waits
    for Prefect to record its end; that stop is held, said, and a second one does not wait (a2rl_bench.ops.stopping)."""
    from a2rl_bench.ops import stopping

    if stopping.hold(signum):
        return
    if _deferred["on"] and _deferred["signum"] is None:  # a second stop does not wait
        _deferred["signum"] = signum  # raised where the deferring block ends
        return
    raise _stop_error(signum)


@contextmanager
def stops_deferred() -> Iterator[None]:
    """A stop (SIGTERM, Ctrl-C) that comes inside the block is raised when it ends, not inside it. For imports:
    library code that runs while a module is imported catches what a signal raises in it and goes on (Prefect's
    plug-in start-up catches pydantic's SchemaError, which wraps the `Terminated` raised inside its schema
    building): the stop was lost and a whole run went on, with a paragraph on stderr. A second stop inside the
    block is raised at once (the imports can take a minute on a loaded machine)."""
    _deferred["on"], _deferred["signum"] = True, None
    try:
        yield
    finally:
        _deferred["on"] = False
    signum, _deferred["signum"] = _deferred["signum"], None
    if signum is not None:
        raise _stop_error(signum)


def terminate_like_ctrl_c() -> None:
    """From now on, SIGTERM in this (main) thread raises `Terminated`, and Ctrl-C (where it raises at all) goes
    through the same handler."""
    _deferred["on"], _deferred["signum"] = False, None
    signal.signal(signal.SIGTERM, _on_stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_stop)


def interrupted_how(error: BaseException) -> tuple[str, int]:
    """('SIGTERM', 143) or ('Ctrl-C', 130): what stopped the command, and its exit code by the shell's rule."""
    return ("SIGTERM", 128 + signal.SIGTERM) if isinstance(error, Terminated) else ("Ctrl-C", 128 + signal.SIGINT)


def say(line: str) -> None:
    print(f"a2rl: {line}", file=sys.stderr)
