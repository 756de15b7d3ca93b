"""Multi-process training on CPU with gloo: Lightning's own launcher, a 2-node torchrun launch on one
machine, one shared run dir written by rank 0 only, DDP equivalent to one process, exact validation,
per-rank seeds and bitwise-reproducible CPU runs.

The 2-process dali_cpu run (distinct parts per rank, unpadded validation equal to one process) is in
tests/test_dali.py (ddp_run); it is not repeated here.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from imgcls.run.rundir import launch_overrides
from imgcls.run.train import run
from tests import warm_python
from tests.conftest import ROOT, clean_env, compose_config, free_port, make_image_folder, read_report, tiny_overrides

TIMEOUT = 900  # generous: the machine's cores are shared with other test runs

# Deterministic training (the equivalence needs it): no random crop, flip, mixup or dropout; data
# order comes from the sampler's (seed, epoch) shuffle, the same for any number of ranks. Global batch
# 16 with accumulation 2 in both runs: 1 process x 8 per device, or 2 processes x 4 per device. Each
# epoch is one optimizer step (limit_train_batches = 2 micro-batches), so report.json's per-epoch
# train.loss, which ReportCallback averages over all ranks, is the per-step loss curve of the global
# batch. (RUN_DIR/csv/metrics.csv holds rank 0's loss on its part per step, which differs by construction.)
# Normalization: BatchNorm's batch statistics depend on the per-device batch, and torch's SyncBatchNorm
# (trainer.sync_batchnorm=true) is CUDA-only, so these CPU runs use timm's convnext_atto, whose LayerNorm
# normalizes each sample on its own. The BN models' 2-process path is covered by tests/test_dali.py.
EPOCHS = 6


def deterministic(folder: Path, *extra: str) -> list[str]:
    return tiny_overrides(
        folder,
        "model.arch=convnext_atto", "data.hflip=0", "data.train_crop_scale=[1,1]", "data.train_crop_ratio=[1,1]",
        "recipe.mixup=0", "recipe.cutmix=0", "model.drop_rate=0", "model.drop_path_rate=0",
        "recipe.global_batch_size=16", f"recipe.epochs={EPOCHS}", "recipe.warmup_epochs=1",
        "trainer.limit_train_batches=2", "trainer.check_val_every_n_epoch=3", "trainer.log_every_n_steps=1",
        *extra,
    )  # fmt: skip


TWO_PROCESSES = ("data.batch_size=4", "trainer.accelerator=cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 7 val images per class: 21 in all, uneven parts (11 + 10) for the exact-validation check.
    return make_image_folder(tmp_path_factory.mktemp("img"), classes=3, train_per_class=16, val_per_class=7)


@pytest.fixture(scope="module")
def reference(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("one")
    run(compose_config(deterministic(folder, "data.batch_size=8"), run_dir=run_dir))
    return run_dir


def only_run_dir(cwd: Path) -> Path:
    runs = [p for p in (cwd / "outputs" / "train").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs  # one run dir for all ranks, not one per process
    return runs[0]


@pytest.fixture(scope="module")
def lightning_ddp(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`python train.py trainer.devices=2`: Lightning starts rank 1 itself (no hydra.run.dir given)."""
    cwd = tmp_path_factory.mktemp("lightning")
    result = warm_python.run(
        [ROOT / "train.py", *deterministic(folder, *TWO_PROCESSES, "trainer.devices=2")],
        cwd=cwd,
        base_env=clean_env(),
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(cwd), result.stdout + result.stderr


@pytest.fixture(scope="module")
def torchrun_two_nodes(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two torchrun agents ("nodes", one process each) meeting at a c10d rendezvous on 127.0.0.1."""
    cwd = tmp_path_factory.mktemp("torchrun")
    port = free_port()
    args = deterministic(folder, *TWO_PROCESSES, "trainer.devices=1", "trainer.num_nodes=2")
    procs = [
        warm_python.start(
            [
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=job42",
                "--local-addr=127.0.0.1",
                ROOT / "train.py",
                *args,
            ],
            cwd=cwd,
            base_env=clean_env(),
        )  # fmt: skip
        for _ in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append("".join(proc.communicate(timeout=TIMEOUT)))
    finally:
        for proc in procs:
            proc.kill() if proc.poll() is None else None
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-3000:]
    return cwd, outputs


@pytest.mark.slow
def test_srun_tasks_share_the_job_id_run_dir(folder: Path, tmp_path: Path) -> None:
    """Two processes with the environment `srun --ntasks-per-node=2` gives its tasks: Lightning's
    SLURMEnvironment makes them the DDP ranks, and both use outputs/train/<SLURM_JOB_ID>."""
    port = free_port()
    slurm = {
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "imgcls", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NODELIST": "127.0.0.1", "MASTER_PORT": str(port),
    }  # fmt: skip
    args = tiny_overrides(folder, "recipe.epochs=1", "data.batch_size=4", "trainer.devices=2")
    procs = [
        warm_python.start(
            [ROOT / "train.py", *args],
            cwd=tmp_path,
            base_env=clean_env(),
            env={**slurm, "SLURM_PROCID": str(k), "SLURM_LOCALID": str(k)},
        )
        for k in range(2)
    ]
    try:
        outputs = ["".join(proc.communicate(timeout=TIMEOUT)) for proc in procs]
    finally:
        for proc in procs:
            proc.kill() if proc.poll() is None else None
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-3000:]
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name == "4242"
    assert read_report(run_dir)["epochs"][0]["step"] == 6  # 48 images / (2 ranks x 4), global batch 8
    assert "global rank 1 of 2: seed 12346" in outputs[1] and "global rank 1" not in (run_dir / "train.log").read_text()


def losses(run_dir: Path) -> list[float]:
    return [row["train.loss"] for row in read_report(run_dir)["epochs"]]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return ckpt["state_dict"]


def assert_same_training(two: Path, one: Path) -> None:
    # float32 sums in a different order (gloo all-reduce of the ranks' gradients vs one batch): ~1e-6 apart.
    assert len(losses(two)) == EPOCHS
    assert losses(two) == pytest.approx(losses(one), rel=1e-4, abs=1e-5)
    assert [r["step"] for r in read_report(two)["epochs"]] == list(range(1, EPOCHS + 1))  # accumulation 2
    weights_one, weights_two = final_weights(one), final_weights(two)
    assert weights_one.keys() == weights_two.keys()
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.slow
def test_lightning_ddp_equals_one_process(lightning_ddp: tuple[Path, str], reference: Path) -> None:
    """2 processes x 4 per device trace the same loss curve and end at the same weights as
    1 process x 8: the ranks' parts, gradient averaging and accumulation agree."""
    assert_same_training(lightning_ddp[0], reference)
    # The losses really moved (the comparison would be vacuous on a constant curve).
    assert max(losses(reference)) - min(losses(reference)) > 1e-3


@pytest.mark.slow
def test_torchrun_two_nodes_share_one_run_dir_and_equal_one_process(
    torchrun_two_nodes: tuple[Path, list[str]], reference: Path
) -> None:
    cwd, outputs = torchrun_two_nodes
    run_dir = only_run_dir(cwd)
    assert run_dir.name == "job42"  # outputs/<task>/<rendezvous id>, the same on both nodes
    assert_same_training(run_dir, reference)
    # Only global rank 0 wrote Hydra's files and the log file.
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "config.yaml").is_file()
    log = (run_dir / "train.log").read_text()
    assert "global rank 0 of 2: seed 12345" in log and "global rank 1" not in log


@pytest.mark.slow
def test_seed_differs_per_global_rank(torchrun_two_nodes: tuple[Path, list[str]]) -> None:
    """Rank 1 is the only process of node 1 (local rank 0 there): NVIDIA's local-rank seeding would give
    it rank 0's seed."""
    text = "\n".join(torchrun_two_nodes[1])
    assert "global rank 0 of 2: seed 12345" in text and "global rank 1 of 2: seed 12346" in text


@pytest.mark.slow
def test_validation_exact_across_process_counts(lightning_ddp: tuple[Path, str], folder: Path, tmp_path: Path) -> None:
    """The 2-process run validated its last weights on unpadded parts of 11 + 10 images; one process
    evaluating the same checkpoint must get identical numbers (padding would count 1 image twice)."""
    from imgcls.run.evaluate import run as evaluate

    run_dir = lightning_ddp[0]
    two = read_report(run_dir)["epochs"][-1]
    out = tmp_path / "eval.json"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    cfg = compose_config(
        [f"ckpt={ckpt}", f"data.root={folder}", "data.batch_size=4", f"output={out}"], "evaluate", run_dir=tmp_path
    )
    one = evaluate(cfg)
    assert one["val.top1"] == pytest.approx(two["val.top1"], abs=1e-6)
    assert one["val.loss"] == pytest.approx(two["val.loss"], rel=1e-5)


@pytest.mark.slow
def test_lightning_launcher_children_stay_out_of_hydra_files(lightning_ddp: tuple[Path, str]) -> None:
    run_dir, output = lightning_ddp
    assert "global rank 1 of 2: seed 12346" in output  # rank 1 ran and logged to its console
    assert "global rank 1" not in (run_dir / "train.log").read_text()  # but not into rank 0's log file
    assert len(list(run_dir.rglob("config.yaml"))) == 2  # RUN_DIR/config.yaml and .hydra/config.yaml


@pytest.mark.slow
def test_ema_trains_under_ddp(folder: Path, tmp_path: Path) -> None:
    """recipe.ema_decay on 2 gloo ranks (as every TF2 EfficientNet experiment sets it on 8 GPUs): DDP must not wait
    for gradients of the EMA copy, which died at the second step with "parameters that were not used in
    producing the loss". The EMA copy is updated and validated, and the checkpoint holds both weight sets."""
    args = tiny_overrides(folder, *TWO_PROCESSES, "trainer.devices=2", "recipe.ema_decay=0.5", "recipe.epochs=1")
    result = warm_python.run([ROOT / "train.py", *args, f"hydra.run.dir={tmp_path}"], base_env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "global rank 1 of 2" in result.stdout + result.stderr
    row = read_report(tmp_path)["epochs"][0]
    assert row["step"] == 6 and "val_ema.top1" in row  # 48 images / (2 ranks x 4)
    weights = final_weights(tmp_path)
    ema = {k.removeprefix("ema.module."): v for k, v in weights.items() if k.startswith("ema.module.")}
    net = {k.removeprefix("net."): v for k, v in weights.items() if k.startswith("net.")}
    assert ema.keys() == net.keys()
    assert not torch.equal(ema["fc.weight"], net["fc.weight"])  # averaged, not a copy


@pytest.mark.slow
def test_cpu_runs_are_bitwise_reproducible(reference: Path, folder: Path, tmp_path: Path) -> None:
    run(compose_config(deterministic(folder, "data.batch_size=8"), run_dir=tmp_path))
    assert losses(tmp_path) == losses(reference)  # exact, not approx
    again, first = final_weights(tmp_path), final_weights(reference)
    assert all(torch.equal(again[k], first[k]) for k in first)
    rows = [r["train.loss"] for r in csv.DictReader((tmp_path / "csv" / "metrics.csv").open()) if r["train.loss"]]
    assert len(rows) == EPOCHS  # one row per optimizer step (log_every_n_steps=1)


@pytest.mark.slow
def test_augmenting_runs_are_bitwise_reproducible_and_seed_sensitive(folder: Path, tmp_path: Path) -> None:
    """With random crops, flips and mixup on: the same seed gives the same run, another seed another."""
    args = tiny_overrides(folder, "recipe.epochs=1", "recipe.mixup=0.2", "trainer.log_every_n_steps=1")
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        run(compose_config([*args, f"seed={seed}"], run_dir=tmp_path / name))
    curve = {n: [r["train.loss"] for r in csv.DictReader((tmp_path / n / "csv" / "metrics.csv").open())] for n in "abc"}
    assert curve["a"] == curve["b"] and curve["a"] != curve["c"]


@pytest.mark.slow
def test_sync_batchnorm_on_cpu_ddp_is_refused_in_one_line(folder: Path, tmp_path: Path) -> None:
    from imgcls.errors import ConfigError

    args = tiny_overrides(folder, "data.batch_size=4", "trainer.devices=2", "trainer.sync_batchnorm=true")
    with pytest.raises(ConfigError, match="sync_batchnorm=true needs GPUs"):
        run(compose_config(args, run_dir=tmp_path))


def test_deterministic_sets_lightnings_deterministic_mode(folder: Path, tmp_path: Path) -> None:
    from imgcls.run.plan import resolve_plan
    from imgcls.run.trainer import build_trainer

    cfg = compose_config(tiny_overrides(folder, "deterministic=true"), run_dir=tmp_path)
    try:
        trainer = build_trainer(cfg, resolve_plan(cfg), [], [])
        assert torch.are_deterministic_algorithms_enabled() and trainer.logger is None
        assert torch.backends.cudnn.benchmark is False  # autotuning could pick other algorithms per process
    finally:
        torch.use_deterministic_algorithms(False)  # global state: leave it as other tests expect


def test_cudnn_autotuning_is_on_as_in_nvidias_runs(folder: Path, tmp_path: Path) -> None:
    from imgcls.run.plan import resolve_plan
    from imgcls.run.trainer import build_trainer

    try:
        build_trainer(
            compose_config(tiny_overrides(folder), run_dir=tmp_path),
            resolve_plan(compose_config(tiny_overrides(folder), run_dir=tmp_path)),
            [],
            [],
        )
        assert torch.backends.cudnn.benchmark is True
        cfg = compose_config(tiny_overrides(folder, "trainer.benchmark=false"), run_dir=tmp_path)
        build_trainer(cfg, resolve_plan(cfg), [], [])
        assert torch.backends.cudnn.benchmark is False  # the user's choice wins
    finally:
        torch.backends.cudnn.benchmark = False  # global state: leave it as other tests expect


# --- the run-dir rule, without processes ------------------------------------------------------------


def test_torchrun_ranks_get_the_same_pinned_dir() -> None:
    for rank in ("0", "1"):
        env = {"TORCHELASTIC_RUN_ID": "abc", "WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": "0"}
        # Only the dir: what rank 1 does not write is the config's rule (conf/hydra/default.yaml), tested below
        assert launch_overrides(["model=resnet18"], "train", env) == ["hydra.run.dir=outputs/train/abc"]


def test_a_one_process_torchrun_restart_finds_its_run_dir() -> None:
    """torchrun --nproc_per_node=1 --max-restarts=N: the restarted process has the same rendezvous id and must land
    in the same dir, where its checkpoints are (it started over in a new timestamped dir). Without an id (torchrun's
    static default) a single process keeps the timestamped dir."""
    first = {"TORCHELASTIC_RUN_ID": "job7", "WORLD_SIZE": "1", "RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"}
    restarted = {**first, "TORCHELASTIC_RESTART_COUNT": "1"}
    assert launch_overrides([], "train", first) == launch_overrides([], "train", restarted)
    assert launch_overrides([], "train", restarted) == ["hydra.run.dir=outputs/train/job7"]
    assert launch_overrides([], "train", {**first, "TORCHELASTIC_RUN_ID": "none"}) == []


def test_srun_pins_the_job_id_and_explicit_dirs_win() -> None:
    env = {"SLURM_JOB_ID": "777", "SLURM_NTASKS": "8", "SLURM_PROCID": "3"}
    assert launch_overrides([], "train", env)[0] == "hydra.run.dir=outputs/train/777"
    assert launch_overrides(["hydra.run.dir=/x"], "train", env) == []
    assert launch_overrides(["-m", "seed=1,2"], "train", env) == []  # sweeps: hydra.sweep.dir
    # A single-task batch job (sbatch without srun) keys on its job id too: requeued, it finds its checkpoints.
    single = {"SLURM_JOB_ID": "777", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "rn50"}
    assert launch_overrides([], "train", single) == ["hydra.run.dir=outputs/train/777"]
    # An interactive allocation keeps the timestamped dir: every command there is a new run.
    assert launch_overrides([], "train", {**single, "SLURM_JOB_NAME": "interactive"}) == []
    assert launch_overrides([], "train", {**single, "SLURM_JOB_NAME": "bash"}) == []


def test_lightning_children_and_single_runs_get_no_overrides() -> None:
    argv = ["hydra.run.dir=/r", "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"]
    assert launch_overrides(argv, "train", {"LOCAL_RANK": "1"}) == []
    assert launch_overrides([], "train", {}) == []  # a plain single-process run is untouched


@pytest.mark.slow
@pytest.mark.parametrize("rank", ["0", "1"])
def test_only_rank_zero_of_a_multi_task_sweep_job_writes_hydra_files_and_the_log(tmp_path: Path, rank: str) -> None:
    """A submitit job of several tasks runs Hydra's job setup in every task, from the pickled sweep config: no
    command line of its own that launch_overrides could quiet. Every rank wrote .hydra/ and appended to the log;
    now the config itself (conf/hydra/default.yaml) reads the task's rank where Hydra uses it. Here one task of
    such a job: a sweep's job (the basic launcher runs it in this process, as submitit runs it in a task) with
    the task's SLURM_PROCID."""
    data = make_image_folder(tmp_path / "data", classes=2, train_per_class=8, val_per_class=2)
    sweep = tmp_path / "sweep"
    env = {**clean_env(), "WANDB_MODE": "offline", "SLURM_PROCID": rank}
    argv = [
        ROOT / "train.py",
        "-m",
        f"hydra.sweep.dir={sweep}",
        *tiny_overrides(data, "trainer.max_steps=1", "logger=none"),
    ]
    result = warm_python.run(argv, cwd=tmp_path, base_env=env, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    job = sweep / "0"
    assert (job / "checkpoints" / "last.ckpt").is_file()  # the job ran
    written = sorted(p.name for p in [*job.glob(".hydra/*"), *job.glob("*.log")])
    assert written == (["config.yaml", "hydra.yaml", "overrides.yaml", "train.log"] if rank == "0" else [])
    if rank == "0":
        assert (job / "train.log").stat().st_size > 0


def test_torchrun_without_an_id_fails_in_one_line(tmp_path: Path) -> None:
    env = {**clean_env(), "TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=resnet18"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "imgcls: error: under torchrun the ranks need a shared run dir: pass hydra.run.dir=DIR, or give "
        "torchrun --rdzv-id=ID (or --standalone on one node)"
    ]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
def test_ddp_run_stopped_mid_epoch_resumes_to_identical_weights(folder: Path, tmp_path: Path, backend: str) -> None:
    """2 processes with random crops, flips and mixup, stopped inside an epoch (trainer.max_steps=4 of 12)
    and resumed with ckpt_path=last: the same final weights, bitwise, as the run that was not stopped.
    Covers each rank's sampler position, RNG state (all-gathered into the checkpoint) and the per-sample
    augmentation seeds under DDP; with dali_cpu, each rank's own DALI reader checkpoint (the ranks read
    different records, so rank 0's position would resume rank 1 at the wrong place)."""
    args = tiny_overrides(
        folder, *TWO_PROCESSES, "trainer.devices=2", "recipe.mixup=0.2", "recipe.global_batch_size=8",
        "data.num_workers=1", f"data.backend={backend}",
    )  # fmt: skip

    def train(run_dir: Path, *extra: str) -> None:
        result = warm_python.run(
            [ROOT / "train.py", *args, f"hydra.run.dir={run_dir}", *extra], base_env=clean_env(), timeout=TIMEOUT
        )
        assert result.returncode == 0, result.stderr[-3000:]

    train(tmp_path / "ref")
    train(tmp_path / "resumed", "trainer.max_steps=4")
    stopped = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert stopped["global_step"] == 4  # 48 images / (2 ranks x 4) = 6 steps an epoch: mid-epoch
    train(tmp_path / "resumed", "ckpt_path=last")
    ref, resumed = final_weights(tmp_path / "ref"), final_weights(tmp_path / "resumed")
    assert torch.load(tmp_path / "ref" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 12
    for name, tensor in ref.items():
        assert torch.equal(resumed[name], tensor), name
    assert [r["step"] for r in read_report(tmp_path / "resumed")["epochs"]] == [6, 12]


FAULT_ON_ONE_RANK = """
import sys
import time
from pathlib import Path
import lightning as L
import torch
from imgcls.callbacks.finite_loss import FiniteLoss
from imgcls.errors import TrainingError


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        loss = self.layer(batch[0]).pow(2).mean()
        return loss * float("nan") if self.global_rank == 1 and i == 9 else loss  # rank 1 only, step 10

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)))
        return torch.utils.data.DataLoader(data, batch_size=2)


class Say(L.Callback):  # at once, before the teardown (whose collectives fail once the other rank has gone)
    def on_exception(self, trainer, module, error):
        if isinstance(error, TrainingError):
            said = Path(sys.argv[1]).with_name("rank0-said")  # both ranks get the same argv
            if trainer.global_rank == 0:
                print(f"rank 0: {error}", flush=True)
                said.touch()
            else:  # Lightning's observer SIGKILLs rank 0 within 5 s of a child's failed exit: rank 1 stays until
                deadline = time.monotonic() + 300  # rank 0 has said what it says, however slow (bounds a hang only)
                while not said.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                # After rank 0's line, not beside it: the ranks share the pipe, and unbuffered writes of two
                # processes interleaved mid-line once (CI: "...recipe.lr_per_256)rank 0: ...").
                print(f"rank 1: {error}", flush=True)


trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=20, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[FiniteLoss(sys.argv[1]), Say()])
trainer.fit(Net())
"""


@pytest.mark.slow
def test_a_fault_on_one_rank_is_named_alike_on_every_rank(tmp_path: Path) -> None:
    """Rank 1's loss is NaN at the step of a check; rank 0's own values are clean. Both stop, and rank 0 names
    rank 1's NaN loss (it used to say "a weight or buffer of the model is not finite")."""
    script = tmp_path / "fault_on_one_rank.py"
    script.write_text(FAULT_ON_ONE_RANK)
    env = {**clean_env(), "MASTER_PORT": str(free_port())}
    result = warm_python.run([script, str(tmp_path / "last.ckpt")], base_env=env, cwd=tmp_path, timeout=TIMEOUT)
    assert result.returncode != 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("rank 0: ")]
    assert len(lines) == 1, result.stdout[-2000:] + result.stderr[-3000:]
    line = lines[0]
    assert "train.loss is nan on rank 1 at step 9 (epoch 0, batch 9)" in line, line
