"""The attribution table: one row per source, where it acts, and what it costs against the all-off runs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.sources import COLUMNS, acts_where_expected, attribution, source_cost, source_label
from workbench.figures.sources import sources_figure


def _summary() -> pd.DataFrame:
    return pd.DataFrame({
        "run": ["split", "attn", "emb", "both"], "identical": False, "first_step": pd.array([0, 0, 2, 0], "Int64"),
        "first_site": ["act:layers.0.mlp", "act:layers.1", "grad:embedding.word_embeddings.weight",
                       "act:layers.0.mlp"],
        "floor_exit_step": pd.array([0, 1, None, 0], "Int64"), "floor_exit_site": ["a", "b", None, "c"],
        "floor_exit_layer": ["L0", "L1", None, "L0"], "growth": [0.5, 0.1, 0.3, 0.4],
        "saturation_step": pd.array([3, None, 4, 3], "Int64"), "plateau": [1e-6, np.nan, 1e-7, 1e-6],
        "final_error": [3e-7, 8e-8, 3e-8, 4e-7]})


def test_one_row_per_source_in_the_registry_order_with_where_it_acts() -> None:
    sources = {"split": "splitk_gemm", "attn": "attention_backward", "emb": "embedding_atomics",
               "both": source_label(["splitk_gemm", "embedding_atomics"])}
    table = attribution(_summary(), sources)
    assert list(table.columns) == COLUMNS
    assert table["source"].tolist() == ["embedding_atomics", "embedding_atomics+splitk_gemm", "attention_backward",
                                        "splitk_gemm"]
    acts = dict(zip(table["source"], table["where_it_acts"], strict=True))
    assert acts["splitk_gemm"] is True and acts["embedding_atomics"] is True
    assert acts["attention_backward"] is False  # act:layers.1 is not where the attention backward acts first
    assert acts["embedding_atomics+splitk_gemm"] is True  # either source's site
    assert table["cost_percent"].isna().all()  # no cost given
    assert acts_where_expected("torch_algorithms", "act:layers.0") is None  # no CPU emulation: nothing known


def test_the_cost_of_a_source_is_its_throughput_against_the_all_off_runs() -> None:
    baseline = [np.full(20, 100.0), np.full(20, 102.0)]
    rates = {"splitk_gemm": [np.full(20, 80.0)], "dp_allreduce": [np.full(20, 101.0), np.full(20, 101.0)]}
    cost = source_cost(rates, baseline, warmup=2)
    by_source = cost.set_index("config")  # analysis.cost's table, one row per source
    assert by_source.loc["splitk_gemm", "tax_percent"] == (80.0 / 101.0 - 1) * 100  # the emulation is slower
    assert by_source.loc["dp_allreduce", "tax_percent"] == 0.0
    assert (by_source["ci_low"] <= by_source["tax_percent"]).all()
    table = attribution(_summary(), {"split": "splitk_gemm"}, cost)
    assert table.loc[0, "cost_percent"] == by_source.loc["splitk_gemm", "tax_percent"]
    figure = sources_figure(table, on_cpu=True)
    assert "emulation" in figure.layout.title.text and figure.data[1].x[0] == table.loc[0, "cost_percent"]
    assert "step 0, act:layers.0.mlp" in figure.data[0].y[0]
