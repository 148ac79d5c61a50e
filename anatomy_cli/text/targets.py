"""Target and foil tokens: the one place that turns ``--target TEXT`` / ``--target-id N`` into a token id.

Used by ``next``, ``trace``, ``lens``, ``dla``, ``ablate``, ``patch`` and ``circuit``. Two steps, so that bad
input fails fast: :func:`choice` checks the options before anything loads (both given, empty text),
:func:`resolve` tokenizes once a tokenizer is at hand (an opened model's tokenizer: it
gets one before the weights load). :func:`token_id` does both for a loaded model.

Rules: TEXT must be exactly one token (no BOS, no [CLS]/[SEP]); with ``--first-token`` a longer TEXT
stands for its first token (said on stderr). TEXT without a leading space whose spaced version is one
token gets a note on stderr (GPT-2's ``much`` 29482 is not the word after a space, `` much`` 881 is).
``--target-id N`` takes an id in ``0 .. vocabulary - 1``, the LM head's rows (a padded head has more than
the tokenizer has tokens). The options themselves are in
:mod:`anatomy_cli.cli.options`. No torch and no typer at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli.errors import UsageError
from anatomy_cli.text.tokenization import Tokenizer

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.text.tokenization import Tokenizer

@dataclass(frozen=True)
class TokenChoice:
    """A token named on the command line: ``text`` (``--target TEXT``) or ``id`` (``--target-id N``)."""

    option: str                 # "--target" or "--foil": how messages name it
    text: str | None = None
    id: int | None = None
    first_token: bool = False

    @property
    def id_option(self) -> str:
        return f"{self.option}-id"


def choice(text: str | None, id: int | None = None, *, option: str = "--target",
           first_token: bool = False) -> TokenChoice | None:
    """The token options as given, checked before any model loads; None when neither is given.

    Raises UsageError when both TEXT and an id are given, TEXT is empty or the id is negative.
    """
    if text is None and id is None:
        return None
    if text is not None and id is not None:
        raise UsageError(f"both {option} and {option}-id were given: name the token one way, by its text or "
                         f"by its id")
    if text == "":
        raise UsageError(f"{option} is empty: give the text of one token, e.g. ' much'")
    if id is not None and id < 0:
        raise UsageError(f"{option}-id {id} is negative: token ids start at 0")
    return TokenChoice(option=option, text=text, id=id, first_token=first_token)


def check_first_token(first_token: bool, *chosen: TokenChoice | None, options: str = "--target") -> None:
    """UsageError for ``--first-token`` with no TEXT to apply it to (no token option, or only ids)."""
    if first_token and not any(c is not None and c.text is not None for c in chosen):
        raise UsageError(f"--first-token applies to a {options} TEXT of several tokens, and none was given")


def _tokenizer(source: LoadedModel | Tokenizer) -> Tokenizer:
    return source if isinstance(source, Tokenizer) else source.tokenizer


def _pieces(tok: Tokenizer, text: str) -> tuple[list[int], list[str]]:
    """``text`` alone, without the specials the tokenizer inserts itself (BOS, [CLS], [SEP])."""
    enc = tok.encode([text], bos=False)[0]
    keep = [i for i in range(len(enc))
            if not (enc.special[i] and enc.offsets[i] == (0, 0) and enc.token_bytes[i] == b"")]
    return [enc.ids[i] for i in keep], [enc.pieces[i] for i in keep]


def resolve(source: LoadedModel | Tokenizer, wanted: TokenChoice, *, model: str | None = None,
            vocab_size: int | None = None, note: Callable[[str], object] | None = None) -> int:
    """The token id ``wanted`` stands for in ``source``'s tokenizer (a LoadedModel or a Tokenizer).

    ``model`` names the model in messages (default: ``source.name``); ``vocab_size`` bounds an id: the
    LM head's rows (default: the model's ``vocab_size``, else the tokenizer's size). A padded head's rows
    past the tokenizer are ids too (shown as ``<unused id N>``). ``note(text)`` receives
    the stderr notes (default: printed on stderr). Raises UsageError for TEXT that is not one token
    (showing the split; with the spaced version when that is one token) unless ``first_token``,
    and for an id outside the vocabulary.
    """
    note = note or (lambda text: print(text, file=sys.stderr))
    tok = _tokenizer(source)
    model = model or getattr(source, "name", "the model")
    if wanted.id is not None:
        limit = vocab_size or getattr(source, "vocab_size", None) or len(tok)
        if wanted.id >= limit:
            raise UsageError(f"{wanted.id_option} {wanted.id} is outside {model}'s vocabulary (ids 0..{limit - 1})")
        return wanted.id
    text = wanted.text or ""
    ids, pieces = _pieces(tok, text)
    spaced = None
    if not text[:1].isspace():
        spaced_ids, spaced_pieces = _pieces(tok, " " + text)
        if len(spaced_ids) == 1 and spaced_ids != ids[:1]:
            spaced = (spaced_ids[0], spaced_pieces[0])
    if len(ids) == 1:
        if spaced:
            note(f"note: {wanted.option} {text!r} is {pieces[0]} ({ids[0]}), with no leading space; the word "
                 f"after a space is {spaced[1]} ({spaced[0]}): {wanted.option} {' ' + text!r}")
        return ids[0]
    split = " + ".join(pieces) or "nothing"
    if not ids or not wanted.first_token:
        hint = (f"{' ' + text!r} with its leading space is one token ({spaced[1]}, id {spaced[0]})" if spaced
                else "give exactly one token, e.g. ' much' with its space")
        raise UsageError(f"{wanted.option} {text!r} is {len(ids)} tokens for {model}: {split} (ids "
                         f"{', '.join(map(str, ids))}); {hint}, or --first-token to take the first")
    note(f"note: {wanted.option} {text!r} is {len(ids)} tokens ({split}); --first-token takes {pieces[0]} "
         f"({ids[0]})" + (f"; {' ' + text!r} would be one token ({spaced[1]}, {spaced[0]})" if spaced else ""))
    return ids[0]


def token_id(lm: LoadedModel, text: str, *, option: str = "--target", first_token: bool = False) -> int:
    """The id of ``text`` if it is exactly one token of ``lm``'s tokenizer (see :func:`resolve`).

    Raises UsageError (naming ``option``) for empty text, or for text that is not one
    token, showing how it splits: ``--target 'much more' is 2 tokens for gpt2: ...``.
    """
    wanted = choice(text, option=option, first_token=first_token)
    assert wanted is not None
    return resolve(lm, wanted)


def resolve_pair(tokenizer: Tokenizer, wanted: TokenChoice, unwanted: TokenChoice | None, *, model: str,
                 vocab_size: int | None = None) -> dict[str, int | None]:
    """``{"target": id, "foil": id or None}`` for ``--target`` and ``--foil`` (see :func:`resolve`). Raises
    UsageError when the foil is the target: the logit difference would be 0 everywhere."""
    target = resolve(tokenizer, wanted, model=model, vocab_size=vocab_size)
    foil = resolve(tokenizer, unwanted, model=model, vocab_size=vocab_size) if unwanted else None
    if foil == target:
        raise UsageError("--foil is the same token as --target: the logit difference would be 0 everywhere")
    return {"target": target, "foil": foil}


def single_token_forms(source: LoadedModel | Tokenizer, word: str) -> tuple[int, ...]:
    """jlens' surface forms of ``word`` that are one token each, as ids in this order without repeats: the word
    as given, with a leading space, capitalised (``str.capitalize``), capitalised with a leading space. Empty
    when no form is one token (an intermediate that can never be a hit, as jlens counts it)."""
    tok = _tokenizer(source)
    out: list[int] = []
    for form in (word, f" {word}", word.capitalize(), f" {word.capitalize()}"):
        ids = _pieces(tok, form)[0]
        if len(ids) == 1 and ids[0] not in out:
            out.append(ids[0])
    return tuple(out)
