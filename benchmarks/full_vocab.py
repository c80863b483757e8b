"""A 257,152-piece tokenizer for randomly initialised engines, so that every decode step pays
the real language head (PaliGemma's tokenizer has 257,152 pieces; the bundled one 640, and the
engine cuts the head to the tokenizer's vocabulary).

Without PaliGemma's file (`$OPENPI_DATA_HOME/big_vision/paligemma_tokenizer.model`, which
cannot be downloaded here) the bundled model is padded with unused pieces to 257,152: prompts
encode exactly as with the bundled model, and sampled ids beyond it decode to their own text.
Used by oxygen_bench, engine_components and gpu_bench (loaded by path: benchmarks/ is not a
package).
"""

from __future__ import annotations

import os
import pathlib

PAD_PIECE = "<oxygen_pad_{}>"
VOCABS = ("tokenizer", "full")  # language head: the tokenizer's rows, or all 257,152


def padded_tokenizer_proto(base: pathlib.Path, size: int) -> bytes:
    """`base` SentencePiece model with user-defined pieces appended up to `size` pieces.

    The new pieces (`<oxygen_pad_i>`) never occur in prompts, so encoding is unchanged; they
    decode to their own text, so sampled ids beyond the base vocabulary detokenise.
    """
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.ParseFromString(base.read_bytes())
    user_defined = model_pb2.ModelProto.SentencePiece.USER_DEFINED
    for i in range(size - len(proto.pieces)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = PAD_PIECE.format(i), 0.0, user_defined
    return proto.SerializeToString()


def full_vocab_tokenizer(workdir: pathlib.Path) -> tuple[pathlib.Path, str]:
    """Makes randomly initialised engines (no tokenizer_path) read a 257,152-piece tokenizer.

    PaliGemma's own file wins where openpi cached it; otherwise the bundled model padded to
    257,152 pieces is written under `workdir` and OPENPI_DATA_HOME pointed there (read by
    `default_tokenizer_path` when an engine is built). Returns (path, kind); pass the path as
    `tokenizer_path` where an engine would otherwise take the bundled model.
    """
    from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, default_tokenizer_path
    from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH

    real = default_tokenizer_path()
    if real.is_file():
        return real, "paligemma"
    path = workdir / "big_vision" / "paligemma_tokenizer.model"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(padded_tokenizer_proto(BUNDLED_TOKENIZER_PATH, PALIGEMMA_VOCAB_SIZE))
    os.environ["OPENPI_DATA_HOME"] = str(workdir)
    assert default_tokenizer_path() == path
    return path, "bundled_padded"


def tokenizer_for(preset: str, vocab: str, workdir: pathlib.Path) -> tuple[str | None, str]:
    """The tokenizer a benchmark engine of `vocab` reads (its vocabulary is the language
    head's rows) and what it is: (path, kind).

    `tokenizer`: the tiny preset's bundled 640-piece model; for other presets the engine's own
    choice (None: PaliGemma's where openpi cached it, else the bundled one for random init).
    `full`: a 257,152-piece tokenizer (`full_vocab_tokenizer`: PaliGemma's or the bundled one
    padded).
    """
    from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH

    if vocab == "full":
        path, kind = full_vocab_tokenizer(workdir)
        return str(path), kind
    if vocab != "tokenizer":
        raise ValueError(f"unknown vocab {vocab!r}; known: {VOCABS}")
    if preset == "tiny":
        return str(BUNDLED_TOKENIZER_PATH), "bundled"
    return None, "engine default"
