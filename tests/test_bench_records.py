"""bench/RESULTS.md's measured sections are their records: each block between `bench record` markers is the text of
the record it names (bench/records/NAME.json, written by the script with the figures it measured), so a figure can
be neither typed in nor left behind by a later run."""
import json
import re
from pathlib import Path

import pytest

from bench import results

ROOT = Path(__file__).resolve().parents[1]
RECORDS = sorted((ROOT / "bench" / "records").glob("*.json"))


def blocks(text: str) -> dict[str, str]:
    """{record path named by a block's marker: the block, markers included}."""
    begin = re.escape(results.BEGIN.split("{")[0])
    found = re.finditer(rf"{begin}.*? into ([^\s]+) -->.*?{re.escape(results.END)}", text, re.S)
    return {m.group(1): m.group(0) for m in found}


def test_each_block_names_a_committed_record():
    named = blocks(results.RESULTS.read_text())
    assert all((ROOT / path).is_file() for path in named), named.keys()
    assert set(named) == {f"bench/records/{p.name}" for p in RECORDS}  # and every record has its block


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.name)
def test_a_block_is_its_record_s_text(record):
    data = json.loads(record.read_text())
    assert data["name"] == record.stem
    assert blocks(results.RESULTS.read_text())[f"bench/records/{record.name}"] == results.block(data)
    assert results.read_section(data["title"]) == results.block(data)


def test_publish_writes_the_record_and_its_section(tmp_path):
    path = tmp_path / "RESULTS.md"
    saved = results.publish("A measure (bench/x.py)", "bench.x", "x", {"seconds": 1.5}, ["- took 1.5 s"], path)
    assert saved == tmp_path / "records" / "x.json"
    record = json.loads(saved.read_text())
    assert record["figures"] == {"seconds": 1.5}
    body = results.read_section("A measure (bench/x.py)", path)
    assert body == results.block(record) and "- took 1.5 s" in body
    assert body.startswith("<!-- bench record: written by `python -m bench.x` into bench/records/x.json -->")
    results.publish("A measure (bench/x.py)", "bench.x", "x", {"seconds": 2.0}, ["- took 2.0 s"], path)
    assert "1.5" not in path.read_text() and path.read_text().count("## A measure") == 1
