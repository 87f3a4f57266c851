"""Hostile recipes and configs for `casedb scan` (issue 24, items 4, 8 and 9).

A config with ``auto_map`` made transformers ask "run the custom code?" on stdin (answering y ran
the config's Python); a 195-byte config with 10⁶ layers built for 53 s and 2.5 GB before a
MemoryError; an Auto class as the architecture raised AttributeError. Each is refused with the
key named, exit 2, nothing run or written; the refusal's cost is measured in a child process
against a baseline refusal (interpreter, torch and casedb start) measured in the same test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_hostile import measure_apart
from casedb.scan import scanner as scan

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128}
EVIL_CODE = "import pathlib\npathlib.Path(__file__).with_name('PWNED').write_text('ran')\n" \
            "from transformers import LlamaConfig\n\n\nclass EvilConfig(LlamaConfig):\n    model_type = 'h24evil'\n"


def write_config(path: Path, **changes) -> Path:
    path.write_text(json.dumps({**TINY, **changes}))
    return path


def casedb(tmp_path, *args) -> list[str]:
    return [sys.executable, "-m", "casedb", "--db", str(tmp_path / "x.db"), *map(str, args)]


@pytest.mark.slow
def test_config_code_never_runs_and_stdin_is_never_read(tmp_path):
    model = tmp_path / "evil"
    model.mkdir()
    write_config(model / "config.json", model_type="h24evil", auto_map={"AutoConfig": "evil_config.EvilConfig"})
    (model / "evil_config.py").write_text(EVIL_CODE)
    recipe = tmp_path / "evil.yaml"
    recipe.write_text("model: evil\nconfig: evil\narch: LlamaForCausalLM\ninputs: {batch: 1, seq_len: 8}\n")
    out = tmp_path / "out.jsonl"
    res = subprocess.run(casedb(tmp_path, "scan", recipe, "-o", out), input="y\ny\ny\n", capture_output=True,
                         text=True, cwd=tmp_path, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    said = " ".join(res.stderr.split())
    assert res.returncode == 2, res.stderr[-2000:]
    assert ("config.json: auto_map names code shipped with the config "
            '({"AutoConfig": "evil_config.EvilConfig"}); casedb never runs a config\'s code') in said
    assert "Do you wish to run the custom code" not in res.stdout + res.stderr
    assert not (model / "PWNED").exists() and not out.exists()


@pytest.mark.parametrize("model_type", ["llama", "h24evil"])
def test_auto_map_is_refused_whatever_the_model_type(tmp_path, model_type):
    cfg = write_config(tmp_path / "config.json", model_type=model_type,
                       text_config={"auto_map": {"AutoModel": "m.M"}})
    with pytest.raises(scan.ScanError, match=r"config.json: text_config.auto_map names code shipped with the config"):
        scan.scan(cfg)


@pytest.mark.slow
def test_a_config_with_a_million_layers_is_refused_before_building(tmp_path):
    base = measure_apart(casedb(tmp_path, "scan", tmp_path / "missing.json"), timeout=300, cwd=tmp_path)
    cfg = write_config(tmp_path / "layers.json", num_hidden_layers=10 ** 6)
    assert cfg.stat().st_size < 256  # the had 195 bytes
    r = measure_apart(casedb(tmp_path, "scan", cfg, "-o", tmp_path / "out.jsonl"), timeout=300, cwd=tmp_path,
                said_chars=1000)
    assert (base["rc"], r["rc"]) == (2, 2), r
    assert "layers.json: num_hidden_layers is 1,000,000; casedb scans models of at most 1,024 layers" in r["said"]
    assert r["s"] - base["s"] <= 5 and r["rss_mib"] <= 1024, (base, r)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("key, value, said", [
    ("text_config", {"num_hidden_layers": 5000}, "text_config.num_hidden_layers is 5,000; casedb scans models of at "
                                                 "most 1,024 layers"),
    ("num_local_experts", 10 ** 7, "num_local_experts is 10,000,000; casedb scans models of at most 4,096 experts"),
    ("hidden_size", 10 ** 9, "hidden_size is 1,000,000,000; casedb scans models of at most 1,048,576 per size"),
    ("vocab_size", 10 ** 12, "vocab_size is 1,000,000,000,000; casedb scans models of at most 1,048,576 per size"),
])
def test_absurd_sizes_are_refused_naming_the_key(tmp_path, key, value, said):
    with pytest.raises(scan.ScanError, match=said):
        scan.scan(write_config(tmp_path / "config.json", **{key: value}))


def test_the_parameter_count_is_bounded_on_the_meta_device(tmp_path):
    cfg = write_config(tmp_path / "config.json", num_hidden_layers=16, hidden_size=1 << 20, intermediate_size=1 << 20)
    with pytest.raises(scan.ScanError, match=r"the model has 1.\d+e\+14 parameters, more than 1e\+13 .* its largest "
                                             "sizes: intermediate_size=1048576, hidden_size=1048576"):
        scan.scan(cfg, phases=["prefill"])


def test_an_auto_class_is_not_a_model_class(tmp_path):
    cfg = write_config(tmp_path / "config.json", architectures=["AutoModelForCausalLM"])
    with pytest.raises(scan.ScanError, match="'AutoModelForCausalLM' is not a model class .* give the model's own "
                                             "class, e.g. LlamaForCausalLM"):
        scan.scan(cfg)
