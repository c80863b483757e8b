"""SentencePiece loading: PaliGemma's model from a configured path, or the project's own.

Real pi0.5 checkpoints need PaliGemma's SentencePiece model (257,152 pieces); openpi caches
it at `$OPENPI_DATA_HOME/big_vision/paligemma_tokenizer.model` (default `~/.cache/openpi`).
It cannot be downloaded here and no package ships it, so randomly initialised engines fall
back to `BUNDLED_TOKENIZER_PATH`: a 640-piece BPE model trained offline by
`scripts/build_tokenizer.py` from `assets/tokenizer_corpus.txt` (text written for this
project), with byte fallback and PaliGemma's special ids. `STATE_BINS_TOKENIZER_PATH` is the
same corpus with one piece per discretised state value (scripts/build_tokenizer.py).

Invariants:
- Special ids are PaliGemma's in both models: pad=0, eos=1, bos=2, unk=3.
- A checkpoint-backed engine never falls back: a missing tokenizer file is an error naming
  the path.
- Ids from the model head beyond `vocab_size` are never sampled (the engine cuts logits).
"""

from __future__ import annotations

import logging
import pathlib

import sentencepiece

from oxygen_ros.engine.config import EngineConfig, default_tokenizer_path

logger = logging.getLogger("oxygen_ros.engine")

ASSETS_DIR = pathlib.Path(__file__).resolve().parent / "assets"
BUNDLED_TOKENIZER_PATH = ASSETS_DIR / "oxygen_tiny_tokenizer.model"
# The same corpus with one piece per state value (" -1" .. " 255"): a training option
# (`--tokenizer-path`); a checkpoint trained with it carries it as its own tokenizer.
STATE_BINS_TOKENIZER_PATH = ASSETS_DIR / "oxygen_state_bins_tokenizer.model"
TOKENIZER_FILE = "tokenizer.model"  # a checkpoint's own tokenizer, next to its norm stats
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


class Tokenizer:
    """A SentencePiece processor with the few operations the engine needs."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"SentencePiece tokenizer model not found: {self.path}")
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=self.path.read_bytes())
        special = (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id())
        if special != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
            raise ValueError(
                f"tokenizer {self.path} has special ids (pad, eos, bos, unk)={special}; "
                f"PaliGemma's are {(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}"
            )

    @property
    def processor(self) -> sentencepiece.SentencePieceProcessor:
        """The SentencePiece processor (read only; the incremental detokenizer decodes with it)."""
        return self._sp

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    @property
    def eos_id(self) -> int:
        return EOS_ID

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        return list(self._sp.encode(text, add_bos=add_bos))

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return self._sp.decode(list(ids))


def resolve_tokenizer_path(config: EngineConfig) -> pathlib.Path:
    """Chooses the tokenizer file for an engine config.

    Explicit `tokenizer_path` wins; then the checkpoint's own tokenizer
    (`<checkpoint_dir>/assets/<assets_id>/tokenizer.model`, written by oxygen_ros.training);
    otherwise openpi's cached PaliGemma model. Without a checkpoint a missing PaliGemma model
    falls back to the bundled small model (logged); with a checkpoint it is an error naming
    the path.
    """
    if config.tokenizer_path is not None:
        path = pathlib.Path(config.tokenizer_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer_path does not exist: {path}")
        return path
    if config.checkpoint_dir is not None and config.assets_id is not None:
        own = pathlib.Path(config.checkpoint_dir) / "assets" / config.assets_id / TOKENIZER_FILE
        if own.is_file():
            return own
    path = default_tokenizer_path()
    if path.is_file():
        return path
    if config.checkpoint_dir is not None:
        raise FileNotFoundError(
            f"checkpoint {config.checkpoint_dir} needs the PaliGemma tokenizer, not found at "
            f"{path}; copy paligemma_tokenizer.model there or set tokenizer_path"
        )
    logger.warning(
        "PaliGemma tokenizer not found at %s; using the bundled small tokenizer %s",
        path,
        BUNDLED_TOKENIZER_PATH,
    )
    return BUNDLED_TOKENIZER_PATH


def load_tokenizer(config: EngineConfig) -> Tokenizer:
    return Tokenizer(resolve_tokenizer_path(config))
