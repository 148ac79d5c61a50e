"""Reading user text: prompts from arguments or stdin. No torch here."""

from __future__ import annotations

import sys
from typing import BinaryIO

from anatomy_cli.errors import UsageError


def read_text_arg(text: str, *, stdin: BinaryIO | None = None) -> str:
    """The argument itself, or all of stdin when it is ``-``.

    Raises UsageError for invalid UTF-8 on stdin (naming the line number).
    """
    if text != "-":
        return text
    data = (stdin or sys.stdin.buffer).read()
    return _decode(data)


def read_prompts(prompt: str, *, stdin: BinaryIO | None = None) -> list[str]:
    """Prompts to run: ``[prompt]``, or every non-empty line of stdin when ``prompt == "-"``.

    Returns: list of str, at least one. Raises UsageError on a prompt that is empty or only whitespace, on
    stdin with no non-empty line, or on invalid UTF-8 (naming the line number).
    Lines keep their inner whitespace; only the line ending is removed.
    """
    if prompt != "-":
        if not prompt.strip():
            # One rule with stdin, where blank lines are skipped: a prompt has some non-space text.
            raise UsageError("empty prompt: give some text (or '-' to read prompts from stdin)")
        return [prompt]
    raw = (stdin or sys.stdin.buffer).read()
    prompts: list[str] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(number, line, exc.start) from None
        if text.strip():
            prompts.append(text)
    if not prompts:
        raise UsageError("no prompts on stdin: every line was empty")
    return prompts


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data[start:data.find(b"\n", exc.start) if b"\n" in data[exc.start:] else len(data)]
        raise _not_utf8(data.count(b"\n", 0, exc.start) + 1, line, exc.start - start) from None


def _not_utf8(number: int, line: bytes, at: int) -> UsageError:
    """The one message for invalid UTF-8 on stdin: 1-based line, 1-based byte within that line."""
    return UsageError(f"stdin line {number} is not valid UTF-8 (byte {at + 1}: {line[at:at + 1]!r})")
