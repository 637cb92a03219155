"""Megatron-LM's own ``pretrain()`` recorded without editing it: ``torchrun -m workbench.megatron_lm
pretrain_gpt.py ARGS --workbench-run DIR`` on the CPU (gloo, mock data, the patches of
``workbench.megatron_lm.cpu``), at TP=2, with megatron-core 0.19 (and 0.17 and 0.18 under ``make
test-range``, whose ``pretrain()`` signatures differ): two runs are bitwise identical, a one-bit change is
found at its step and module, and the store holds every site kind and the scalars ``train_step`` returns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.training.training", reason="megatron-core before 0.17 ships no pretrain()")

from tests.helpers.training import run_forked  # noqa: E402
from workbench.analysis.compare import compare  # noqa: E402
from workbench.store.manifest import MEGATRON_LM_PRETRAIN  # noqa: E402
from workbench.store.reader import open_run  # noqa: E402

ENTRY = Path(__file__).with_name("pretrain_gpt.py")
ARGS = ("--distributed-backend gloo --tensor-model-parallel-size 2 --num-layers 2 --hidden-size 64 "
        "--ffn-hidden-size 256 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
        "--tokenizer-type NullTokenizer --vocab-size 128 --make-vocab-size-divisible-by 64 --mock-data "
        "--split 99,1,0 --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --lr 1e-3 --min-lr 1e-4 "
        "--lr-decay-style constant --clip-grad 0.0 --eval-iters 0 --eval-interval 1000 --log-interval 1 "
        "--seed 1234 --transformer-impl local --use-cpu-initialization --no-gradient-accumulation-fusion "
        "--no-bias-gelu-fusion --no-bias-dropout-fusion --no-masked-softmax-fusion --no-persist-layer-norm "
        "--no-rope-fusion --attention-dropout 0.0 --hidden-dropout 0.0").split()

DP2 = tuple(a for a in " ".join(ARGS).replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1")
            .replace("--clip-grad 0.0", "--clip-grad 1.0").split())
"""Two data-parallel replicas (TP=1 on two ranks), gradients clipped at 1.0 (Megatron's optimizer on the CPU)."""
ZERO1 = ("--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather")
"""What large runs pass: the distributed optimizer, overlapped gradient reduction and parameter gathering."""


def _pretrain(root: Path, name: str, flip: str | None = None, args: tuple[str, ...] = ARGS,
              torchrun: bool = True) -> Path:
    """The launcher on two ranks: started by torchrun, or forked from the runner's zygote with the variables
    torchrun sets (the same records: ``a``, by torchrun, and ``b``, forked, are compared bitwise)."""
    env = {"OMP_NUM_THREADS": "1", **({"WORKBENCH_TEST_FLIP": flip} if flip else {})}
    argv = [str(ENTRY), *args, "--data-cache-path", str(root / "cache" / name), "--workbench-run", str(root / name)]
    if torchrun:
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", "-m", "workbench.megatron_lm", *argv], capture_output=True, text=True,
                                timeout=900, env={**os.environ, **env}, cwd=root)
    else:
        result = run_forked(None, argv, 2, module="workbench.megatron_lm", env=env)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return root / name


class Pretrained:
    """Runs of the entry script, each launched the first time a test asks for it (``make test-range`` asks
    for one on each older megatron-core): ``a`` by torchrun, the others forked from the runner's zygote."""

    FLIPS = {"flip": "2:decoder.layers.1.mlp"}
    ARGS = {"dp2": DP2, "zero1": (*DP2, *ZERO1)}

    def __init__(self, root: Path) -> None:
        self.root = root

    def __truediv__(self, name: str) -> Path:
        if not (self.root / name).exists():
            _pretrain(self.root, name, flip=self.FLIPS.get(name), args=self.ARGS.get(name, ARGS),
                      torchrun=name == "a")
        return self.root / name


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Pretrained:
    return Pretrained(tmp_path_factory.mktemp("pretrain"))


def test_pretrain_is_recorded_with_every_site_kind_and_its_scalars(pretrained: Pretrained) -> None:
    import megatron.core

    run = open_run(pretrained / "a")
    assert run.manifest.runtime["megatron_core"] == megatron.core.__version__.split("+")[0]
    assert run.status == "complete" and run.steps_completed == 4
    assert run.manifest.producer == MEGATRON_LM_PRETRAIN and run.manifest.layout.tp == 2
    assert run.manifest.user_config is not None and run.manifest.user_config["train_iters"] == 4
    kinds = {site.partition(":")[0] for site in run.records().sites}
    assert {"param", "act", "act_grad", "grad", "loss", "exp_avg", "exp_avg_sq", "update"} <= kinds
    scalars = run.scalars
    assert scalars["loss"].notna().all() and scalars["grad_norm"].notna().all()
    assert (scalars["lr"] == 1e-3).all() and (scalars["loss_scale"] == 1.0).all()


def test_two_pretrain_runs_are_bitwise_identical(pretrained: Pretrained) -> None:
    # one started by torchrun, one forked from the runner's zygote: the other runs here are forked
    assert compare(open_run(pretrained / "a").records(), open_run(pretrained / "b").records()).identical


def test_a_one_bit_change_in_pretrain_is_found_at_its_step_and_layer(pretrained: Pretrained) -> None:
    result = compare(open_run(pretrained / "a").records(), open_run(pretrained / "flip").records())
    assert (result.first_step, result.first_site) == (2, "act:layers.1.mlp")


def test_pretrain_with_the_distributed_optimizer_and_overlap_is_recorded_like_the_plain_optimizer(
        pretrained: Pretrained) -> None:
    zero1, plain = open_run(pretrained / "zero1"), open_run(pretrained / "dp2")
    assert zero1.manifest.user_config is not None and zero1.manifest.layout.dp == 2
    assert all(zero1.manifest.user_config[flag] for flag in ("use_distributed_optimizer", "overlap_grad_reduce",
                                                             "overlap_param_gather"))
    assert zero1.status == "complete" and "kinds_missing" not in zero1.attrs
    assert set(zero1.site_table()["kind"]) == set(plain.site_table()["kind"]) == {
        "param", "act", "act_grad", "grad", "loss", "exp_avg", "exp_avg_sq", "update"}
    sharded, whole = zero1.fingerprints(), plain.fingerprints()
    first = [c for c in whole.columns if c.split(":")[0] in ("param", "grad", "act", "loss")]
    assert list(sharded.columns) == list(whole.columns) and len(first) >= 70
    assert sharded.loc[0, first].equals(whole.loc[0, first])  # the same gradients, reduced in shards
    assert zero1.scalars["grad_norm"].notna().all()  # clipped at 1.0 on the CPU


def test_the_launcher_refuses_a_call_without_its_run_folder(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "workbench.megatron_lm", str(ENTRY), "--num-layers", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--workbench-run" in result.stderr and "Traceback" not in result.stderr
