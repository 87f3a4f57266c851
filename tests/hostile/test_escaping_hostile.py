"""Text from a DB written as syntax (issue 24, item 7): names, devices and error messages are
data in what `casedb export` and `casedb report --markdown` write, whatever they hold."""

from __future__ import annotations

import sqlite3

import pytest
import yaml
from markdown_it import MarkdownIt

from casedb import escape
from casedb.read import report as report_mod
from tests import runs_data
from tests.helpers import rows

pytestmark = pytest.mark.timeout(300)

# Each would be syntax if written raw: a key after a line break of any kind YAML knows, a
# comment, flow and block indicators, tags, anchors, document markers, values YAML reads as
# something else, controls a YAML reader refuses, spaces YAML trims, bidi controls.
HOSTILE_NAMES = [
    "evil\ndefault: {rtol: 1000, atol: 1000}\n#", "cr\rdefault: {rtol: 5}", "crlf\r\ncases: []",
    "nel\x85default: {atol: 9}", "ls\u2028default: {atol: 9}", "ps\u2029x", "#not a comment", "x #tail",
    "'single", '"double', "- item", "key: value", "x[0]|{a}", "*", "&anchor", "*alias", "!tag", "!!python/name:os",
    "%YAML 1.1", "---", "...", "\ttab", "bell\x07", "nul\x00byte", "esc\x1b[31mred", "del\x7f", "yes", "null",
    "~", "1e3", "0o17", "1_000", "12:30", " lead", "trail ", "", "é\u202eRTL", "\ufeffbom", "|", ">", "@at", "`tick",
]


def manifest(path, model: str, names: list[str]) -> None:
    """A manifest (written by PyYAML, every character escaped) with one case per name."""
    cases = [{"name": n, "op": "torch.neg", "inputs": [{"tensor": {"shape": [i + 1]}}]} for i, n in enumerate(names)]
    path.write_text(yaml.safe_dump({"model": model, "cases": cases}, allow_unicode=False), encoding="utf-8")


def stored(db) -> list[tuple]:
    return [tuple(r.values()) for r in rows(db, "SELECT mc.model, mc.name, mc.signature, mc.rtol, mc.atol, m.defaults"
                                               " FROM model_cases mc JOIN models m ON m.name = mc.model"
                                               " ORDER BY mc.model, mc.position")]


@pytest.mark.parametrize("model", ["evil\ndefault: {rtol: 1000, atol: 1000}\n#", "x\r\n---\ncases: []\n#"])
def test_exported_names_read_back_as_names(cli, db_path, tmp_path, model):
    """A model name that ends the header comment would write `default: {rtol: 1000, ...}` into
    the manifest; every name is a YAML scalar and the header a comment, whatever they hold."""
    src = tmp_path / "m.yaml"
    manifest(src, model, HOSTILE_NAMES)
    assert cli("import", src).exit_code == 0
    out = tmp_path / "out.yaml"
    result = cli("export", "--model", model, "-o", out)
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    assert list(doc) == ["model", "cases"]  # no `default:` from the name
    assert doc["model"] == model and [c["name"] for c in doc["cases"]] == HOSTILE_NAMES
    header = text.split("\nmodel:")[0].splitlines()
    assert len(header) == 2 and all(ln.startswith("# ") for ln in header)
    again = tmp_path / "again.db"
    assert cli("import", out, db=again).exit_code == 0
    assert stored(again) == stored(db_path)
    assert {r[3:] for r in stored(again)} == {(None, None, "{}")}  # no defaults, no tolerance


# ------------------------------------------------------------------------- report --markdown

FORGED = {
    "a_silu": "silu\n## Forged heading\n<!-- the rest is hidden",
    "a_softmax": "soft|max `code` [link](https://example.invalid) ![img](x.png)",
    "a_mul": "**bold** _em_ ~~struck~~ $x^2$ &amp; <b>html</b> \\| # h",
}


@pytest.fixture
def forged_db(cli, tmp_path, db_path):
    """Two runs (tests/runs_data.py) whose names, device and error messages are Markdown."""
    runs_data.two_runs(cli, tmp_path, db_path)
    con = sqlite3.connect(db_path)
    with con:
        for name, new in FORGED.items():
            con.execute("UPDATE model_cases SET name = ? WHERE name = ?", [new, name])
        con.execute("UPDATE runs SET device = ?", ["cpu`\n# Forged title <!--"])
        con.execute("UPDATE results SET error_message = ? WHERE error_message IS NOT NULL",
                    ["boom | cell <!-- hide -->`tick` *x*"])
    con.close()
    return db_path


def _text(inline) -> str:
    return "".join(t.content for t in inline.children or () if t.type in ("text", "code_inline"))


def test_markdown_report_renders_every_field_as_text(cli, forged_db):
    md = cli("report", "--markdown").stdout
    tokens = MarkdownIt("commonmark").enable(["table", "strikethrough"]).parse(md)
    report = cli.json("report")
    titles = [s["title"] for s in report_mod.sections(report)]
    headings = [(t.tag, _text(tokens[i + 1])) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == [("h2", escape.visible(report_mod._title(report)))] + [
        ("h3", escape.visible(title)) for title in titles]
    # (emphasis is the notes' own: the names below show their * and _ as written)
    kinds = {c.type for t in tokens for c in [t, *(t.children or ())]}
    assert not kinds & {"html_block", "html_inline", "link_open", "image", "strong_open", "s_open", "code_block",
                        "fence", "hr"}
    # every row of every table has its header's cells
    tables = []
    for t in tokens:
        if t.type == "table_open":
            tables.append([])
        elif t.type == "tr_open":
            tables[-1].append(0)
        elif t.type in ("th_open", "td_open"):
            tables[-1][-1] += 1
    assert len(tables) > 5 and all(len(set(widths)) == 1 for widths in tables)
    cells = [_text(t) for t in tokens if t.type == "inline"]
    for name in FORGED.values():  # each name shown whole, as written (line breaks as \n)
        assert f"model_a::{escape.visible(name)}" in cells
    assert "boom | cell <!-- hide -->`tick` *x*" in cells
    # the repro commands, as code (markdown-it keeps the \| GitHub unescapes in a cell's code span)
    code = [c.content.replace("\\|", "|") for t in tokens for c in (t.children or ()) if c.type == "code_inline"]
    assert "`" in report["failures"][0]["repro"]
    assert code == [escape.visible(r["repro"]) for r in report["remove_xfail"] + report["failures"]]
