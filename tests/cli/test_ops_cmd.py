"""`cuvil-edge ops`: the supported ops for a person, one op's versions, and docs/OPS.md's markdown."""

from __future__ import annotations

from cuvil_edge.cli.main import main
from cuvil_edge.ir import op_catalog


def test_ops_lists_every_op(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "Conv" in out and "Reshape" in out and f"{len(op_catalog.entries())} ops" in out


def test_ops_conv_shows_its_versions(capsys):
    assert main(["ops", "Conv"]) == 0
    out = capsys.readouterr().out
    assert "1, 11, 22" in out and "conv.py" in out and "kernel_shape" in out


def test_ops_of_a_misspelt_name_fails_with_the_right_one(capsys):
    assert main(["ops", "GeLU"]) == 2
    assert "did you mean 'Gelu'" in capsys.readouterr().err


def test_ops_write_and_markdown_give_docs_ops_md(tmp_path, capsys):
    # act
    assert main(["ops", "--write", str(tmp_path / "OPS.md")]) == 0
    assert main(["ops", "--markdown"]) == 0
    # assert
    printed = capsys.readouterr().out
    assert (tmp_path / "OPS.md").read_text(encoding="utf-8") == op_catalog.markdown()
    assert printed.endswith(op_catalog.markdown())
