"""Which inputs a model class takes: its kind (causal LM, encoder, vision or audio model) and the
forward-input keys of each kind, with their defaults. Torch-free: recipes read it to check their
``inputs``, the input builders (:mod:`casedb.scan.inputs`) to build them."""

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
}
# Kinds that are encoders: one forward, no cache, so no decode phase.
NO_DECODE = {"encoder", "clip"}
# Multimodal models a recipe scans text-only, as their tracer does: a causal LM's inputs.
TEXT_ONLY = {"Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration"}
_KINDS = {"LlavaNextForConditionalGeneration": "llava_next", "GraniteSpeechForConditionalGeneration": "granite_speech",
          "Mistral3ForConditionalGeneration": "mistral3", "CLIPModel": "clip"}
_ENCODER_HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
_ENCODER_MODELS = {"BertModel", "RobertaModel", "XLMRobertaModel", "MPNetModel", "DistilBertModel"}


def kind_of(arch: str, where: str | None = None) -> str:
    """The kind of inputs a model class takes (a key of INPUT_DEFAULTS); ScanError if none."""
    if arch.endswith("ForCausalLM") or arch in TEXT_ONLY:
        return "causal_lm"
    if arch in _KINDS:
        return _KINDS[arch]
    if arch in _ENCODER_MODELS or arch.endswith(_ENCODER_HEADS):
        return "encoder"
    raise ScanError(f"no input builder for architecture {arch!r}; supported: *ForCausalLM, encoders (*Model, "
                    f"{', '.join('*' + h for h in _ENCODER_HEADS)}), {', '.join(sorted(_KINDS))}, "
                    f"{', '.join(sorted(TEXT_ONLY))} (text only)", where=where)
