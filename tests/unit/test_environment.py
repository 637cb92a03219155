"""The environment's fingerprint: what is recorded, how two runs' facts differ, and where the difference is
printed (compare, check, a golden file, the study's findings); repeats group only runs whose reductions split
alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.manifests import info
from workbench.environment import ENV_KEY, collect, difference
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import update_manifest
from workbench.studies.roles import find_roles, repeat_key

AVX512 = {"device": "cpu", "cpu_isa": "avx512", "cpu_model": "AMD EPYC", "torch_threads": 2, "world_size": 1,
          "torch": "2.13.0", ENV_KEY: {}}
AVX2 = {**AVX512, "cpu_isa": "avx2", "torch_threads": 1}


def test_the_facts_that_differ_are_named_in_order() -> None:
    assert difference(AVX512, AVX2).summary() == \
        "the runs differ in: CPU vector ISA avx512 vs avx2; torch threads 2 vs 1"
    assert difference(AVX512, dict(AVX512)).summary() == \
        "identical environments: the difference is in the code or the configuration"
    assert difference(AVX512, dict(AVX512)).summary(runs_differ=False) == "identical environments"
    assert not difference(AVX512, AVX2).bitwise_expected
    versions = difference(AVX512, {**AVX512, "torch": "2.12.0", ENV_KEY: {"NCCL_ALGO": "Ring"}})
    assert versions.bitwise_expected and versions.summary() == \
        "the runs differ in: torch 2.13.0 vs 2.12.0; NCCL_ALGO unknown vs Ring"


def test_a_fact_one_run_lacks_is_unknown_never_equal() -> None:
    lacking = difference(AVX512, {k: v for k, v in AVX512.items() if k != "cpu_isa"})
    assert not lacking.identical and "not recorded by both: CPU vector ISA" in lacking.summary()
    assert difference(AVX512, {}).unknown == ["every fact of the second run"]
    assert not difference(None, None).identical


def test_collect_records_this_process() -> None:
    import torch

    facts = collect(world_size=3)
    assert facts["torch_threads"] == torch.get_num_threads() and facts["world_size"] == 3
    assert facts["cpu_isa"] == str(torch.backends.cpu.get_cpu_capability()).lower()
    assert facts["torch"] == torch.__version__.split("+")[0] or facts["torch"].startswith(torch.__version__[:4])
    assert "gpu_model" not in facts  # asked about the CPU
    json.dumps(facts)  # a manifest field: JSON as it is


def _pair(tmp_path: Path, *, same: bool) -> tuple[Path, Path]:
    a = write_synthetic_run(tmp_path / "a", steps=6, sites=8)
    b = write_synthetic_run(tmp_path / "b", steps=6, sites=8, diverge_at=(2, 1))
    update_manifest(a, runtime=AVX512)
    update_manifest(b, runtime=AVX512 if same else AVX2)
    return a, b


def test_compare_and_check_print_the_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    a, b = _pair(tmp_path, same=False)
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "first divergent step: 2" in out and "CPU vector ISA avx512 vs avx2; torch threads 2 vs 1" in out
    assert main(["compare", str(a), str(b), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)["environment"]
    assert not facts["bitwise_expected"]
    assert [d["fact"] for d in facts["differences"]] == ["cpu_isa", "torch_threads"]
    assert main(["check", str(b), "--golden", str(a)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "bitwise equality was not to be expected" in out and "--rtol" in out
    golden = tmp_path / "golden.json"
    assert main(["golden", str(a), "--out", str(golden)]) == 0
    assert json.loads(golden.read_text())["environment"]["cpu_isa"] == "avx512"  # the file carries its facts
    capsys.readouterr()
    assert main(["check", str(b), "--golden", str(golden)]) == 1
    assert "CPU vector ISA avx2 vs avx512" in capsys.readouterr().out  # the run first, then the reference


def test_identical_environments_point_at_the_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    a, b = _pair(tmp_path, same=True)
    assert main(["check", str(b), "--golden", str(a)]) == 1
    out = capsys.readouterr().out
    assert "identical environments: the difference is in the code or the configuration" in out
    assert "not to be expected" not in out
    assert main(["compare", str(a), str(a)]) == 0  # a bitwise identical pair: no difference to place
    out = capsys.readouterr().out
    assert "bitwise identical" in out and "identical environments\n" in out and "the difference is" not in out


def test_the_study_names_the_facts_beside_the_first_divergence(tmp_path: Path) -> None:
    from workbench.studies.summary import summarise_study

    _pair(tmp_path, same=False)
    assert open_run(tmp_path / "b").manifest.runtime["cpu_isa"] == "avx2"
    text = summarise_study(tmp_path).text()
    assert "b vs a: first differ at step 2" in text and "\n  the runs differ in: CPU vector ISA avx2 vs avx512" in text


def test_runs_whose_reductions_split_differently_are_not_repeats() -> None:
    one = info("one", runtime={"torch_threads": 2, "cpu_isa": "avx2"})
    two = info("two", runtime={"torch_threads": 1, "cpu_isa": "avx2"})
    again = info("again", runtime={"torch_threads": 2, "cpu_isa": "avx2"})
    assert repeat_key(one) != repeat_key(two) and repeat_key(one) == repeat_key(again)
    roles = find_roles({"one": one, "two": two, "again": again}, ["one", "two", "again"])
    assert roles.repeat_groups == [["again", "one"]]


def test_megatron_lms_determinism_checks_name_every_failing_variable() -> None:
    from workbench.environment import _megatron_checks, megatron_determinism

    if _megatron_checks() is None:
        pytest.skip("this megatron-core has no megatron/training/determinism.py (0.19+)")
    env = {"NCCL_ALGO": "Tree", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}
    verdict = megatron_determinism(env, {"cross_entropy_loss_fusion": True, "tp_comm_overlap": False})
    assert verdict is not None and verdict["passes"] is False
    assert [f.split(": ")[0] for f in verdict["failing"]] == [
        "NCCL_ALGO='Tree'", "NVTE_ALLOW_NONDETERMINISTIC_ALGO='1'", "cross_entropy_loss_fusion=True"]
    assert env == {"NCCL_ALGO": "Tree", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                   "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}  # run on a copy: no default was set
    assert megatron_determinism({"NCCL_ALGO": "Ring,CollnetDirect"}) == {"passes": True, "failing": []}


def test_a_difference_in_megatron_lms_determinism_checks_is_printed() -> None:
    passes = {"cpu_isa": "avx2", "megatron_determinism": {"passes": True, "failing": []}}
    fails = {"cpu_isa": "avx2", "megatron_determinism": {
        "passes": False, "failing": ["NCCL_ALGO='Tree': each token must be in [...]"]}}
    found = difference(passes, fails)
    assert found.summary() == "the runs differ in: Megatron-LM's determinism checks pass vs fail (NCCL_ALGO='Tree')"
    assert found.bitwise_expected  # a check's verdict, not a fact that splits a reduction differently
    assert difference(fails, fails).identical
    assert "Megatron-LM's determinism checks" in difference(passes, {"cpu_isa": "avx2"}).unknown
