"""Forward inputs of a scan: token ids, padding masks, caches and the image / audio inputs of each
kind of model, built from a recipe's ``inputs`` (batch, lengths, image size ...)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from casedb.scan.config import ScanError
from casedb.scan.kinds import ENCODER_DECODER, TEXT_ONLY

if TYPE_CHECKING:
    from casedb.scan.recipes import Recipe, ScanPath

# A static cache is allocated for the prompt plus this many new tokens (generate's max_length).
STATIC_CACHE_ROOM = 64
# ------------------------------------------------------------------------------ forward inputs

def _ids(batch: int, length: int, vocab: int, fill_from: int = 1):
    """Deterministic, in-vocabulary token ids (values only matter for placeholder tokens)."""
    return (torch.arange(batch * length).reshape(batch, length) * 7919 + fill_from) % vocab


def _padding(batch: int, length: int) -> list[int]:
    """Left-padding per row of a batch: the first prompt is the longest, the others are a quarter
    shorter (what a tokenizer gives for prompts of different lengths)."""
    return [0] + [max(1, length // 4)] * (batch - 1)


def _pad_id(config, vocab: int) -> int:
    pad = getattr(config, "pad_token_id", None)
    return pad if isinstance(pad, int) and 0 <= pad < vocab else 0


def prefill_inputs(recipe: Recipe, model, path: "ScanPath | None" = None) -> dict:
    """The forward inputs of the prefill (the encoders' only forward) on the path's inputs."""
    inp = path.inputs if path is not None else recipe.inputs
    return _BUILDERS[recipe.kind](model, inp, path)


def _text_ids(model, batch: int, length: int, fill_from: int = 1):
    """Token ids in the text vocabulary that are none of the model's special (image, audio ...)
    placeholder tokens, so a text-only forward never merges a modality it was not given."""
    cfg = model.config
    vocab = cfg.get_text_config(decoder=True).vocab_size
    ids = _ids(batch, length, vocab, fill_from)
    specials = {v for k, v in vars(cfg).items() if k.endswith(("_token_id", "_token_index")) and isinstance(v, int)
                and k not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    for token in specials:
        ids[ids == token] = (token + 1) % vocab
    return ids


def _causal_lm(model, inp: dict, path) -> dict:
    batch, length = int(inp["batch"]), int(inp["seq_len"])
    text_config = model.config.get_text_config(decoder=True)
    input_ids = _text_ids(model, batch, length)
    pads = _padding(batch, length)
    for row, pad in enumerate(pads):
        input_ids[row, :pad] = _pad_id(text_config, text_config.vocab_size)
    return {"input_ids": input_ids, **_mask_and_cache(model, pads, length, path), **_GENERATE}


def _llava_next(model, inp: dict, path) -> dict:
    cfg, batch, text_len = model.config, int(inp["batch"]), int(inp["text_len"])
    text_vocab, pads = cfg.text_config.vocab_size, _padding(batch, text_len)
    height, width = (int(x) for x in inp["image_size"])
    image_sizes = torch.tensor([[height, width]] * batch)
    patches, num_tokens = _llava_image_tokens(model, height, width)
    size = cfg.vision_config.image_size
    input_ids = _with_placeholders(_ids(batch, text_len, min(text_vocab, cfg.image_token_index)), num_tokens,
                                   cfg.image_token_index, pads, _pad_id(cfg.get_text_config(decoder=True), text_vocab))
    pixel_values = torch.empty(batch, patches, 3, size, size, dtype=model.dtype, device="meta")
    return {"input_ids": input_ids, "pixel_values": pixel_values, "image_sizes": image_sizes,
            **_mask_and_cache(model, pads, input_ids.shape[1], path), **_GENERATE}


def _granite_speech(model, inp: dict, path) -> dict:
    # input_features are stacked log-mel frames (2 x 80 mels); the projector turns each window of
    # `window_size` frames into window_size // downsample_rate audio tokens.
    cfg, batch, text_len = model.config, int(inp["batch"]), int(inp["text_len"])
    text_vocab, pads = cfg.text_config.vocab_size, _padding(batch, text_len)
    frames = int(inp["audio_frames"])
    num_tokens = math.ceil(frames / cfg.window_size) * (cfg.window_size // cfg.downsample_rate)
    input_ids = _with_placeholders(_ids(batch, text_len, min(text_vocab, cfg.audio_token_index)), num_tokens,
                                   cfg.audio_token_index, pads, _pad_id(cfg.get_text_config(decoder=True), text_vocab))
    features = torch.empty(batch, frames, cfg.encoder_config.input_dim, dtype=model.dtype, device="meta")
    mask = torch.ones(batch, num_tokens, dtype=torch.bool)
    return {"input_ids": input_ids, "input_features": features, "input_features_mask": mask,
            **_mask_and_cache(model, pads, input_ids.shape[1], path), **_GENERATE}


def _mistral3(model, inp: dict, path) -> dict:
    # One image per prompt: the Pixtral tower sees (height/patch) x (width/patch) patches, which
    # the projector merges spatial_merge_size^2 to one placeholder token each.
    cfg, batch, text_len = model.config, int(inp["batch"]), int(inp["text_len"])
    height, width = (int(x) for x in inp["image_size"])
    step = cfg.vision_config.patch_size * cfg.spatial_merge_size
    if height % step or width % step:
        raise ScanError(f"image_size {height}x{width} is not a multiple of patch_size x spatial_merge_size = {step} "
                        "(the processor resizes to one)")
    num_tokens = (height // step) * (width // step)
    pads = _padding(batch, text_len)
    input_ids = _with_placeholders(_text_ids(model, batch, text_len), num_tokens, cfg.image_token_index, pads,
                                   _pad_id(cfg.get_text_config(decoder=True), cfg.text_config.vocab_size))
    pixel_values = torch.empty(batch, 3, height, width, dtype=model.dtype, device="meta")
    return {"input_ids": input_ids, "pixel_values": pixel_values, "image_sizes": torch.tensor([[height, width]] * batch),
            **_mask_and_cache(model, pads, input_ids.shape[1], path), **_GENERATE}


def _encoder(model, inp: dict, path) -> dict:
    """Text with its attention mask, as a tokenizer gives it: a padded batch pads on the right."""
    batch, length = int(inp["batch"]), int(inp["seq_len"])
    input_ids, mask = _text_ids(model, batch, length), torch.ones(batch, length, dtype=torch.long)
    for row, pad in enumerate(_padding(batch, length)):
        if pad:
            input_ids[row, length - pad:] = _pad_id(model.config, model.config.vocab_size)
            mask[row, length - pad:] = 0
    return {"input_ids": input_ids, "attention_mask": mask}


def _clip(model, inp: dict, path) -> dict:
    """Texts (``batch`` of them, padded to ``seq_len``) and ``images`` images at the tower's size."""
    text = _encoder(model.text_model, inp, path)
    vision = model.config.vision_config
    pixel_values = torch.empty(int(inp["images"]), 3, vision.image_size, vision.image_size, dtype=model.dtype,
                               device="meta")
    return {**text, "pixel_values": pixel_values}


def _seq2seq(model, inp: dict, path) -> dict:
    """The encoder's (right-padded) text and the decoder's prompt: what generate's first step runs."""
    return {**_encoder(model, inp, path), **_decoder_prompt(model, inp, path)}


def _whisper(model, inp: dict, path) -> dict:
    """Log-mel features of the length the config's encoder takes (30 s: 3000 frames for the
    released models; it refuses any other), then the decoder's prompt."""
    cfg, batch = model.config, int(inp["batch"])
    frames = 2 * cfg.max_source_positions  # the two convolutions halve it to the positions
    features = torch.empty(batch, cfg.num_mel_bins, frames, dtype=model.dtype, device="meta")
    return {"input_features": features, **_decoder_prompt(model, inp, path)}


def _audio_encoder(model, inp: dict, path) -> dict:
    """Raw waveform samples (Wav2Vec2's input_values); no mask, as its group-norm checkpoints run."""
    samples = torch.empty(int(inp["batch"]), int(inp["audio_samples"]), dtype=model.dtype, device="meta")
    return {"input_values": samples}


def _decoder_prompt(model, inp: dict, path) -> dict:
    """``decoder_len`` decoder tokens, the first the decoder start token, with the cache generate keeps."""
    if path is not None and path.cache == "static":
        raise ScanError(f"path {path.name}: a static cache is built for decoder-only models; an encoder-decoder "
                        "scan keeps generate's dynamic self- and cross-attention cache: drop the cache axis")
    cfg, batch, length = model.config, int(inp["batch"]), int(inp["decoder_len"])
    vocab = cfg.get_text_config(decoder=True).vocab_size
    ids = _ids(batch, length, vocab, fill_from=3)
    start = getattr(cfg, "decoder_start_token_id", None)
    start = start if isinstance(start, int) else getattr(cfg, "pad_token_id", None)  # T5 starts from its pad token
    ids[:, 0] = start if isinstance(start, int) and 0 <= start < vocab else 0
    return {"decoder_input_ids": ids, "use_cache": True}


_GENERATE = {"use_cache": True, "logits_to_keep": 1}
_BUILDERS = {"causal_lm": _causal_lm, "llava_next": _llava_next, "granite_speech": _granite_speech,
             "mistral3": _mistral3, "encoder": _encoder, "clip": _clip, "seq2seq": _seq2seq, "whisper": _whisper,
             "audio_encoder": _audio_encoder}


def _with_placeholders(ids, num_tokens: int, token: int, pads: list[int], pad_id: int):
    """Each row: its left padding, the first text token, the placeholders, the rest of its text."""
    rows = []
    for row, pad in enumerate(pads):
        text = ids[row, :ids.shape[1] - pad]
        rows.append(torch.cat([torch.full((pad,), pad_id), text[:1], torch.full((num_tokens,), token), text[1:]]))
    return torch.stack(rows)


def _mask_and_cache(model, pads: list[int], length: int, path: "ScanPath | None") -> dict:
    """The attention mask of a padded batch, and the static cache a static path pre-allocates."""
    extra = {}
    if any(pads):
        mask = torch.ones(len(pads), length, dtype=torch.long)
        for row, pad in enumerate(pads):
            mask[row, :pad] = 0
        extra["attention_mask"] = mask
    if path is not None and path.cache == "static":
        from transformers import StaticCache

        extra["past_key_values"] = StaticCache(config=model.config.get_text_config(decoder=True),
                                               max_cache_len=length + STATIC_CACHE_ROOM)
    elif type(model).__name__ in TEXT_ONLY:
        # Gemma 4 builds its masks before its text model makes a cache: without one (generate
        # always passes one) the masks look for packed sequences, reading meta positions.
        from transformers import DynamicCache

        extra["past_key_values"] = DynamicCache(config=model.config.get_text_config(decoder=True))
    return extra


def _llava_image_tokens(model, height: int, width: int) -> int:
    """How many placeholder tokens one image of (height, width) becomes (the processor's count),
    computed with the model's own packing code on meta features (not recorded)."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    cfg = model.config
    patches = image_size_to_num_patches((height, width), cfg.image_grid_pinpoints, cfg.vision_config.image_size)
    side = cfg.vision_config.image_size // cfg.vision_config.patch_size
    feats = torch.empty(patches, side * side, cfg.text_config.hidden_size, device="meta")
    packed, _ = model.model.pack_image_features(
        [feats], torch.tensor([[height, width]]), cfg.vision_feature_select_strategy,
        image_newline=model.model.image_newline,
    )
    return patches, packed[0].shape[0]


def decode_inputs(recipe: Recipe, model, prefill_out, path: "ScanPath | None" = None,
                   prefill: dict | None = None) -> dict:
    """One new token per sequence on top of the prefill's cache (and the padded batch's mask)."""
    cache = prefill_out.past_key_values
    if cache is None:
        raise ScanError(f"{recipe.arch} returned no cache from the prefill; cannot scan a decode step",
                        where=recipe.source)
    batch = int((path.inputs if path is not None else recipe.inputs)["batch"])
    if recipe.kind in ENCODER_DECODER:
        return _decoder_step(model, prefill_out, prefill or {}, batch)
    out = {"input_ids": _text_ids(model, batch, 1, fill_from=11), "past_key_values": cache,
           "use_cache": True, "logits_to_keep": 1}
    mask = (prefill or {}).get("attention_mask")
    if mask is not None:
        out["attention_mask"] = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
    return out



def _decoder_step(model, prefill_out, prefill: dict, batch: int) -> dict:
    """One decoder token on the prefill's self- and cross-attention cache, the encoder's output
    passed back as generate passes it (the encoder never runs again)."""
    from transformers.modeling_outputs import BaseModelOutput

    encoder_out = BaseModelOutput(last_hidden_state=prefill_out.encoder_last_hidden_state)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    out = {"encoder_outputs": encoder_out, "decoder_input_ids": _ids(batch, 1, vocab, fill_from=11),
           _cache_key(model): prefill_out.past_key_values, "use_cache": True}
    if prefill.get("attention_mask") is not None:  # the encoder's padding, for cross-attention
        out["attention_mask"] = prefill["attention_mask"]
    return out


def _cache_key(model) -> str:
    """The forward's name for the cache (transformers 5 renames past_key_values to cache)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
