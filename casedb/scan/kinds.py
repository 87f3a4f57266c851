"""Which inputs a model class takes: its kind (causal LM, encoder, encoder-decoder, vision or audio
model) and the forward-input keys of each kind, with their defaults. Torch-free: recipes read it to
check their ``inputs``, the input builders (:mod:`casedb.scan.inputs`) to build them, and the
scanner (:func:`refuse_lookalike`) to refuse a class whose forward the builder would not make."""

from __future__ import annotations

from casedb.scan.config import ScanError

# Forward-input keys each kind of model takes (see prefill_inputs); values are the defaults
# used when scanning a bare config.json.
INPUT_DEFAULTS = {
    "causal_lm": {"batch": 1, "seq_len": 256},
    "llava_next": {"batch": 1, "text_len": 32, "image_size": [768, 768]},
    "granite_speech": {"batch": 1, "text_len": 32, "audio_frames": 500},
    "mistral3": {"batch": 1, "text_len": 32, "image_size": [392, 532]},
    "encoder": {"batch": 1, "seq_len": 128},
    "clip": {"batch": 1, "seq_len": 8, "images": 1},
    # encoder-decoder: the encoder's text and the decoder's prompt (generate starts T5 from one
    # decoder_start_token; Whisper from <|startoftranscript|><|lang|><|task|><|notimestamps|>)
    "seq2seq": {"batch": 1, "seq_len": 128, "decoder_len": 1},
    # Whisper: log-mel input_features [batch, num_mel_bins, 2 * max_source_positions] (the
    # length is the config's: its encoder refuses any other), then the decoder's prompt.
    "whisper": {"batch": 1, "decoder_len": 4},
    # Wav2Vec2: raw 16 kHz waveform samples (input_values [batch, audio_samples]); one forward.
    "audio_encoder": {"batch": 1, "audio_samples": 16000},
}
# Kinds that are encoders: one forward, no cache, so no decode phase.
NO_DECODE = {"encoder", "clip", "audio_encoder"}
# Encoder-decoder kinds: a prefill of encoder and decoder, then decode steps on the cached encoder output.
ENCODER_DECODER = {"seq2seq", "whisper"}
# Multimodal models a recipe scans text-only, as their tracer does: a causal LM's inputs.
TEXT_ONLY = {"Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration"}
_KINDS = {"LlavaNextForConditionalGeneration": "llava_next", "GraniteSpeechForConditionalGeneration": "granite_speech",
          "Mistral3ForConditionalGeneration": "mistral3", "CLIPModel": "clip",
          "T5ForConditionalGeneration": "seq2seq", "T5Model": "seq2seq",
          "WhisperForConditionalGeneration": "whisper", "WhisperModel": "whisper",
          "Wav2Vec2Model": "audio_encoder", "Wav2Vec2ForCTC": "audio_encoder",
          "Wav2Vec2ForSequenceClassification": "audio_encoder"}
# The forward input each kind's builder makes first: a class whose forward takes none of it is
# another kind of model (raw audio given token ids ...), refused by refuse_lookalike.
_PRIMARY = {"seq2seq": "input_ids", "whisper": "input_features", "audio_encoder": "input_values",
            "clip": "pixel_values"}
_ENCODER_HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
_ENCODER_MODELS = {"BertModel", "RobertaModel", "XLMRobertaModel", "MPNetModel", "DistilBertModel"}


def kind_of(arch: str, where: str | None = None) -> str:
    """The kind of inputs a model class takes (a key of INPUT_DEFAULTS); ScanError if none."""
    if arch in _KINDS:
        return _KINDS[arch]
    if arch.endswith("ForCausalLM") or arch in TEXT_ONLY:
        return "causal_lm"
    if arch in _ENCODER_MODELS or arch.endswith(_ENCODER_HEADS):
        return "encoder"
    raise ScanError(f"no input builder for architecture {arch!r}; {supported()}", where=where)


def supported() -> str:
    """The model classes a scan can build inputs for, in words (for messages)."""
    return (f"supported: decoder-only *ForCausalLM, text encoders ({', '.join(sorted(_ENCODER_MODELS))}, "
            f"{', '.join('*' + h for h in _ENCODER_HEADS)} of an encoder-only model), "
            f"{', '.join(sorted(_KINDS))}, {', '.join(sorted(TEXT_ONLY))} (text only)")


def refuse_lookalike(arch: str, kind: str, forward, config, where: str | None = None) -> None:
    """Refuse a class the ``kind``'s builder would scan as another graph: an encoder-decoder
    config under a decoder-only or encoder builder (T5ForSequenceClassification, the decoder alone
    of WhisperForCausalLM: no encoder, no cross-attention), or a forward that does not take the
    builder's first input (Wav2Vec2 heads take raw audio, not token ids)."""
    import inspect

    takes = set(inspect.signature(forward).parameters)
    primary = _PRIMARY.get(kind, "input_ids")
    why = None
    if getattr(config, "is_encoder_decoder", False) and kind not in ENCODER_DECODER:
        why = (f"its config ({config.model_type}) is an encoder-decoder model, but the {kind} input builder "
               "runs one stack: the scan would miss the encoder or the cross-attention")
    elif primary not in takes:
        firsts = [n for n in takes if n.startswith("input_") or n == "pixel_values"]
        why = (f"its forward takes {', '.join(sorted(firsts)) or 'other inputs'}, not the {primary} the {kind} "
               "input builder makes")
    if why:
        raise ScanError(f"cannot scan {arch}: {why}; give a supported class in the recipe's arch (or --arch) ({supported()})",
                        where=where)
