"""README and docs/: every Python snippet runs as written, and every page README links to exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [(page, m.group(1)) for page in PAGES for m in re.finditer(r"```python\n(.*?)```", page.read_text(), re.S)]


def test_there_are_snippets_and_pages():
    assert len(PAGES) >= 7 and SNIPPETS


@pytest.mark.parametrize("page,code", SNIPPETS, ids=[f"{p.relative_to(ROOT)}-{i}" for i, (p, _) in enumerate(SNIPPETS)])
def test_snippet_runs(page, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(page), "exec"), {"__name__": "__snippet__"})


def test_links_between_pages_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+?)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_the_suite_timing_table_is_its_records():
    """docs/development.md's times of make test are copies of scripts/time_suite.sh's records in results/suite/."""
    import json

    page = (ROOT / "docs" / "development.md").read_text()
    table = page.split("<!-- suite-timing -->")[1].split("<!-- /suite-timing -->")[0]
    records = sorted((ROOT / "results" / "suite").glob("*.json"))
    if not records:
        assert "Pending" in table
    for path in records:
        record = json.loads(path.read_text())
        row = next((line for line in table.splitlines() if f"(../results/suite/{path.name})" in line), None)
        assert row is not None, f"{path.name} has no row"
        assert f"{record['wall_seconds']:.0f} s" in row and record["summary"].split(" in ")[0] in row, row
        assert record["exit_status"] == 0 and "failed" not in record["summary"], row
        for target in record.get("targets", []):  # a record of several targets: each one's time, in the row
            assert f"{target['target']} {target['seconds']:.0f} s" in row and target["exit_status"] == 0, row
    assert table.count("../results/suite/") == len(records)


def test_license_and_citation_agree_with_pyproject():
    """LICENSE is the license pyproject declares; CITATION.cff is valid YAML that cites this version and the ViT paper."""
    import tomllib

    import yaml

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    license_text = (ROOT / "LICENSE").read_text()
    assert project["license"] == "MIT" and license_text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the vit-lightning contributors" in license_text
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"].startswith("1.2") and cff["title"] == project["name"]
    assert cff["license"] == project["license"] and str(cff["version"]) == project["version"]
    assert cff["authors"] == [{"name": "the vit-lightning contributors"}]
    assert any("2010.11929" in str(ref) and ref["authors"][0]["family-names"] == "Dosovitskiy" for ref in cff["references"])


def test_readme_is_a_front_page():
    """README is read in two minutes: at most 130 lines, the two commands first, the GPU results before the CPU's."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 130
    assert text.index("make train") < text.index("make test") < text.index("## Results")
    assert text.index("<!-- figures: gpu -->") < text.index("<!-- figures: cpu -->")
    for needed in ("VIT_RUNS", "SYSTEM_SITE=1", "TORCH=cu126", "sbatch", "--partition", "--ckpt_path last"):
        assert needed in text, needed
