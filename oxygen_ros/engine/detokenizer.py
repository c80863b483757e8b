"""Incremental SentencePiece detokenization: per request, ids in, text deltas out.

SentencePiece's `decode` is not a per-id map: a leading U+2581 becomes a space except at the
very start of the text, and byte-fallback pieces (`<0xNN>`) are joined into UTF-8 characters,
each invalid byte becoming U+FFFD. The detokenizer never re-implements those rules; it calls
the processor's own `decode` on a short window of ids and only decides how much of the text
is already final.

Invariants (`ids` is every id fed so far):
- After `flush`, the concatenation of all returned deltas equals `processor.decode(ids)`.
- Before `flush`, the concatenation is a prefix of `processor.decode(ids + more)` for every
  continuation `more`: text is emitted only when later ids cannot change it. The only ids held
  back are trailing byte pieces that start a UTF-8 character later bytes could complete.
- Each call decodes only the ids fed since the last call plus held bytes (a window), so the
  cost per id is constant. A window after non-empty text is decoded behind a fixed anchor
  piece, so its first piece keeps its leading space exactly as in the full decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_CONTINUATION_MIN, _CONTINUATION_END = 0x80, 0xC0


class PieceProcessor(Protocol):
    """The parts of `sentencepiece.SentencePieceProcessor` the detokenizer uses."""

    def decode(self, ids: list[int], /) -> str: ...
    def id_to_piece(self, piece_id: int, /) -> str: ...
    def is_byte(self, piece_id: int, /) -> bool: ...
    def is_control(self, piece_id: int, /) -> bool: ...
    def is_unknown(self, piece_id: int, /) -> bool: ...
    def is_unused(self, piece_id: int, /) -> bool: ...
    def get_piece_size(self) -> int: ...


def find_anchor_id(processor: PieceProcessor) -> int:
    """The lowest id of an ordinary piece that decodes to non-empty text on its own."""
    for token_id in range(processor.get_piece_size()):
        if (
            processor.is_control(token_id)
            or processor.is_unknown(token_id)
            or processor.is_byte(token_id)
            or processor.is_unused(token_id)
        ):
            continue
        if processor.decode([token_id]):
            return token_id
    raise ValueError("the SentencePiece model has no ordinary piece with non-empty text")


def _utf8_length(lead: int) -> int:
    """Bytes of the UTF-8 character `lead` starts, as SentencePiece reads it (1 if invalid)."""
    if lead < 0x80:
        return 1
    if lead & 0xE0 == 0xC0:
        return 2
    if lead & 0xF0 == 0xE0:
        return 3
    if lead & 0xF8 == 0xF0:
        return 4
    return 1


def num_incomplete_tail_bytes(byte_values: Sequence[int]) -> int:
    """Trailing bytes of a byte run that later bytes could still join into one character.

    Scans the run as SentencePiece does: a complete valid character is consumed whole, an
    invalid byte alone (it becomes U+FFFD). The scan stops at a lead byte followed only by
    continuation bytes but too few of them; everything from there on is incomplete.
    """
    num_bytes = len(byte_values)
    offset = 0
    while offset < num_bytes:
        length = _utf8_length(byte_values[offset])
        if offset + length > num_bytes:
            rest = byte_values[offset + 1 :]
            if all(_CONTINUATION_MIN <= value < _CONTINUATION_END for value in rest):
                return num_bytes - offset
            offset += 1
            continue
        try:
            bytes(byte_values[offset : offset + length]).decode("utf-8")
        except UnicodeDecodeError:
            offset += 1
        else:
            offset += length
    return 0


class IncrementalDetokenizer:
    """Turns one request's id stream into text deltas (see the module invariants)."""

    def __init__(self, processor: PieceProcessor, *, anchor_id: int | None = None) -> None:
        """Creates the state for one stream.

        Args:
            processor: a SentencePiece processor (shared between streams; read only).
            anchor_id: an ordinary piece with non-empty text; None finds one. Pass it when
                creating many detokenizers for the same processor.
        """
        self._processor = processor
        self._anchor_id = find_anchor_id(processor) if anchor_id is None else anchor_id
        self._anchor_text = processor.decode([self._anchor_id])
        if not self._anchor_text:
            raise ValueError(f"anchor id {self._anchor_id} decodes to empty text")
        self._token_ids: list[int] = []  # every id fed
        self._window_start = 0  # ids before it have final, emitted text
        self._text_parts: list[str] = []  # deltas returned so far
        self._has_text = False  # some emitted delta is non-empty
        self._flushed = False
        self._byte_values: dict[int, int | None] = {}  # id -> byte value, None if not a byte

    @property
    def anchor_id(self) -> int:
        return self._anchor_id

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(self._token_ids)

    @property
    def text(self) -> str:
        """Concatenation of all deltas returned so far."""
        return "".join(self._text_parts)

    @property
    def num_held_ids(self) -> int:
        """Fed ids whose text is not emitted yet (incomplete UTF-8 bytes)."""
        return len(self._token_ids) - self._window_start

    def feed(self, token_ids: Sequence[int]) -> str:
        """Adds ids; returns the text that became final."""
        if self._flushed:
            raise ValueError("feed after flush")
        self._token_ids.extend(int(token_id) for token_id in token_ids)
        end = len(self._token_ids) - self._num_held_tail()
        return self._emit_until(end)

    def flush(self) -> str:
        """Ends the stream: returns the held text (incomplete bytes decode to U+FFFD)."""
        if self._flushed:
            return ""
        self._flushed = True
        return self._emit_until(len(self._token_ids))

    def _emit_until(self, end: int) -> str:
        window = self._token_ids[self._window_start : end]
        if not window:
            return ""
        if self._has_text:
            text = self._processor.decode([self._anchor_id, *window])
            assert text.startswith(self._anchor_text)
            delta = text[len(self._anchor_text) :]
        else:
            delta = self._processor.decode(window)
        # Everything up to `end` is final, and `end` is a boundary where a fresh decode of the
        # following ids gives the same text, so the window restarts there.
        self._window_start = end
        self._text_parts.append(delta)
        self._has_text = self._has_text or bool(delta)
        return delta

    def _num_held_tail(self) -> int:
        """Trailing ids (since the window start) that are an incomplete UTF-8 character."""
        byte_values: list[int] = []
        for token_id in reversed(self._token_ids[self._window_start :]):
            value = self._byte_value(token_id)
            if value is None:
                break
            byte_values.append(value)
        byte_values.reverse()
        return num_incomplete_tail_bytes(byte_values)

    def _byte_value(self, token_id: int) -> int | None:
        if token_id not in self._byte_values:
            value = None
            if self._processor.is_byte(token_id):
                value = int(self._processor.id_to_piece(token_id)[3:5], 16)
            self._byte_values[token_id] = value
        return self._byte_values[token_id]
