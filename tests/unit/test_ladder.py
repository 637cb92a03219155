"""Precision ladder / layout comparison and the resume check on synthetic records with known answers."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.helpers.records import SITES, perturb, records
from workbench.analysis import RunRecords
from workbench.analysis.ladder import ladder
from workbench.analysis.noise_floor import noise_floor
from workbench.analysis.resume import resume_check
from workbench.errors import ArgumentError
from workbench.sites import layer_label, layer_order


def test_layer_labels_and_model_order() -> None:
    assert layer_label("grad:layers.12.mlp.linear_fc1.weight") == "L12"
    assert layer_label("act:embedding") == "embedding"
    assert layer_label("param:output_layer.weight") == "output_layer"
    assert layer_label("loss:cross_entropy") == "loss"
    assert layer_order(["output_layer", "L10", "L2", "embedding", "loss"]) == \
        ["embedding", "L2", "L10", "output_layer", "loss"]


def test_ladder_finds_the_layer_that_leaves_the_noise_floor() -> None:
    ref = records("ref")
    repeat = perturb(ref, "repeat", step=0, site="param:embedding.word_embeddings.weight", factor=1 + 1e-4)
    floor = noise_floor([ref, repeat])
    small = perturb(ref, "small", step=2, site="act:layers.0.mlp", factor=1 + 1e-5, later=False)
    large = perturb(ref, "large", step=4, site="act:layers.0.mlp", factor=1.5, later=False)
    result = ladder(ref, [small, large], floor=floor)
    rows = result.summary.set_index("run")
    assert rows.loc["small", "first_step"] == 2 and rows.loc["large", "first_step"] == 4
    assert rows.loc["large", "floor_exit_step"] == 4 and rows.loc["large", "floor_exit_layer"] == "L0"
    assert rows.loc["large", "floor_exit_site"] == "act:layers.0.mlp"
    assert pd.isna(rows.loc["small", "floor_exit_layer"])  # inside the envelope of the repeats
    by_layer = result.final_by_layer()
    assert list(by_layer.columns) == ["embedding", "L0", "loss"] and list(by_layer.index) == ["large", "small"]
    # the large change sits in one of layer 0's sites: the layer's median moves only if most sites move
    per_step = result.per_layer[(result.per_layer["run"] == "large") & (result.per_layer["layer"] == "L0")]
    assert per_step.set_index("step")["relative_error"].loc[:3].max() == 0.0


def test_ladder_without_floor_and_identical_runs() -> None:
    ref = records("ref")
    same = RunRecords("same", ref.fingerprints, ref.stats, ref.model)
    result = ladder(ref, [same])
    row = result.summary.iloc[0]
    assert bool(row["identical"]) and row["final_error"] == 0.0
    assert pd.isna(row["floor_exit_layer"])


def test_resume_check_from_the_resume_step() -> None:
    ref = records("ref", steps=8)
    resumed = RunRecords("resumed", ref.fingerprints, ref.stats, ref.model, resumes=(4,))
    check = resume_check(resumed, ref)
    assert check.identical and check.from_step == 4 and check.steps == [4, 5, 6, 7]
    assert "bitwise identical" in check.summary()

    broken = perturb(ref, "broken", step=5, site=SITES[3])
    broken = RunRecords("broken", broken.fingerprints, broken.stats, ref.model, resumes=(4,))
    check = resume_check(broken, ref)
    assert not check.identical and check.first_step == 5 and check.first_site == SITES[3]
    assert check.differing_sites == len(SITES) - 3
    # a difference before the resume step is not the checkpoint's fault and is not reported
    early = ref.fingerprints.copy()
    early.loc[1, SITES[0]] ^= 1
    assert resume_check(RunRecords("early", early, ref.stats, ref.model, resumes=(4,)), ref).identical


def test_resume_check_needs_a_resume_step() -> None:
    ref = records("ref")
    with pytest.raises(ArgumentError, match="never resumed"):
        resume_check(ref, ref)
    assert resume_check(ref, ref, from_step=2).steps == [2, 3, 4, 5]


def test_each_layers_error_is_the_median_of_its_sites(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from workbench.analysis import compare
    from workbench.analysis import ladder as ladder_module
    from workbench.analysis.ladder import per_layer_error

    sites = [*SITES, "act:layers.1.mlp", "act:layers.1", "grad:layers.1.mlp.linear_fc1.weight"]  # interleaved
    a = records("a", steps=9, sites=sites)
    b = records("b", steps=9, sites=sites, seed=1)
    result = compare(a, b)
    rel = result.relative("l2").transpose("step", "site")
    monkeypatch.setattr(ladder_module, "_BLOCK", 2 * len(sites))  # 2 steps a block, the last one short
    table = per_layer_error(result, "l2")
    labels = [layer_label(s) for s in rel["site"].to_numpy()]
    assert list(table.columns) == layer_order(sorted(set(labels)))
    for label in table.columns:
        columns = [i for i, other in enumerate(labels) if other == label]
        expected = np.median(rel.to_numpy()[:, columns], axis=1)
        np.testing.assert_array_equal(table[label].to_numpy(), expected)
