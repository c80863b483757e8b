"""Rebuild the project's small SentencePiece model from the text it ships.

The real pi0.5 tokenizer (PaliGemma's SentencePiece, 257,152 pieces) cannot be downloaded on
the project's machines and no package ships it. For randomly initialised runs and tests the
engine uses this small model instead, trained offline from
`oxygen_ros/engine/assets/tokenizer_corpus.txt` (robot tasks in openpi's pi0.5 prompt format,
subtasks, narrations, memories, written for this project).

It is trained like Gemma's tokenizer is configured: BPE, byte fallback (every string
encodes, no unk), digits split, identity normalisation, no dummy prefix, whitespace kept, and
PaliGemma's special ids pad=0, eos=1, bos=2, unk=3.

With `--state-bins` it also gets one piece per discretised state value, "\u2581-1" (what
openpi writes for a normalised value below -1) and "\u25810" .. "\u2581255" (user-defined
pieces, matched longest first), written to
`oxygen_state_bins_tokenizer.model`. The action prompt's text is unchanged (openpi's pi0.5
format); only its tokens differ: every state number is one token instead of one per digit, so
the i-th state value always sits at the same distance from the end of the prompt, whatever
the instruction and the other values are.

Usage (from the repository root; deterministic, single-threaded):
    python scripts/build_tokenizer.py [--output PATH]
    python scripts/build_tokenizer.py --state-bins
"""

from __future__ import annotations

import argparse
import pathlib

import sentencepiece

ASSETS = pathlib.Path(__file__).resolve().parents[1] / "oxygen_ros" / "engine" / "assets"
CORPUS = ASSETS / "tokenizer_corpus.txt"
OUTPUT = ASSETS / "oxygen_tiny_tokenizer.model"
STATE_BINS_OUTPUT = ASSETS / "oxygen_state_bins_tokenizer.model"
VOCAB_SIZE = 640
NUM_STATE_BINS = 256  # engine/prompts.py: openpi's 256 state bins
# -1 too: openpi's discretisation writes it for a normalised value below -1.
STATE_BIN_PIECES = tuple(f"\u2581{b}" for b in range(-1, NUM_STATE_BINS))


def build(
    corpus: pathlib.Path,
    output: pathlib.Path,
    vocab_size: int = VOCAB_SIZE,
    state_bins: bool = False,
) -> None:
    """Trains the model from `corpus` and writes it to `output` (a .model file). With
    `state_bins`, the 257 state-value pieces (-1 .. 255) come on top of `vocab_size`."""
    proto = _train(corpus, vocab_size, STATE_BIN_PIECES if state_bins else ())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(proto)


def _train(corpus: pathlib.Path, vocab_size: int, user_pieces: tuple[str, ...]) -> bytes:
    import io

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size + len(user_pieces),
        user_defined_symbols=list(user_pieces),
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        num_threads=1,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    # The trainer records the corpus path; keep only the file name so the model is the same
    # bytes wherever the repository is checked out.
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    del proto.trainer_spec.input[:]
    proto.trainer_spec.input.append(corpus.name)
    return proto.SerializeToString(deterministic=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=pathlib.Path, default=CORPUS)
    parser.add_argument("--output", type=pathlib.Path, default=None)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument(
        "--state-bins", action="store_true", help="add one piece per state value (-1 .. 255)"
    )
    args = parser.parse_args()
    if args.output is None:
        args.output = STATE_BINS_OUTPUT if args.state_bins else OUTPUT
    build(args.corpus, args.output, args.vocab_size, args.state_bins)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
