"""Robot observation -> the model's batch-1 prefix inputs, as the engine serves them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from openpi.shared import image_tools

from oxygen_ros.engine import prompts
from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.model_fns import PrefixInputs
from oxygen_ros.engine.tokenizer import Tokenizer
from oxygen_ros.engine.types import Observation


def observation_to_inputs(
    observation: Observation,
    image_keys: Sequence[str],
    resolution: tuple[int, int],
    tokenizer: Tokenizer,
    normalizer: Normalizer,
    max_token_len: int,
) -> PrefixInputs:
    """Robot observation -> batch-1 model inputs (openpi's pi0.5 input transforms).

    Images are resized with pad (openpi `resize_with_pad`) if needed, then mapped from uint8
    to [-1, 1]; a missing slot is a black image with mask False. The state is normalised and
    written into the prompt (pi0.5 discrete state).
    """
    images, masks = {}, {}
    for key in image_keys:
        image = observation.images.get(key)
        if image is None:
            image = np.zeros((*resolution, 3), np.uint8)
            valid = False
        else:
            valid = bool(observation.image_masks.get(key, True))
        image = np.asarray(image)
        if image.dtype != np.uint8:
            raise ValueError(f"image {key!r} must be uint8 [h, w, 3], got {image.dtype}")
        if image.shape[:2] != tuple(resolution):
            image = np.asarray(image_tools.resize_with_pad(image, *resolution))
        images[key] = (image.astype(np.float32) / 255.0 * 2.0 - 1.0)[None]
        masks[key] = np.array([valid])
    state = normalizer.normalize_state(np.asarray(observation.state, np.float32))
    tokens, token_mask = prompts.tokenize_action_prompt(
        tokenizer, observation.prompt, state, max_token_len
    )
    return PrefixInputs(images, masks, tokens[None], token_mask[None])
