"""pi0.5 as an nnx module assembled from openpi's own modules, with a configurable image tower.

openpi's `Pi0.__init__` hard-codes the SigLIP `So400m/14` tower; `Pi05Model` builds the same
model from the same openpi modules (`openpi.models.gemma.Module` with two expert configs and
adaRMS on the action expert, `openpi.models.siglip.Module`, nnx `Linear` projections and the
time MLP) but takes the tower variant from `ModelConfig`. Nothing of openpi is copied or
patched; only its modules are instantiated.

Axes: B batch, S prefix length, A action horizon, J action dim, D prefix LLM width,
W action expert width, V vocabulary (257,152 rows of the tied embedding).

Invariants:
- The parameter tree (paths, shapes, dtypes) equals openpi's `Pi0(Pi0Config(pi05=True, ...))`
  for the same Gemma variants when `vision_variant="So400m/14"`, so openpi checkpoints load
  unchanged. Parameters are created in openpi's order from the same rng stream.
- The module keeps no hidden state: caches are data passed through `model_fns`.
- At random init the adaRMS modulation and the SigLIP head are zero, so actions ignore the
  observation until real (or perturbed) parameters are loaded.
"""

# jaxtyping shape strings ("b s d") are not Python expressions; pyflakes' F722 misreads them.

from __future__ import annotations

import einops
import flax.nnx as nnx
import flax.nnx.bridge as nnx_bridge
import jax
import jax.numpy as jnp
import numpy as np
import openpi.models.gemma as _gemma
import openpi.models.siglip as _siglip
from jaxtyping import Array, Bool, Float, Int
from openpi.models.pi0 import posemb_sincos

from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, ModelConfig

# Gemma shapes between openpi's `dummy` (width 64) and `gemma_300m` (width 1024, depth 18), for
# models trained on a CPU: openpi's own `gemma.Config`, filled in here; every other variant
# name is openpi's (`gemma.get_config`). Both experts of a model must share depth, heads, kv
# heads and head dim (openpi's `gemma.Module` requires it).
SMALL_GEMMA_VARIANTS = {
    "oxygen_w256": dict(
        width=256, depth=4, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=32
    ),
    # An action expert four times as wide as `dummy` that still pairs with a `dummy` prefix
    # LLM: dummy's depth, heads, kv heads and head dim (as gemma_300m pairs with gemma_2b).
    "oxygen_e256": dict(
        width=256, depth=4, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=16
    ),
}


def gemma_config(variant: str) -> _gemma.Config:
    """openpi's `gemma.Config` of `variant`: a `SMALL_GEMMA_VARIANTS` name or openpi's own."""
    if variant in SMALL_GEMMA_VARIANTS:
        return _gemma.Config(**SMALL_GEMMA_VARIANTS[variant])
    return _gemma.get_config(variant)  # type: ignore[arg-type]


# openpi's time embedding period range for the flow-matching timestep (pi0.py).
TIME_MIN_PERIOD = 4e-3
TIME_MAX_PERIOD = 4.0


def _embedder_decode(module: _gemma.Module, hidden: Array) -> Array:
    """Runs openpi's tied-embedding output head inside the linen module."""
    return module.embedder.decode(hidden)


def _embedder_decode_first(vocab_size: int):
    """Tied-embedding head over the first `vocab_size` rows only (small tokenizers)."""

    def decode(module: _gemma.Module, hidden: Array) -> Array:
        table = module.embedder.input_embedding_table[:vocab_size]
        return jnp.dot(hidden, table.T)

    return decode


class Pi05Model(nnx.Module):
    """pi0.5: PaliGemma (SigLIP + Gemma) prefix LLM and an adaRMS action expert."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs) -> None:
        self.config = config
        llm_config = gemma_config(config.paligemma_variant)
        expert_config = gemma_config(config.action_expert_variant)
        llm = nnx_bridge.ToNNX(
            _gemma.Module(
                configs=[llm_config, expert_config], embed_dtype=config.dtype, adarms=True
            )
        )
        llm.lazy_init(rngs=rngs, method="init", use_adarms=[False, True])
        img = nnx_bridge.ToNNX(
            _siglip.Module(
                num_classes=llm_config.width,
                variant=config.vision_variant,
                pool_type="none",
                scan=True,
                dtype_mm=config.dtype,
            )
        )
        img.lazy_init(jnp.ones((1, *config.image_resolution, 3)), train=False, rngs=rngs)
        # Attribute names and creation order are openpi's Pi0(pi05=True): they define the tree.
        self.PaliGemma = nnx.Dict(llm=llm, img=img)
        width = expert_config.width
        self.action_in_proj = nnx.Linear(config.action_dim, width, rngs=rngs)
        self.time_mlp_in = nnx.Linear(width, width, rngs=rngs)
        self.time_mlp_out = nnx.Linear(width, width, rngs=rngs)
        self.action_out_proj = nnx.Linear(width, config.action_dim, rngs=rngs)

    @property
    def llm(self) -> nnx_bridge.ToNNX:
        """openpi's two-expert Gemma (`openpi.models.gemma.Module`)."""
        return self.PaliGemma["llm"]

    def embed_tokens(self, tokens: Int[Array, "b t"]) -> Float[Array, "b t d"]:
        return self.llm(tokens, method="embed")

    def logits(
        self, hidden: Float[Array, "*n d"], vocab_size: int | None = None
    ) -> Float[Array, "*n v"]:
        """Tied-embedding output head (openpi `Embedder.decode`).

        With `vocab_size` smaller than the table, only the first `vocab_size` rows are used
        (equal to slicing the full logits, without computing the rest: the table always
        has 257,152 rows, the project's small tokenizer 640).
        """
        if vocab_size is None or vocab_size >= PALIGEMMA_VOCAB_SIZE:
            return self.llm(hidden, method=_embedder_decode)
        return self.llm(hidden, method=_embedder_decode_first(vocab_size))

    def embed_prefix(
        self,
        images: dict[str, Float[Array, "b h w 3"]],
        image_masks: dict[str, Bool[Array, " b"]],
        tokens: Int[Array, "b l"],
        token_mask: Bool[Array, "b l"],
        slots: tuple[str, ...] | None = None,
    ) -> tuple[Float[Array, "b s d"], Bool[Array, "b s"], Bool[Array, " s"]]:
        """Image tokens of every slot (in `config.image_keys` order) then prompt tokens.

        Images are float in [-1, 1] at `config.image_resolution`. Returns the embeddings,
        the validity mask and openpi's autoregressive mask (all False: bidirectional prefix).
        `slots` (a subset of `config.image_keys`): only those slots are encoded (None: all).
        """
        embeddings, masks = [], []
        keys = self.config.image_keys if slots is None else slots
        for key in keys:
            image_tokens, _ = self.PaliGemma["img"](images[key], train=False)
            embeddings.append(image_tokens)
            masks.append(einops.repeat(image_masks[key], "b -> b s", s=image_tokens.shape[1]))
        embeddings.append(self.embed_tokens(tokens))
        masks.append(token_mask)
        embedded = jnp.concatenate(embeddings, axis=1)
        mask = jnp.concatenate(masks, axis=1)
        return embedded, mask, jnp.zeros((embedded.shape[1],), dtype=bool)

    def embed_suffix(
        self, noisy_actions: Float[Array, "b a j"], timestep: Float[Array, " b"]
    ) -> tuple[Float[Array, "b a w"], Float[Array, "b w"]]:
        """Action tokens and the adaRMS condition (time MLP of the sin-cos timestep)."""
        action_tokens = self.action_in_proj(noisy_actions)
        time_emb = posemb_sincos(
            timestep, self.action_in_proj.out_features, TIME_MIN_PERIOD, TIME_MAX_PERIOD
        )
        time_emb = nnx.swish(self.time_mlp_in(time_emb))
        time_emb = nnx.swish(self.time_mlp_out(time_emb))
        return action_tokens, time_emb


def _init_state(config: ModelConfig, key: jax.Array) -> nnx.State:
    state = nnx.state(Pi05Model(config, nnx.Rngs(key)))
    return jax.tree.map(lambda x: x.astype(config.param_dtype), state)


def create_model(config: ModelConfig, seed: int = 0) -> Pi05Model:
    """Randomly initialised model, parameters in `config.param_dtype` (init runs jitted)."""
    graphdef = nnx.graphdef(abstract_model(config))
    state = jax.jit(_init_state, static_argnums=0)(config, jax.random.key(seed))
    return nnx.merge(graphdef, state)


def abstract_model(config: ModelConfig) -> Pi05Model:
    """Shape-only model (no parameter memory), e.g. for tree checks of the real preset."""

    def build() -> Pi05Model:
        model = Pi05Model(config, nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        return nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(config.param_dtype), state))

    return nnx.eval_shape(build)


def param_shapes(model: Pi05Model) -> dict[str, tuple[tuple[int, ...], str]]:
    """Flat {"a/b/c": (shape, dtype)} of every parameter, for tree comparisons."""
    out = {}
    for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = leaf.get_value()
        out["/".join(str(p) for p in path)] = (tuple(value.shape), str(value.dtype))
    return out


def param_count(model: Pi05Model) -> int:
    """Number of parameters, from shapes only (works on `abstract_model`)."""
    return int(sum(np.prod(shape) for shape, _ in param_shapes(model).values()))
