"""cocos/results/SCHEMA.md describes exactly the keys of the results.json files cocos writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from cocos.pipelines.count import count_file
from cocos.results import FORMAT_VERSION, Results
from tests.test_report_tables import as_results, make_results

SCHEMA = Path(__file__).resolve().parents[1] / "cocos" / "results" / "SCHEMA.md"
SECTIONS = ("source", "data", "model", "training", "counting", "evaluation")


def documented() -> set[str]:
    return set(re.findall(r"^\| `([a-z_0-9.]+)` \|", SCHEMA.read_text(), flags=re.M))


def written(path: Path) -> set[str]:
    data = json.loads(path.read_text())
    keys = set(data) - {s for s in SECTIONS if isinstance(data[s], dict)}  # sections by their fields
    for section in SECTIONS:
        if isinstance(data.get(section), dict):
            keys |= {f"{section}.{k}" for k in data[section]}
    return keys | {f"statistics.{k}" for record in data["statistics"] for k in record}  # the records' fields


def test_schema_lists_exactly_the_keys_of_written_files(tmp_path):
    g = np.random.default_rng(0)
    images = g.normal(size=(24, 6))
    np.savez(tmp_path / "e.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(120, 6)))
    counted = count_file(tmp_path / "e.npz", batch_size=8)
    counted.results.write(tmp_path / "count.json")
    analyzed = as_results(make_results())  # an analyze record (read from the old format, written in the new)
    analyzed.write(tmp_path / "analyze.json")
    keys = written(tmp_path / "count.json") | written(tmp_path / "analyze.json") | {"training", "evaluation"}
    assert json.loads((tmp_path / "count.json").read_text())["training"] is None  # "object or null"
    assert keys == documented(), (sorted(keys - documented()), sorted(documented() - keys))
    assert json.loads((tmp_path / "count.json").read_text())["format_version"] == FORMAT_VERSION
    assert f"`{FORMAT_VERSION}`" in SCHEMA.read_text()
    # what is written reads back as the same record
    for name in ("count.json", "analyze.json"):
        assert Results.read(tmp_path / name).to_dict() == json.loads((tmp_path / name).read_text())
