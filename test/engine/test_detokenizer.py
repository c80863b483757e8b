"""Incremental detokenization: the concatenation of deltas equals SentencePiece's decode."""

from __future__ import annotations

import functools
import io

import pytest
import sentencepiece
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.engine.detokenizer import (
    IncrementalDetokenizer,
    find_anchor_id,
    num_incomplete_tail_bytes,
)
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH

SENTENCES = [
    "the robot picks up the red cube",
    "place the cube in the bowl",
    "hello world, the arm moves left",
    "open the drawer slowly and carefully",
]


@functools.cache
def trained_processor() -> sentencepiece.SentencePieceProcessor:
    """A small unigram model with byte fallback and the default dummy-prefix normaliser."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 4),
        model_writer=model,
        vocab_size=300,  # 256 byte pieces + specials + a few dozen pieces
        hard_vocab_limit=False,
        byte_fallback=True,
        user_defined_symbols=["<robot>"],
        minloglevel=2,
    )
    return sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())


@functools.cache
def bundled_processor() -> sentencepiece.SentencePieceProcessor:
    """The project's shipped small model (no dummy prefix, PaliGemma special ids)."""
    return sentencepiece.SentencePieceProcessor(model_file=str(BUNDLED_TOKENIZER_PATH))


PROCESSORS = {"trained": trained_processor, "bundled": bundled_processor}


def byte_id(processor: sentencepiece.SentencePieceProcessor, value: int) -> int:
    return processor.piece_to_id(f"<0x{value:02X}>")


def stream(processor: sentencepiece.SentencePieceProcessor, chunks: list[list[int]]) -> list[str]:
    detokenizer = IncrementalDetokenizer(processor)
    return [detokenizer.feed(chunk) for chunk in chunks] + [detokenizer.flush()]


@pytest.mark.parametrize("value", [0x41, 0x7F])
def test_ascii_bytes_are_emitted_at_once(value: int) -> None:
    assert num_incomplete_tail_bytes([value]) == 0


@pytest.mark.parametrize(
    ("byte_values", "expected"),
    [
        ([], 0),
        ([0xE2], 1),
        ([0xE2, 0x82], 2),
        ([0xE2, 0x82, 0xAC], 0),  # complete euro sign
        ([0x41, 0xF0, 0x9F, 0x99], 3),  # 'A' + three of four emoji bytes
        ([0xE2, 0x41], 0),  # broken by an ASCII byte: final U+FFFD + 'A'
        ([0x82], 0),  # stray continuation byte: final U+FFFD
        ([0xFF], 0),  # never valid
        ([0xE2, 0xE2, 0x82], 2),  # first lead is final U+FFFD, second may complete
        ([0xC3, 0xA9, 0xC3], 1),  # 'é' + an open lead byte
    ],
)
def test_num_incomplete_tail_bytes(byte_values: list[int], expected: int) -> None:
    assert num_incomplete_tail_bytes(byte_values) == expected


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_multibyte_character_split_across_frames_is_held_back(name: str) -> None:
    processor = PROCESSORS[name]()
    euro = [byte_id(processor, value) for value in (0xE2, 0x82, 0xAC)]
    detokenizer = IncrementalDetokenizer(processor)
    assert detokenizer.feed(euro[:1]) == ""
    assert detokenizer.num_held_ids == 1
    assert detokenizer.feed(euro[1:2]) == ""
    assert detokenizer.feed(euro[2:]) == "€"
    assert detokenizer.num_held_ids == 0
    assert detokenizer.flush() == ""
    assert detokenizer.text == processor.decode(euro) == "€"


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_incomplete_bytes_at_the_end_flush_as_replacement_characters(name: str) -> None:
    processor = PROCESSORS[name]()
    ids = [byte_id(processor, value) for value in (0x41, 0xF0, 0x9F)]
    detokenizer = IncrementalDetokenizer(processor)
    assert detokenizer.feed(ids) == "A"
    assert detokenizer.flush() == "\ufffd\ufffd"
    assert detokenizer.text == processor.decode(ids)
    assert detokenizer.flush() == ""
    with pytest.raises(ValueError, match="after flush"):
        detokenizer.feed([ids[0]])


def test_open_bytes_become_final_when_a_piece_follows() -> None:
    processor = trained_processor()
    word = processor.encode("the")
    ids = [byte_id(processor, 0xE2), *word]
    deltas = stream(processor, [ids[:1], ids[1:]])
    assert deltas[0] == ""
    assert "".join(deltas) == processor.decode(ids)
    assert deltas[1].startswith("\ufffd")


def test_leading_space_is_dropped_only_at_the_start_of_the_text() -> None:
    processor = trained_processor()  # dummy prefix: "the" is encoded as "▁the"
    the = processor.encode("the")
    assert processor.id_to_piece(the[0]).startswith("\u2581")
    deltas = stream(processor, [the, the, [], the])
    assert deltas[:4] == ["the", " the", "", " the"]
    # Control pieces produce no text, so the next piece still starts the text.
    deltas = stream(processor, [[processor.bos_id()], the, the])
    assert deltas[:3] == ["", "the", " the"]


def test_bundled_model_keeps_leading_spaces() -> None:
    processor = bundled_processor()  # no dummy prefix: a leading "▁" is a real space
    ids = processor.encode(" pick up the cube")
    text = "".join(stream(processor, [[token_id] for token_id in ids]))
    assert text == processor.decode(ids) == " pick up the cube"


def test_special_and_unknown_pieces_match_decode() -> None:
    processor = trained_processor()
    robot = processor.piece_to_id("<robot>")
    ids = [processor.unk_id(), robot, processor.eos_id(), *processor.encode("the cube")]
    deltas = stream(processor, [[token_id] for token_id in ids])
    assert "".join(deltas) == processor.decode(ids)
    assert deltas[0] == " \u2047 "


def test_encoded_text_round_trips_token_by_token() -> None:
    processor = trained_processor()
    text = "the robot picks up the é cube 🙂 and 日本"
    ids = processor.encode(text)
    assert any(processor.is_byte(token_id) for token_id in ids)
    deltas = stream(processor, [[token_id] for token_id in ids])
    assert "".join(deltas) == processor.decode(ids) == text


def test_anchor_is_an_ordinary_piece() -> None:
    for name in PROCESSORS:
        processor = PROCESSORS[name]()
        anchor = find_anchor_id(processor)
        assert not processor.is_control(anchor) and not processor.is_byte(anchor)
        assert processor.decode([anchor])
    with pytest.raises(ValueError, match="empty text"):
        IncrementalDetokenizer(trained_processor(), anchor_id=trained_processor().bos_id())


@st.composite
def id_streams(draw: st.DrawFn, name: str) -> tuple[list[int], list[int]]:
    """Random ids biased to byte pieces and specials, and random chunk sizes."""
    processor = PROCESSORS[name]()
    byte_ids = [i for i in range(processor.get_piece_size()) if processor.is_byte(i)]
    utf8_leads = [byte_id(processor, value) for value in (0xC3, 0xE2, 0xF0)]
    utf8_tails = [byte_id(processor, value) for value in (0x82, 0x9F, 0xA9, 0xAC)]
    token = st.one_of(
        st.integers(0, processor.get_piece_size() - 1),
        st.sampled_from(byte_ids),
        st.sampled_from(utf8_leads + utf8_tails),
        st.sampled_from([0, 1, 2, 3]),
    )
    ids = draw(st.lists(token, max_size=40))
    chunk_sizes = draw(st.lists(st.integers(0, 5), max_size=len(ids) + 2))
    return ids, chunk_sizes


def check_stream(name: str, ids: list[int], chunk_sizes: list[int]) -> None:
    processor = PROCESSORS[name]()
    expected = processor.decode(ids)
    detokenizer = IncrementalDetokenizer(processor)
    start = 0
    for size in chunk_sizes:
        detokenizer.feed(ids[start : start + size])
        start += size
        # Emitted text is final: a prefix of the text of any continuation.
        assert expected.startswith(detokenizer.text)
    detokenizer.feed(ids[start:])
    assert expected.startswith(detokenizer.text)
    detokenizer.flush()
    assert detokenizer.text == expected


@settings(max_examples=150, deadline=None)
@given(data=id_streams("trained"))
def test_property_trained_model(data: tuple[list[int], list[int]]) -> None:
    check_stream("trained", *data)


@settings(max_examples=150, deadline=None)
@given(data=id_streams("bundled"))
def test_property_bundled_model(data: tuple[list[int], list[int]]) -> None:
    check_stream("bundled", *data)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=30), chunk_sizes=st.lists(st.integers(0, 4), max_size=20))
def test_property_encoded_text(text: str, chunk_sizes: list[int]) -> None:
    processor = bundled_processor()
    check_stream("bundled", processor.encode(text), chunk_sizes)
