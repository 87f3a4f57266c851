"""casedb scan of encoder-decoder and audio models (issue 44 item 2): T5 and Whisper scan their
encoder, their decoder and its cross-attention, a prefill then a decode step on the cache; Wav2Vec2
takes raw audio; classes the input builders would scan as another graph are refused.

Configs are transformers' own classes at 2 layers and small widths, written here (no download),
scanned on the meta device.
"""

import json

import pytest

from casedb.scan import scanner
from casedb.scan.config import ScanError

SDPA = "torch.nn.functional.scaled_dot_product_attention"


def _config(tmp_path, name, cls_name, arch, **sizes):
    import transformers

    path = tmp_path / f"{name}.json"
    getattr(transformers, cls_name)(architectures=[arch], **sizes).to_json_file(str(path))
    return path


def t5(tmp_path, arch="T5ForConditionalGeneration"):
    return _config(tmp_path, "tiny-t5", "T5Config", arch, vocab_size=128, d_model=32, d_kv=8, d_ff=64,
                   num_layers=2, num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=16)


def whisper(tmp_path, arch="WhisperForConditionalGeneration"):
    # max_source_positions 32: the encoder takes 64 log-mel frames (the released models: 1500, 3000)
    return _config(tmp_path, "tiny-whisper", "WhisperConfig", arch, vocab_size=128, num_mel_bins=16, d_model=32,
                   encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                   encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=32, max_target_positions=64,
                   decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def wav2vec2(tmp_path, arch="Wav2Vec2ForSequenceClassification"):
    return _config(tmp_path, "tiny-wav2vec2", "Wav2Vec2Config", arch, vocab_size=32, hidden_size=32,
                   num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
                   conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                   num_conv_pos_embedding_groups=4)


def attention_shapes(result):
    """(query length, key length) of every scaled_dot_product_attention call."""
    return {(c["case"]["inputs"][0]["tensor"]["shape"][2], c["case"]["inputs"][1]["tensor"]["shape"][2])
            for c in result.cases if c["case"]["op"] == SDPA}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["T5ForConditionalGeneration", "T5Model"])
def test_t5_scans_encoder_decoder_cross_attention_and_a_decode_step(tmp_path, arch):
    result = scanner.scan(t5(tmp_path), arch=arch)
    assert result.header["phase"] == "prefill+decode"
    # 128 encoder tokens (the seq2seq default), a 1-token decoder prompt, then one new token:
    # encoder self-attention, decoder self-attention, cross-attention (the same in both phases),
    # and the decode step's self-attention on the cached prompt token
    assert attention_shapes(result) == {(128, 128), (1, 1), (1, 128), (1, 2)}
    sites = {c["where"].split(":")[0].rsplit("/", 1)[-1] for c in result.cases}
    assert "modeling_t5.py" in sites


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["WhisperForConditionalGeneration", "WhisperModel"])
def test_whisper_scans_log_mel_features_encoder_decoder_and_cross_attention(tmp_path, arch):
    result = scanner.scan(whisper(tmp_path), arch=arch)
    convs = [c for c in result.cases if c["case"]["op"] == "torch.nn.functional.conv1d"]
    # input_features [batch, num_mel_bins, 2 * max_source_positions]: 16 mels, 64 frames
    assert convs[0]["case"]["inputs"][0]["tensor"]["shape"] == [1, 16, 64]
    # encoder over 32 positions, a 4-token decoder prompt (<|startoftranscript|> ...), its
    # cross-attention to the 32 encoder states, then one decode step (5 cached positions)
    assert attention_shapes(result) == {(32, 32), (4, 4), (4, 32), (1, 5), (1, 32)}


@pytest.mark.slow
def test_wav2vec2_scans_raw_audio(tmp_path):
    result = scanner.scan(wav2vec2(tmp_path))
    first_conv = next(c for c in result.cases if c["case"]["op"] == "torch.nn.functional.conv1d")
    assert first_conv["case"]["inputs"][0]["tensor"]["shape"] == [1, 1, 16000]  # 1 s at 16 kHz
    # its masked_spec_embed is made on the CPU whatever the device context: moved to meta too
    model = scanner._build(scanner.load_recipe(wav2vec2(tmp_path)))
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize("config, arch, why", [
    (t5, "T5ForSequenceClassification", "its config (t5) is an encoder-decoder model, but the encoder input builder"),
    (whisper, "WhisperForCausalLM", "its config (whisper) is an encoder-decoder model, but the causal_lm input builder"),
    (wav2vec2, "HubertForSequenceClassification", "its forward takes input_values, not the input_ids"),
])
def test_lookalike_classes_are_refused_not_scanned_as_another_graph(tmp_path, config, arch, why):
    with pytest.raises(ScanError) as err:
        scanner.scan(config(tmp_path), arch=arch)
    message = str(err.value)
    assert f"cannot scan {arch}: {why}" in message
    assert "T5ForConditionalGeneration" in message and "WhisperForConditionalGeneration" in message


@pytest.mark.slow
def test_cli_scan_of_a_seq2seq_model_imports_its_cases(cli, tmp_path, db_path):
    out = tmp_path / "t5.jsonl"
    summary = cli.json("scan", t5(tmp_path), "--output", out, "--import")
    assert summary["import"]["records"] == summary["unique_calls"] and summary["import"]["new_cases"] > 100
    assert json.loads(out.read_text().splitlines()[0])["arch"] == "T5ForConditionalGeneration"
    refused = cli("scan", whisper(tmp_path), "--arch", "WhisperForCausalLM", "--output", out)
    assert refused.exit_code == 2 and "cannot scan WhisperForCausalLM" in refused.stderr


def test_a_static_cache_path_of_an_encoder_decoder_is_refused(tmp_path):
    recipe = tmp_path / "t5.yaml"
    recipe.write_text(f"model: t5\nconfig: {t5(tmp_path)}\narch: T5ForConditionalGeneration\n"
                      "inputs: {seq_len: 8}\nmatrix:\n  cache: [dynamic, static]\n")
    with pytest.raises(ScanError, match="path static: a static cache is built for decoder-only models"):
        scanner.scan(recipe, path="static")


def test_the_shipped_seq2seq_and_audio_recipes_take_their_inputs():
    t5_small, whisper_tiny = scanner.load_recipe("t5-small"), scanner.load_recipe("whisper-tiny")
    assert (t5_small.kind, t5_small.inputs) == ("seq2seq", {"batch": 1, "seq_len": 128, "decoder_len": 1})
    assert (whisper_tiny.kind, whisper_tiny.inputs) == ("whisper", {"batch": 1, "decoder_len": 4})
