"""Self-describing results: a report renders from what results.json says about each loss, never the registry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cocos.errors import CocosError
from cocos.objectives import OBJECTIVES, Note, Objective, register, unregister
from cocos.pipelines.analyze import presentations
from cocos.pipelines.count import count_file
from cocos.presentation import Presentation, TableNote, ranked
from cocos.report.merge import build_report, render_report
from cocos.results import Results, builtin_presentations


def squared_hinge(view, margin=0.1):
    from cocos.losses.functional import triplet_hinge

    return triplet_hinge(view, margin).clamp(min=0).pow(2).sum()


PLUGIN = Objective(name="sqhinge2", label="Squared hinge (plugin)", direction_loss=squared_hinge,
                   defaults={"margin": 0.1}, color="#9467bd", marker="D", stats=("C_q", "C_0"),
                   notes=(Note("A plugin note."),))


def test_presentation_round_trips_and_refuses_bad_records():
    look = Presentation("X", ("C_q", "C_0"), "C_0", "2", "#123456", "s", {"margin": 0.2, "hard": True},
                        (TableNote("n", r"$n$", "compat"),), 3)
    assert Presentation.from_dict(json.loads(json.dumps(look.to_dict()))) == look
    for bad in ({}, {**look.to_dict(), "stats": [1]}, {**look.to_dict(), "rank": -1},
                {**look.to_dict(), "notes": [{"text": "n", "when": "sometimes"}]}):
        with pytest.raises(CocosError):
            Presentation.from_dict(bad)


def test_ranked_puts_known_families_first_then_the_rest_by_name():
    looks = {"b": Presentation("B", rank=1), "a": Presentation("A", rank=0), "z": Presentation("Z")}
    assert ranked(["z", "y", "b", "a"], looks) == ["a", "b", "y", "z"]


def test_the_builtin_fallback_equals_what_the_pipeline_writes_for_the_builtin_families():
    # the file old results are read with is what the registry says today (a new family changes neither)
    assert builtin_presentations() == presentations(list(builtin_presentations()))


def test_a_report_renders_identically_without_the_plugin_registered(tmp_path):
    g = np.random.default_rng(0)
    images = g.normal(size=(32, 6))
    np.savez(tmp_path / "e.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(160, 6)))
    register(PLUGIN)
    try:
        counted = count_file(tmp_path / "e.npz", ["triplet", "sqhinge2"], batch_size=8, name="toy", label="enc")
        counted.results.write(tmp_path / "r.json")
        with_plugin = render_report(build_report([tmp_path / "r.json"], counters="all"))
    finally:
        unregister(PLUGIN.name)
    assert "sqhinge2" not in OBJECTIVES
    without = render_report(build_report([tmp_path / "r.json"], counters="all"))
    assert without == with_plugin
    md = without[0]
    assert "Squared hinge (plugin)" in md and "A plugin note." in md
    look = Results.read(tmp_path / "r.json").presentation["sqhinge2"]
    assert (look.color, look.marker, look.stats, dict(look.params)) == ("#9467bd", "D", ("C_q", "C_0"), {"margin": 0.1})


def test_a_version_2_file_reads_with_the_builtin_presentations(tmp_path):
    g = np.random.default_rng(1)
    images = g.normal(size=(24, 6))
    np.savez(tmp_path / "e.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(120, 6)))
    counted = count_file(tmp_path / "e.npz", ["triplet", "ntxent"], batch_size=8).results
    old = {k: v for k, v in counted.to_dict().items() if k not in ("presentation", "statistics")} | {
        "format_version": 2, "stats": counted.stats, "alt_stats": counted.alt_stats, "sweep": counted.sweep}
    old["counting"] = old["counting"] | {"labels": {}}
    (tmp_path / "v2.json").write_text(json.dumps(old))
    r = Results.read(tmp_path / "v2.json")
    assert r.presentation == {n: builtin_presentations()[n] for n in ("triplet", "ntxent")}
    assert r.look("ntxent").main_stat == "C_qv-" and r.look("triplet").table == "2"
