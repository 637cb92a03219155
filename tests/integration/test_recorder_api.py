"""The recorder attached to a plain Megatron Core loop in a few lines, and detached cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SETUP = r'''
import sys, torch, torch.distributed as dist
from workbench.runner import cpu_compat
cpu_compat.install()
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from workbench.config import RecordConfig, RunConfig
from workbench.store.manifest import runner_manifest
from workbench.recorder import Recorder
from workbench.runner.model import build_model
from workbench.store.reader import open_run
from workbench.store.writer import create_store

run_dir = sys.argv[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[2])
ps.initialize_model_parallel()
model_parallel_cuda_manual_seed(0)
model = {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "vocab_size": 64, "seq_length": 8}
tokens = torch.randint(0, 64, (2, 9))
mask = torch.ones(8, 8, dtype=torch.bool).triu(1)[None, None]
'''
"""A one-rank gloo group and Megatron's parallel state on the CPU: what both scripts below start with."""

SCRIPT = SETUP + r'''
cfg = RunConfig.from_dict({"name": "api", "steps": 2, "model": model})
built = build_model(cfg, torch.device("cpu"))
create_store(__import__("pathlib").Path(run_dir), runner_manifest(cfg), 3)
optimizer = torch.optim.AdamW(built.ddp.parameters(), lr=1e-3)
before = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in built.gpt.modules())
finalize = built.config.finalize_model_grads_func

# --- the few lines a user adds to their own loop ---
recorder = Recorder([built.ddp], run_dir=run_dir, total_steps=3, optimizer=optimizer, global_batch_size=2,
                    record=RecordConfig(every=2))
hooks, slots = [], []
for step in range(3):
    recorder.step_begin(step)
    hooks.append(sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in built.gpt.modules()))
    built.ddp.zero_grad_buffer()
    recorder.microbatch(2 * step)  # a running sample counter (2 samples a step): its place in the step's batch
    loss = built.ddp(tokens[:, :-1], torch.arange(8)[None].expand(2, 8), mask, labels=tokens[:, 1:]).mean()
    loss.backward()
    built.config.finalize_model_grads_func([built.ddp])
    for p in built.ddp.parameters():
        p.grad = p.main_grad
    optimizer.step()
    recorder.step_end(step)
    slots.append(len(recorder._slots._slots))
recorder.close()
# ----------------------------------------------------

after = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in built.gpt.modules())
assert after == before, (before, after)
assert hooks[0] > before and hooks[1] == before and hooks[2] == hooks[0], hooks  # none on the unrecorded step
assert built.config.finalize_model_grads_func is finalize
assert slots[2] == slots[0], slots  # no new slots for step 2's samples 4 and 5: they are places 0 and 1 again
table = open_run(run_dir).site_table()
kinds = set(table["kind"])
assert {"param", "act", "act_grad", "grad", "exp_avg", "exp_avg_sq", "update", "loss"} <= kinds, kinds
assert open_run(run_dir).recorded_steps_completed == 2  # steps 0 and 2
paths = open_run(run_dir).attrs["statistics_paths"]  # which kernels read the tensors: the native one, on a CPU
assert paths["tensors_read"]["native"] > 0 and "triton" not in paths["tensors_read"], paths
assert paths["build_failures"] == {}, paths
print("ok", len(table))
'''


def _run(script: str, run_dir: Path) -> None:
    """``script`` in a process of its own, with ``run_dir`` and a free port; it prints "ok" when it passes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run([sys.executable, "-c", script, str(run_dir), str(port)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok")
    assert "No CUDA runtime is found" not in result.stderr  # torch's line on a CPU machine with a CUDA toolkit


def test_recorder_in_a_users_loop_and_hooks_removed_on_close(tmp_path: Path) -> None:
    _run(SCRIPT, tmp_path / "api")
