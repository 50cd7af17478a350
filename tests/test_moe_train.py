"""Pretraining on CPU: the tiny model learns, checkpoints, resumes bit-exactly; CLI and DDP."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from foldmill.cli import main as cli_main
from foldmill.errors import CheckpointError, FoldmillError
from foldmill.moe.config import SAME_VALUES_EITHER_WAY, TrainConfig, memory_saving_settings, model_config
from foldmill.moe.data.corpus import prepare_corpus
from foldmill.moe.data.loader import BatchSampler, PackedWindows, document_ids
from foldmill.moe.data.tokenizers import PAD
from foldmill.moe.model.decoder import MoEDecoder
from foldmill.moe.train.evaluate import evaluate_checkpoint
from foldmill.moe.train.launch import train_arguments
from foldmill.moe.train.loss import accumulate_gradients, batch_loss
from foldmill.moe.train.metrics import attended_fraction, flops_per_token, mfu, mfu_columns, spec_peaks
from foldmill.moe.train.optim import learning_rate
from foldmill.moe.train.trainer import Trainer, model_parameters

SMALL = TrainConfig(steps=6, batch_size=4, seq_len=64, warmup_steps=2, log_every=3, checkpoint_every=3, eval_batches=2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_dir):
    path = tmp_path_factory.mktemp("corpus")
    prepare_corpus([data_dir / "proteomes/yeast_chr1.fasta"], path, val_fraction=0.05)
    return path


def test_tiny_model_learns(corpus, tmp_path):
    config = TrainConfig(steps=24, batch_size=8, seq_len=64, lr=5e-3, warmup_steps=3, log_every=4, eval_batches=2)
    summary = Trainer(corpus, tmp_path, config).fit()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if "loss" in line]
    assert losses[-1] < losses[0] - 0.3, losses  # from ~ln(29) = 3.37 towards amino-acid statistics
    assert summary["val_perplexity"] < 29 and summary["steps"] == 24
    assert all(len(line["router_max_load"]) == 2 for line in lines if "loss" in line)
    assert json.loads((tmp_path / "summary.json").read_text())["checkpoint"].endswith("step_00000024")


def test_logged_mfu_counts_the_attention_the_records_of_its_batches_keep(corpus, tmp_path):
    # A CPU has no spec peak: the run is given one.
    config = TrainConfig(steps=4, batch_size=2, seq_len=256, warmup_steps=1, log_every=2, eval_batches=1,
                         peak_tflops=0.5)
    trainer = Trainer(corpus, tmp_path, config)
    sampler = BatchSampler(len(trainer.train_windows), config.batch_size, config.seed)
    fractions = [attended_fraction(document_ids(trainer.train_windows.batch(sampler.next_indices())[:, :-1]))
                 for _ in range(config.steps)]
    assert min(fractions) < 0.9  # records start inside these windows
    trainer.fit()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [line for line in logged if "mfu" in line]
    assert len(logged) == 2
    for line, window in zip(logged, (fractions[:2], fractions[2:])):
        want = mfu(line["tokens_per_second_per_gpu"], trainer.model_config, config.seq_len, config.peak_tflops,
                   sum(window) / len(window))
        assert line["mfu"] == pytest.approx(want, rel=1e-12)
        assert "mfu_fp8" not in line  # bf16 experts


def test_mfu_is_held_against_the_gpus_spec_peaks_and_never_a_made_up_one(corpus, tmp_path):
    """MFU against NVIDIA's dense (no sparsity) datasheet peaks of the GPU, FP8 too for 8-bit experts;
    where no peak is known (a CPU, an unlisted GPU) and none is set, the logs say null, not a number."""
    assert spec_peaks("NVIDIA H200") == spec_peaks("NVIDIA H100 80GB HBM3") == {"bf16": 989.0, "fp8": 1979.0}
    assert spec_peaks("NVIDIA GH200 480GB") == {"bf16": 989.0, "fp8": 1979.0}
    assert spec_peaks("NVIDIA H100 PCIe") == {"bf16": 756.5, "fp8": 1513.0}
    assert spec_peaks("NVIDIA H100 NVL") == spec_peaks("NVIDIA H200 NVL") == {"bf16": 835.5, "fp8": 1670.5}
    assert spec_peaks("NVIDIA A100-SXM4-80GB") == {"bf16": 312.0}
    assert spec_peaks("NVIDIA L40S") == {}

    fp8 = model_config("tiny", expert_backend="fp8_rowwise")
    rate = 1e15 / flops_per_token(fp8, 64)  # one PFLOP/s
    assert mfu_columns(rate, fp8, 64, spec_peaks("NVIDIA H200")) == pytest.approx({"mfu": 1000 / 989,
                                                                                   "mfu_fp8": 1000 / 1979})
    assert mfu_columns(rate, fp8, 64, spec_peaks("NVIDIA A100-SXM4-80GB")) == {"mfu": pytest.approx(1000 / 312),
                                                                              "mfu_fp8": None}
    assert mfu_columns(rate, model_config("tiny"), 64, {}) == {"mfu": None}

    config = TrainConfig(steps=2, batch_size=2, seq_len=64, warmup_steps=1, log_every=1, eval_batches=1,
                         expert_backend="fp8_rowwise")
    summary = Trainer(corpus, tmp_path, config).fit()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(line["mfu"], line["mfu_fp8"]) for line in logged if "loss" in line] == [(None, None)] * 2
    assert summary["mfu"] is None and summary["mfu_fp8"] is None
    with pytest.raises(FoldmillError, match="peak_tflops"):
        TrainConfig(peak_tflops=-1.0)


def test_a_run_says_what_it_trains_as_it_starts(corpus, tmp_path, caplog):
    config = TrainConfig(steps=2, batch_size=2, seq_len=64, warmup_steps=1, gradient_accumulation_steps=2,
                         eval_batches=1, expert_backend="fp8_rowwise", precision="bf16-mixed", peak_tflops=2.5)
    with caplog.at_level("INFO", logger="foldmill.moe.train.trainer"):
        Trainer(corpus, tmp_path, config).fit()
    assert ("training tiny from step 0 to 2: 2 sequences of 64 tokens per micro-batch, 2 per optimizer step, on 1 x CPU; "
            "experts fp8_rowwise, precision bf16-mixed, CUDA graphs off; MFU against 2.5 TFLOP/s bf16") in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="foldmill.moe.train.trainer"):
        Trainer(corpus, tmp_path / "other", TrainConfig(steps=1, batch_size=1, seq_len=64, eval_batches=1)).fit()
    assert "1 sequence of 64 tokens per micro-batch, 1 per optimizer step" in caplog.text
    assert "no MFU (no peak known: moe.peak_tflops)" in caplog.text


def test_logged_throughput_leaves_out_validation_and_checkpoints(corpus, tmp_path, monkeypatch):
    """Validation and checkpoint saves between steps pause training; the tokens/s (and MFU) of the
    window they fall in count the training steps' time only. Each pause is made 1 s longer here,
    far above what the window's four tiny CPU steps take."""
    import time

    for method in ("validate", "save"):
        real = getattr(Trainer, method)

        def slowed(self, *args, _real=real, **kwargs):
            time.sleep(1.0)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Trainer, method, slowed)
    config = TrainConfig(steps=8, batch_size=2, seq_len=32, warmup_steps=1, log_every=4, eval_every=2,
                         checkpoint_every=2, eval_batches=1)
    Trainer(corpus, tmp_path, config).fit()
    windows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rates = [window["tokens_per_second_per_gpu"] for window in windows if "loss" in window]
    seconds = [4 * config.batch_size * config.seq_len / rate for rate in rates]
    # The second window holds the pauses after steps 4 and 6: over 4 s more if they were counted.
    assert len(seconds) == 2 and seconds[1] < 1.0, seconds


def test_attended_fraction_counts_causal_pairs_within_records():
    assert attended_fraction(torch.zeros(3, 7, dtype=torch.int32)) == 1.0
    # Records of 2 and 3 tokens: 3 + 6 of the window's 15 causal pairs.
    assert attended_fraction(torch.tensor([[0, 0, 1, 1, 1]])) == 9 / 15
    tiny = model_config("tiny")
    attention = 6.0 * tiny.num_layers * 64 * tiny.hidden_size
    assert flops_per_token(tiny, 64) - flops_per_token(tiny, 64, 0.25) == pytest.approx(0.75 * attention)


def test_micro_batches_give_the_gradients_of_their_whole_batch(corpus):
    """moe.gradient_accumulation_steps: the summed gradients of 2 micro-batches of 2 sequences are
    those of the 4 sequences in one pass (no padding, no router loss: both are means over tokens)."""
    windows = PackedWindows(corpus, "train", 64).batch(np.arange(4))
    assert not (windows == PAD).any()
    torch.manual_seed(0)
    model = MoEDecoder(model_config("tiny", expert_backend="grouped"))

    def loss_fn(batch):
        return (batch_loss(model, batch, "fp32", 0.0).loss,)

    gradients, metrics = {}, {}
    for micro_batches in (1, 2, 4):
        model.zero_grad(set_to_none=True)
        metrics[micro_batches] = accumulate_gradients(loss_fn, windows, micro_batches)
        gradients[micro_batches] = {name: p.grad.clone() for name, p in model.named_parameters()}
    for micro_batches in (2, 4):
        assert metrics[micro_batches][0] == pytest.approx(float(metrics[1][0]), rel=1e-6)
        for name, want in gradients[1].items():
            torch.testing.assert_close(gradients[micro_batches][name], want, rtol=1e-4, atol=1e-7, msg=name)
    with pytest.raises(ValueError, match="does not split into 3 equal micro-batches"):
        accumulate_gradients(loss_fn, windows, 3)


def test_a_step_of_micro_batches_trains_on_the_sequences_of_one_larger_batch(corpus, tmp_path):
    config = TrainConfig(**{**SMALL.__dict__, "steps": 2, "batch_size": 2, "gradient_accumulation_steps": 3})
    trainer = Trainer(corpus, tmp_path, config)
    larger = BatchSampler(len(trainer.train_windows), 6, config.seed)
    assert np.array_equal(trainer.sampler.next_indices(), larger.next_indices())
    with pytest.raises(FoldmillError, match="gradient_accumulation_steps must be >= 1"):
        TrainConfig(gradient_accumulation_steps=0)


@pytest.mark.parametrize("backend, micro_batches, on_resume", [
    ("grouped", 1, {}), ("mxfp8", 1, {}), ("grouped", 2, {}),
    # settings that move memory, not values (moe.config.SAME_VALUES_EITHER_WAY)
    ("mxfp8", 1, {"keep_weight_copies": False}), ("fp8_rowwise", 1, {"recompute_experts": True}),
])
def test_resume_is_bit_exact(corpus, tmp_path, backend, micro_batches, on_resume):
    config = TrainConfig(**{**SMALL.__dict__, "expert_backend": backend, "batch_size": SMALL.batch_size // micro_batches,
                            "gradient_accumulation_steps": micro_batches})
    straight = Trainer(corpus, tmp_path / "a", config)
    straight.fit()
    # a crash after step 3: only that checkpoint survives
    shutil.copytree(tmp_path / "a/checkpoints/step_00000003", tmp_path / "b/checkpoints/step_00000003")
    resumed = Trainer(corpus, tmp_path / "b", dataclasses.replace(config, **on_resume))
    resumed.fit()
    assert resumed.step == 6
    want, got = model_parameters(straight), model_parameters(resumed)
    assert all(torch.equal(want[name], got[name]) for name in want)
    assert straight.optimizer.state_dict()["state"][0]["exp_avg"].equal(resumed.optimizer.state_dict()["state"][0]["exp_avg"])


def test_rerunning_a_finished_run_keeps_its_summary_and_log(corpus, tmp_path):
    summary = Trainer(corpus, tmp_path, SMALL).fit()
    written = {name: (tmp_path / name).read_bytes() for name in ("summary.json", "metrics.jsonl")}
    assert Trainer(corpus, tmp_path, SMALL).fit() == summary
    assert {name: (tmp_path / name).read_bytes() for name in written} == written


def test_a_run_stopped_before_its_summary_takes_the_last_logged_step(corpus, tmp_path):
    summary = Trainer(corpus, tmp_path, SMALL).fit()
    (tmp_path / "summary.json").unlink()  # stopped in the final validation, after the last checkpoint
    again = Trainer(corpus, tmp_path, SMALL).fit()
    for key in ("steps", "final_train_loss", "tokens_per_second_per_gpu", "mfu", "checkpoint"):
        assert again[key] == summary[key], key
    assert again["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-6)
    json.loads((tmp_path / "summary.json").read_text(), parse_constant=lambda name: pytest.fail(name))


def test_a_run_directory_keeps_files_training_did_not_write(corpus, tmp_path):
    (tmp_path / "summary.json").write_text('{"mine": 1}')  # a user's file of a name training writes
    with pytest.raises(FoldmillError, match=r"holds files foldmill pretrain did not write \(e.g. summary.json\)"):
        Trainer(corpus, tmp_path, SMALL)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["summary.json"]
    assert (tmp_path / "summary.json").read_text() == '{"mine": 1}'
    # files of other names may sit beside a run, which then resumes as usual
    run = tmp_path / "run"
    Trainer(corpus, run, SMALL).fit()
    (run / "notes.txt").write_text("mine")
    assert Trainer(corpus, run, dataclasses.replace(SMALL, steps=9)).fit()["steps"] == 9
    assert (run / "notes.txt").read_text() == "mine"
    # a run directory that is a file
    (tmp_path / "a_file").write_text("mine")
    with pytest.raises(FoldmillError, match="a_file: exists and is not a directory; foldmill pretrain wrote nothing"):
        Trainer(corpus, tmp_path / "a_file", SMALL)
    assert (tmp_path / "a_file").read_text() == "mine"


def test_a_resumed_run_logs_as_one_uninterrupted_run(corpus, tmp_path):
    Trainer(corpus, tmp_path / "a", SMALL).fit()
    straight = (tmp_path / "a/metrics.jsonl").read_text().splitlines()
    # stopped while writing step 6's record, after its checkpoint at step 3
    shutil.copytree(tmp_path / "a/checkpoints/step_00000003", tmp_path / "b/checkpoints/step_00000003")
    (tmp_path / "b/metrics.jsonl").write_text("\n".join(straight[:2]) + "\n" + straight[2][:10])
    Trainer(corpus, tmp_path / "b", SMALL).fit()
    resumed = (tmp_path / "b/metrics.jsonl").read_text().splitlines()
    timing = ("tokens_per_second_per_gpu", "mfu")
    assert [{k: v for k, v in json.loads(line).items() if k not in timing} for line in resumed] == \
           [{k: v for k, v in json.loads(line).items() if k not in timing} for line in straight]


def test_asking_for_fewer_steps_than_a_run_holds_is_a_one_line_error(corpus, tmp_path):
    Trainer(corpus, tmp_path, SMALL).fit()
    with pytest.raises(FoldmillError, match="already trained to step 6, past the 3 steps asked for"):
        Trainer(corpus, tmp_path, dataclasses.replace(SMALL, steps=3)).fit()


def test_resume_with_half_the_micro_batch_draws_the_same_sequences(corpus, tmp_path):
    """Halving batch_size and doubling gradient_accumulation_steps, as memory_saving_settings offers
    to a run that ran out of memory: it resumes and trains on the same sequences per step."""
    straight = Trainer(corpus, tmp_path / "a", SMALL)
    straight.fit()
    shutil.copytree(tmp_path / "a/checkpoints/step_00000003", tmp_path / "b/checkpoints/step_00000003")
    halved = dataclasses.replace(SMALL, batch_size=SMALL.batch_size // 2, gradient_accumulation_steps=2)
    resumed = Trainer(corpus, tmp_path / "b", halved)
    resumed.fit()
    assert resumed.step == 6 and resumed.sampler.state_dict() == straight.sampler.state_dict()
    # The same sequences, summed in another order (and the router's balancing loss is taken per
    # micro-batch): close, not the same bits.
    want, got = model_parameters(straight), model_parameters(resumed)
    assert all(torch.allclose(want[name], got[name], rtol=0, atol=1e-3) for name in want)


def test_memory_saving_settings_offer_what_a_run_does_not_use_yet():
    def names(config: TrainConfig) -> list[str]:
        return [setting.split(" (")[0] for setting in memory_saving_settings(config)]

    assert names(TrainConfig(expert_backend="mxfp8", batch_size=8)) == [
        "moe.keep_weight_copies: false", "moe.mxfp8_store_swiglu_input: true",
        "moe.batch_size: 4 with moe.gradient_accumulation_steps: 2", "moe.recompute_experts: true"]
    assert names(TrainConfig(expert_backend="fp8_rowwise", keep_weight_copies=False, batch_size=3)) == [
        "moe.recompute_experts: true"]
    assert names(TrainConfig(expert_backend="mxfp8", mxfp8_store_swiglu_input=True, keep_weight_copies=False,
                             batch_size=1)) == []
    # What says it resumes with the same results, the resume check lets through.
    for setting in memory_saving_settings(TrainConfig(expert_backend="mxfp8")):
        if "same results" in setting:
            assert setting.removeprefix("moe.").split(":")[0] in SAME_VALUES_EITHER_WAY


@pytest.mark.parametrize(("setting", "refusal"), [
    ({"lr": -1.0}, "lr and grad_clip must be finite numbers > 0, not -1.0 and 1.0"),
    ({"lr": float("nan")}, "lr and grad_clip must be finite numbers > 0, not nan and 1.0"),
    ({"grad_clip": 0.0}, "lr and grad_clip must be finite numbers > 0, not 0.003 and 0.0"),
    ({"log_every": 0}, "log_every must be >= 1, not 0"),
    ({"warmup_steps": -3}, "warmup_steps must be >= 0, not -3"),
    ({"eval_batches": -1}, "eval_batches must be >= 0, not -1"),
    ({"aux_loss_coef": float("nan")}, "aux_loss_coef must be >= 0.0, not nan"),
    ({"beta2": 1.5}, "min_lr_ratio must be <= 1 (not 0.1) and beta1, beta2 < 1 (not 0.9, 1.5)"),
])
def test_a_setting_out_of_range_is_refused_before_training(setting, refusal):
    """Values that would divide by zero (log_every 0), evaluate nothing (eval_batches -1) or fail
    inside torch's optimizer (lr -1, NaN) are refused as the config is made, naming the setting."""
    with pytest.raises(FoldmillError) as error:
        TrainConfig(**setting)
    assert str(error.value) == refusal


def test_the_by_hand_steps_refuse_values_out_of_range_in_one_line(corpus, tmp_path, capsys, data_dir):
    """Before: a shard of 0 tokens was written forever (until the disk filled), a batch of 0
    sequences ended in a traceback, and max-batches -1 evaluated nothing (a loss of NaN)."""
    out = tmp_path / "c"
    assert cli_main(["pretrain", "prepare-corpus", str(data_dir / "proteomes/yeast_chr1.fasta"), "-o", str(out),
                     "--shard-tokens", "0"]) == 2
    assert capsys.readouterr().err == "foldmill: error: shard_tokens must be >= 1, got 0\n"
    assert not out.exists() and sorted(tmp_path.iterdir()) == []
    for option, value, both in (("--batch-size", "0", "0 and 50"), ("--max-batches", "-1", "8 and -1")):
        assert cli_main(["pretrain", "evaluate", "--corpus", str(corpus), "--checkpoint", str(tmp_path / "run"),
                         option, value]) == 2
        assert capsys.readouterr().err == (f"foldmill: error: batch_size must be >= 1 and max_batches >= 0 "
                                           f"(0: every batch), not {both}\n")


def test_a_step_larger_than_the_corpus_is_refused_in_one_line(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main(["pretrain", "train", "--corpus", str(corpus), "--run-dir", str(run), "--batch-size", "100000",
                     "--steps", "1", "--seq-len", "64"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"foldmill: error: {corpus}: "), errors
    assert "fewer than the 100000 sequences of one optimizer step" in errors[0]
    assert not run.exists()


def test_a_run_out_of_memory_names_the_settings_that_fit_it(corpus, tmp_path):
    """A real allocation failure: the process may use 1 GiB more address space than its libraries
    take, and bio_8x1b's experts need several. One line, no traceback, naming the run and the
    settings that lower its memory."""
    script = (
        "import resource, sys\n"
        "import foldmill.cli, foldmill.cli.pretrain, foldmill.moe.train.launch, foldmill.moe.train.trainer\n"
        "status = open('/proc/self/status').read()\n"
        "size = int(status.split('VmSize:')[1].split()[0]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))\n"
        "sys.exit(foldmill.cli.main(sys.argv[1:]))\n"
    )
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", script, "pretrain", "train", "--corpus", str(corpus), "--run-dir",
                             str(run), "--model", "bio_8x1b", "--expert-backend", "mxfp8", "--steps", "1",
                             "--batch-size", "2", "--seq-len", "64"],
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"foldmill: error: {run}: out of memory (DefaultCPUAllocator: can't allocate memory"), line
    assert "no checkpoint yet. To fit it, set one of: moe.keep_weight_copies: false (resumes, same results); " in line


def test_checkpoint_written_before_a_model_field_existed_resumes(corpus, tmp_path):
    """A run checkpointed by an older foldmill, whose model configuration lacks fields added since,
    resumes with those fields at their defaults."""
    config = TrainConfig(**{**SMALL.__dict__, "steps": 3})
    Trainer(corpus, tmp_path, config).fit()
    state_file = tmp_path / "checkpoints/step_00000003/trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["model_config"]["fp8_fast_accumulation"]
    state_file.write_text(json.dumps(state))
    resumed = Trainer(corpus, tmp_path, TrainConfig(**{**SMALL.__dict__, "steps": 4}))
    resumed.fit()
    assert resumed.step == 4


def test_fp8_checkpoint_from_before_fast_accumulation_resumes_only_with_promoted_sums(corpus, tmp_path):
    """An FP8 run checkpointed before moe.fp8_fast_accumulation existed summed in fp32: resuming it
    under the new default would change its numerics mid-run, so that is refused, naming the setting;
    with fp8_fast_accumulation false it resumes."""
    fp8 = {**SMALL.__dict__, "expert_backend": "fp8_rowwise", "fp8_fast_accumulation": False}
    Trainer(corpus, tmp_path, TrainConfig(**{**fp8, "steps": 3})).fit()
    state_file = tmp_path / "checkpoints/step_00000003/trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["model_config"]["fp8_fast_accumulation"]
    state_file.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="fp8_fast_accumulation False there, True here"):
        Trainer(corpus, tmp_path, TrainConfig(**{**fp8, "steps": 4, "fp8_fast_accumulation": True})).fit()
    resumed = Trainer(corpus, tmp_path, TrainConfig(**{**fp8, "steps": 4}))
    resumed.fit()
    assert resumed.step == 4 and resumed.model_config.fp8_fast_accumulation is False


def test_fast_accumulation_is_on_for_fp8_and_off_for_the_other_backends():
    from foldmill.moe.train.trainer import build_model_config

    assert TrainConfig().fp8_fast_accumulation is True
    for backend in ("loop", "grouped", "fp8_rowwise", "mxfp8"):
        model = build_model_config(TrainConfig(model="tiny", expert_backend=backend), vocab_size=32)
        assert model.fp8_fast_accumulation is (backend == "fp8_rowwise"), backend


def test_checkpoint_of_another_model_is_refused(corpus, tmp_path):
    Trainer(corpus, tmp_path, SMALL).fit()
    other = TrainConfig(**{**SMALL.__dict__, "aux_loss_coef": 0.5})
    with pytest.raises(CheckpointError, match="another model configuration"):
        Trainer(corpus, tmp_path, other).fit()


def test_a_checkpoint_of_another_alphabet_or_a_damaged_one_is_refused_in_one_line(corpus, tmp_path, capsys):
    """A run trained on nucleotides, resumed or evaluated on a protein corpus: refused before any
    weight is read, naming both alphabets. A damaged checkpoint: one line naming the failure (DCP
    wraps it in a CheckpointException, a BaseException, which a handler of Exceptions misses)."""
    genomes = tmp_path / "genomes.fasta"
    bases = np.random.default_rng(0).choice(list("ACGT"), size=(40, 300))
    genomes.write_text("".join(f">g{i}\n{''.join(row)}\n" for i, row in enumerate(bases)))
    nucleotides = tmp_path / "nucleotides"
    prepare_corpus([genomes], nucleotides, alphabet="nucleotide")
    run = tmp_path / "run"
    Trainer(nucleotides, run, TrainConfig(**{**SMALL.__dict__, "steps": 3})).fit()
    checkpoint, metrics = run / "checkpoints/step_00000003", (run / "metrics.jsonl").read_text()
    refusal = (f"{checkpoint}: its model reads the nucleotide alphabet (9 token types) and {corpus} is a protein "
               f"corpus (29): use a corpus of the alphabet it was trained on")
    with pytest.raises(CheckpointError) as error:
        Trainer(corpus, run, TrainConfig(**{**SMALL.__dict__, "steps": 4})).fit()
    assert str(error.value) == refusal + ", or a new run directory"
    assert (run / "metrics.jsonl").read_text() == metrics
    assert cli_main(["pretrain", "evaluate", "--corpus", str(corpus), "--checkpoint", str(run)]) == 2
    assert capsys.readouterr().err == f"foldmill: error: {refusal}\n"

    for shard in checkpoint.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"step_00000003: cannot load checkpoint: EOFError$"):
        Trainer(nucleotides, run, TrainConfig(**{**SMALL.__dict__, "steps": 4})).fit()
    assert cli_main(["pretrain", "evaluate", "--corpus", str(nucleotides), "--checkpoint", str(run)]) == 2
    assert capsys.readouterr().err == f"foldmill: error: {checkpoint}: cannot load model weights: EOFError\n"


def test_a_second_trainer_on_a_training_run_stops_in_one_line(corpus, tmp_path):
    # Another process holds the run's lock, as a trainer started earlier on the same run does.
    from foldmill.moe.train.launch import launch_pretrain
    from foldmill.moe.train.run_lock import LOCK_FILE, RunInUseError

    Trainer(corpus, tmp_path, SMALL).fit()  # a finished run: the lock is free again
    hold = ("import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / LOCK_FILE)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        more = TrainConfig(**{**SMALL.__dict__, "steps": 9})
        with pytest.raises(RunInUseError, match=r"another `foldmill pretrain train` is training this run"):
            Trainer(corpus, tmp_path, more).fit()
        # refused before the model is built, and before torchrun starts workers that would each fail
        for processes in (1, 2):
            with pytest.raises(RunInUseError, match=r"wait for it to finish or stop it$"):
                launch_pretrain(corpus, tmp_path, more, processes=processes)
    finally:
        holder.communicate("")
    assert Trainer(corpus, tmp_path, more).fit()["steps"] == 9  # the lock left with its process


def test_a_file_system_without_flock_trains_unlocked_and_says_so_once(corpus, tmp_path, monkeypatch, caplog):
    # As on a Lustre mount without flock: the kernel answers ENOLCK. Here on a resume, where both
    # the early check in launch_pretrain and the trainer open the lock file.
    import errno
    import fcntl

    from foldmill.moe.train.launch import launch_pretrain

    Trainer(corpus, tmp_path, SMALL).fit()

    def no_flock(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    more = TrainConfig(**{**SMALL.__dict__, "steps": 9})
    with caplog.at_level(logging.WARNING, logger="foldmill.moe.train.run_lock"):
        assert launch_pretrain(corpus, tmp_path, more, processes=1)["steps"] == 9
    warnings = [record.getMessage() for record in caplog.records if "cannot lock" in record.getMessage()]
    assert len(warnings) == 1 and "training without a lock on the run directory" in warnings[0]


def test_refused_resume_names_only_the_settings_the_user_changed(corpus, tmp_path):
    # fp8_fast_accumulation is on by default but off in the model of a non-FP8 backend: forgetting
    # --expert-backend must not also ask for a fast-accumulation value the user never set.
    Trainer(corpus, tmp_path, TrainConfig(**{**SMALL.__dict__, "expert_backend": "fp8_rowwise"})).fit()
    with pytest.raises(CheckpointError) as refused:
        Trainer(corpus, tmp_path, SMALL).fit()
    assert "(expert_backend 'fp8_rowwise' there, 'grouped' here);" in str(refused.value)
    slow_sums = TrainConfig(**{**SMALL.__dict__, "expert_backend": "fp8_rowwise", "fp8_fast_accumulation": False})
    with pytest.raises(CheckpointError, match=r"\(fp8_fast_accumulation True there, False here\);"):
        Trainer(corpus, tmp_path, slow_sums).fit()


def test_adamw_step_with_grad_scale_is_clipping_then_torch_adamw_on_cpu():
    from foldmill.moe.parallel.gradients import clip_factor
    from foldmill.moe.train.optim import AdamW

    torch.manual_seed(3)
    ours, theirs = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    theirs.load_state_dict(ours.state_dict())
    optimizer, reference = AdamW(ours.parameters(), lr=0.1), torch.optim.AdamW(theirs.parameters(), lr=0.1)
    for _ in range(3):
        batch = torch.randn(4, 16) * 50
        ours(batch).square().sum().backward()
        theirs(batch).square().sum().backward()
        norm, factor = clip_factor(ours, 1.0)
        assert factor < 1.0
        optimizer.step(grad_scale=factor)
        assert torch.equal(norm, torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0))
        reference.step()
        optimizer.zero_grad()
        reference.zero_grad()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["grouped", "mxfp8"])
def test_bf16_mixed_with_bf16_experts_trains_as_with_float32_experts(backend):
    """bf16-mixed in one process stores the experts in bf16 with float32 masters (train/precision.py):
    the masters follow exactly the float32 weights of the recipe that casts them on every pass, and
    the bf16 weights are those masters rounded."""
    import copy

    from foldmill.moe.config import model_config
    from foldmill.moe.model.decoder import MoEDecoder
    from foldmill.moe.parallel.gradients import clip_factor
    from foldmill.moe.train.loss import batch_loss
    from foldmill.moe.train.optim import build_optimizer
    from foldmill.moe.train.precision import prepare_parameters

    torch.manual_seed(5)
    cast_each_pass = MoEDecoder(model_config("tiny", expert_backend=backend, vocab_size=29))
    stored_in_bf16 = copy.deepcopy(cast_each_pass)
    masters = prepare_parameters(stored_in_bf16, "bf16-mixed")
    assert len(masters) == 2 * cast_each_pass.config.num_layers
    assert all(weight.dtype == torch.bfloat16 for weight in masters)
    config = TrainConfig(lr=0.02, grad_clip=0.5)
    optimizers = [build_optimizer(cast_each_pass, config), build_optimizer(stored_in_bf16, config, masters)]
    clipped = 0
    for _ in range(3):
        batch = torch.randint(4, 29, (4, 33))
        for model, optimizer in zip((cast_each_pass, stored_in_bf16), optimizers):
            batch_loss(model, batch, "bf16-mixed", 0.01).loss.backward()
            _, factor = clip_factor(model, config.grad_clip)
            clipped += bool(factor < 1)
            optimizer.step(grad_scale=factor)
            optimizer.zero_grad()
    assert clipped == 6  # the clipping factor takes part
    for (name, want), got in zip(cast_each_pass.named_parameters(), stored_in_bf16.parameters()):
        if got in masters:
            assert torch.equal(masters[got], want), name
            assert torch.equal(got, want.bfloat16()), name
            state, want_state = optimizers[1].state[got], optimizers[0].state[want]
            assert state["exp_avg_sq"].dtype == torch.float32 and torch.equal(state["exp_avg_sq"], want_state["exp_avg_sq"])
        else:
            assert torch.equal(got, want), name


def test_bf16_mixed_run_resumes_bit_exactly_and_checkpoints_float32_weights(corpus, tmp_path):
    from foldmill.moe.model.decoder import MoEDecoder
    from foldmill.moe.train.checkpoint import load_model_weights

    config = TrainConfig(**{**SMALL.__dict__, "precision": "bf16-mixed"})
    straight = Trainer(corpus, tmp_path / "a", config)
    straight.fit()
    masters = straight.optimizer.master_weights
    assert masters and all(weight.dtype == torch.bfloat16 for weight in masters)
    shutil.copytree(tmp_path / "a/checkpoints/step_00000003", tmp_path / "b/checkpoints/step_00000003")
    resumed = Trainer(corpus, tmp_path / "b", config)
    resumed.fit()
    want, got = model_parameters(straight), model_parameters(resumed)
    assert all(torch.equal(want[name], got[name]) for name in want)
    assert all(torch.equal(a, b) for a, b in zip(masters.values(), resumed.optimizer.master_weights.values()))
    for a, b in zip(straight.optimizer.state.values(), resumed.optimizer.state.values()):
        assert a["exp_avg"].dtype == b["exp_avg"].dtype and torch.equal(a["exp_avg"], b["exp_avg"])
    # The checkpoint holds the float32 masters, as a run with float32 weights would write them.
    plain = MoEDecoder(straight.model_config)
    load_model_weights(tmp_path / "a/checkpoints/step_00000006", plain)
    by_name = dict(plain.named_parameters())
    for name, weight in straight.model.named_parameters():
        assert torch.equal(by_name[name], masters.get(weight, weight)), name


def test_learning_rate_schedule():
    config = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(5, config) == pytest.approx(0.5)
    assert learning_rate(10, config) == pytest.approx(1.0)
    assert learning_rate(55, config) == pytest.approx(0.55)
    assert learning_rate(100, config) == pytest.approx(0.1)


def test_cli_steps_default_to_what_the_workflow_rules_run():
    """`foldmill pretrain prepare-corpus | train | evaluate` run by hand, without options, train the
    run the rules train from a config without a `moe:` section: the rule's TrainConfig (the keys
    rules/moe.smk passes, at the schema's defaults), its corpus settings and its evaluation."""
    import ast
    import re
    from pathlib import Path

    from foldmill.cli import build_parser
    from foldmill.cli.pretrain import config_from_args
    from foldmill.config import defaults

    workflow = defaults("moe")
    rules = (Path(__file__).parents[1] / "rules" / "moe.smk").read_text(encoding="utf-8")
    rule_keys = ast.literal_eval(re.search(r"MOE_TRAIN_KEYS = (\(.*?\))", rules, re.DOTALL).group(1))
    rule_config = TrainConfig(**{key: workflow[key] for key in rule_keys})

    parser = build_parser()
    by_hand = config_from_args(parser.parse_args(["pretrain", "train", "--corpus", "c", "--run-dir", "r"]), TrainConfig)
    assert by_hand == rule_config
    assert (by_hand.steps, by_hand.seq_len, by_hand.lr, by_hand.precision) == (1000, 1024, 3e-4, "bf16-mixed")
    prepare = parser.parse_args(["pretrain", "prepare-corpus", "a.fasta", "-o", "c"])
    assert (prepare.alphabet, prepare.val_fraction, prepare.shard_tokens) == (
        workflow["alphabet"], workflow["val_fraction"], workflow["shard_tokens"])
    evaluate = parser.parse_args(["pretrain", "evaluate", "--corpus", "c", "--checkpoint", "r"])
    assert (evaluate.batch_size, evaluate.max_batches) == (workflow["batch_size"], workflow["eval_batches"])
    # An option given still wins.
    assert config_from_args(parser.parse_args(["pretrain", "train", "--corpus", "c", "--run-dir", "r", "--lr", "0.01"]),
                            TrainConfig).lr == 0.01


def test_cli_prepare_train_evaluate(tmp_path, data_dir, capsys):
    corpus, run = tmp_path / "corpus", tmp_path / "run"
    assert cli_main(["pretrain", "prepare-corpus", str(data_dir / "proteomes/yeast_chr1.fasta"), "-o", str(corpus)]) == 0
    assert cli_main(["pretrain", "train", "--corpus", str(corpus), "--run-dir", str(run), "--steps", "3",
                     "--batch-size", "2", "--seq-len", "32", "--eval-batches", "2", "--expert-backend", "loop"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith("step 3: train loss")
    # the same command again finds the run finished and reports it, writing nothing
    assert cli_main(["pretrain", "train", "--corpus", str(corpus), "--run-dir", str(run), "--steps", "3",
                     "--batch-size", "2", "--seq-len", "32", "--eval-batches", "2", "--expert-backend", "loop"]) == 0
    assert capsys.readouterr().out.strip() == printed and json.loads((run / "summary.json").read_text()) == summary
    out = tmp_path / "evaluation.json"
    assert cli_main(["pretrain", "evaluate", "--corpus", str(corpus), "--checkpoint", summary["checkpoint"],
                     "--batch-size", "2", "--max-batches", "2", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-6)
    # -o replaces its own earlier result, never a file it did not write
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    for target, code in ((out, 0), (mine, 2)):
        assert cli_main(["pretrain", "evaluate", "--corpus", str(corpus), "--checkpoint", summary["checkpoint"],
                         "--batch-size", "2", "--max-batches", "2", "-o", str(target)]) == code
    assert mine.read_text() == "{}"
    assert "holds files foldmill evaluate did not write (e.g. mine.json)" in capsys.readouterr().err
    assert evaluate_checkpoint(corpus, summary["checkpoint"], 2, 2)["expert_backend"] == "loop"
    # the run directory, or its checkpoints/ folder, stands for its newest checkpoint
    for named in (run, run / "checkpoints"):
        assert evaluate_checkpoint(corpus, named, 2, 2)["checkpoint"] == summary["checkpoint"]
    capsys.readouterr()
    for wrong, problem in ((tmp_path / "nowhere", "no such directory"),
                           (corpus, "neither a checkpoint (trainer_state.json) nor a run holding one")):
        assert cli_main(["pretrain", "evaluate", "--corpus", str(corpus), "--checkpoint", str(wrong)]) == 2
        assert capsys.readouterr().err.strip() == f"foldmill: error: {wrong}: {problem}"
    capsys.readouterr()
    assert cli_main(["pretrain", "train", "--corpus", str(tmp_path / "missing"), "--run-dir", str(run)]) == 2
    assert cli_main(["pretrain", "train", "--corpus", str(corpus), "--run-dir", str(run), "--warmup-steps", "-1"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("foldmill: error: ") for line in errors)
    assert "warmup_steps must be >= 0, not -1" in errors[1]
    # A value outside an option's choices stops at the parser, in one line.
    with pytest.raises(SystemExit) as stopped:
        cli_main(["pretrain", "train", "--corpus", str(corpus), "--run-dir", str(run), "--precision", "fp16"])
    assert stopped.value.code == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("foldmill pretrain train: error: argument --precision: invalid choice: 'fp16'")


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_train_together(corpus, tmp_path, parallel):
    """Two processes, each step of two micro-batches (DDP reduces once per step, under no_sync before
    the last; FSDP2 every micro-batch): the first step's loss and gradient norm are those of
    steps of one batch holding the same sequences (no router loss: it is not a mean over tokens)."""
    logged = {}
    for micro_batches in (2, 1):
        config = TrainConfig(steps=2, batch_size=2 // micro_batches, gradient_accumulation_steps=micro_batches,
                             seq_len=32, eval_batches=1, log_every=1, parallel=parallel, aux_loss_coef=0.0)
        run = tmp_path / f"micro_batches_{micro_batches}"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   "-m", "foldmill", *train_arguments(corpus, run, config)]
        completed = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
        assert completed.stdout.count("step 2: train loss") == 1  # one report, from rank 0
        summary = json.loads((run / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["steps"] == 2
        assert summary["train_config"] == config.__dict__
        logged[micro_batches] = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert logged[2]["step"] == logged[1]["step"] == 1
    assert logged[2]["loss"] == pytest.approx(logged[1]["loss"], rel=1e-5)
    assert logged[2]["grad_norm"] == pytest.approx(logged[1]["grad_norm"], rel=1e-4)


def test_steps_are_captured_in_one_process_and_a_process_group_brings_ddp():
    """moe.cuda_graphs captures the steps of one process: without a process group, or under DDP over
    a group of this process alone (as the GPU tests and the bench's DDP rows run it); not under
    FSDP2 or expert parallelism. wrap_model builds DDP wherever a process group is set up, and
    leaves the model alone without one."""
    import torch.distributed as dist

    from foldmill.moe.config import ModelConfig
    from foldmill.moe.train.distributed import Dist, step_can_be_captured, wrap_model

    model = MoEDecoder(ModelConfig(hidden_size=32, ffn_size=64, num_layers=1))
    cpu = Dist(0, 1, torch.device("cpu"))
    assert step_can_be_captured("ddp", 1) and step_can_be_captured("fsdp", 1)  # one process: nothing to shard
    assert wrap_model(model, "ddp", cpu) is model
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert step_can_be_captured("ddp", 1)
        assert not step_can_be_captured("fsdp", 1) and not step_can_be_captured("ddp", 2)
        wrapped = wrap_model(model, "ddp", cpu)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and wrapped.module is model
        assert not wrapped.broadcast_buffers  # the RoPE tables are computed alike everywhere
    finally:
        dist.destroy_process_group()


def test_train_options_say_what_the_workflow_keys_say(capsys):
    """`foldmill pretrain train --help` gives each option the choices and the description of the
    workflow schema's key of the same name."""
    import argparse

    from foldmill.cli import build_parser
    from foldmill.config import section_schema

    keys = section_schema("moe")["properties"]
    (commands,) = [a for a in build_parser(["pretrain"])._actions if isinstance(a, argparse._SubParsersAction)]
    (steps,) = [a for a in commands.choices["pretrain"]._actions if isinstance(a, argparse._SubParsersAction)]
    options = {action.dest: action for action in steps.choices["train"]._actions}
    for field in dataclasses.fields(TrainConfig):
        option, key = options[field.name], keys[field.name]
        assert option.help.replace("%%", "%").startswith(key["description"]), field.name
        assert option.choices == key.get("enum"), field.name
    with pytest.raises(SystemExit):
        cli_main(["pretrain", "train", "--help"])
    assert "16-27% faster expert GEMMs" in capsys.readouterr().out  # argparse's %-formatting left it whole


def test_train_arguments_round_trip_through_the_command_line_parser():
    """Every TrainConfig field survives train_arguments -> `foldmill pretrain train`'s parser,
    booleans included (argparse's bool("False") would turn them on)."""
    import argparse

    from foldmill.cli.pretrain import config_from_args, register

    config = TrainConfig(model="tiny", steps=7, lr=0.5, compile=False, cuda_graphs=False, precision="bf16")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(train_arguments("corpus", "run", config))
    assert config_from_args(args, TrainConfig) == config
    turned_on = TrainConfig(compile=True, cuda_graphs=True, recompute_experts=True, fp8_fast_accumulation=True)
    assert config_from_args(parser.parse_args(train_arguments("corpus", "run", turned_on)), TrainConfig) == turned_on
    turned_off = TrainConfig(fp8_fast_accumulation=False)
    assert config_from_args(parser.parse_args(train_arguments("corpus", "run", turned_off)), TrainConfig) == turned_off
