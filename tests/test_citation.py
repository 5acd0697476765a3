"""CITATION.cff: a Citation File Format 1.2.0 record of cocos (its version and licence those of pyproject.toml)
that references the COCOS paper and VSE++."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CFF = ROOT / "CITATION.cff"
REQUIRED = ("cff-version", "message", "title", "authors")  # the keys CFF 1.2.0 requires


def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _parsed() -> dict:
    try:
        import yaml
    except ImportError:  # no parser: test_citation_keys_are_there_without_a_yaml_parser checks the text
        pytest.skip("PyYAML is not installed: CITATION.cff's structure is parsed with it (its keys are checked as text)")
    return yaml.safe_load(CFF.read_text(encoding="utf-8"))


def test_citation_is_cff_1_2_0_of_this_version():
    cff, project = _parsed(), _project()
    assert cff["cff-version"] == "1.2.0" and all(cff.get(k) for k in REQUIRED), cff.keys()
    assert cff["type"] == "software" and cff["authors"] == [{"name": "the cocos contributors"}]
    assert str(cff["version"]) == project["version"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))
    licence = project.get("license")
    licence = licence.get("text") if isinstance(licence, dict) else licence
    assert cff.get("license") == licence


def test_citation_references_the_cocos_paper_and_vsepp():
    refs = {ref["title"]: ref for ref in _parsed()["references"]}
    for ref in refs.values():
        assert ref["type"] and ref["authors"] and isinstance(ref["year"], int)
        assert all(a.get("family-names") and a.get("given-names") for a in ref["authors"])
    cocos = refs["Do Lessons from Metric Learning Generalize to Image-Caption Retrieval?"]
    assert [a["family-names"] for a in cocos["authors"]] == ["Bleeker", "Rijke"] and cocos["year"] == 2022
    assert "ECIR 2022" in cocos["conference"]["name"]
    vsepp = refs["VSE++: Improving Visual-Semantic Embeddings with Hard Negatives"]
    assert [a["family-names"] for a in vsepp["authors"]] == ["Faghri", "Fleet", "Kiros", "Fidler"]
    assert vsepp["year"] == 2018 and "BMVC 2018" in vsepp["conference"]["name"]


def test_citation_keys_are_there_without_a_yaml_parser():
    """The same file read as text: the required keys at the top level, this version, two references."""
    text = CFF.read_text(encoding="utf-8")
    for key in REQUIRED:
        assert re.search(rf"^{re.escape(key)}:", text, re.M), key
    assert re.search(r"^cff-version: 1\.2\.0$", text, re.M)
    assert re.search(rf'^version: "?{re.escape(_project()["version"])}"?$', text, re.M)
    assert len(re.findall(r"^  - type: conference-paper$", text, re.M)) == 2
