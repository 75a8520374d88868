"""The licence and the citation say one thing everywhere: MIT in LICENSE and pyproject.toml;
CITATION.cff and the README's BibTeX name the same version and the paper's eight authors."""

from __future__ import annotations

import re

import tomllib
import yaml

from tests.conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# the author line of the paper (ICLR 2023 camera-ready), in order
PAPER_AUTHORS = [("Zhang", "Qingru"), ("Chen", "Minshuo"), ("Bukharin", "Alexander"),
                 ("Karampatziakis", "Nikos"), ("He", "Pengcheng"), ("Cheng", "Yu"),
                 ("Chen", "Weizhu"), ("Zhao", "Tuo")]


def readme_bibtex() -> dict[str, dict[str, str]]:
    """``{entry key: {field: value}}`` of the README's bibtex block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```bibtex\n(.*?)```", text, flags=re.S)
    entries = {}
    for key, body in re.findall(r"@\w+\{(\w+),\n(.*?)\n\}", block, flags=re.S):
        fields = re.findall(r"(\w+)\s*=\s*\{(.*?)\},?\s*$", body, flags=re.S | re.M)
        entries[key] = {k: " ".join(v.split()) for k, v in fields}
    return entries


def test_the_licence_is_mit_everywhere():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the adalora authors" in text
    assert PROJECT["license"] == {"text": "MIT"}
    assert yaml.safe_load((ROOT / "CITATION.cff").read_text())["license"] == "MIT"


def test_citation_file_and_readme_agree():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["version"] == PROJECT["version"]
    paper = cff["preferred-citation"]
    assert [(a["family-names"], a["given-names"]) for a in paper["authors"]] == PAPER_AUTHORS
    bib = readme_bibtex()
    assert set(bib) == {"zhang2023adalora", "adalora_runner"}
    authors = [tuple(name.split(", ")) for name in bib["zhang2023adalora"]["author"].split(
        " and ")]
    assert authors == PAPER_AUTHORS
    assert bib["zhang2023adalora"]["year"] == str(paper["year"]) == "2023"
    assert bib["zhang2023adalora"]["url"] == paper["url"]
    assert bib["adalora_runner"]["version"] == PROJECT["version"]
    assert bib["adalora_runner"]["title"].replace("{", "").replace("}", "") == cff["title"]
