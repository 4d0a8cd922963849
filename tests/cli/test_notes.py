"""What a first-time user is told before trusting an answer: what a HuggingFace config
imported (and what of it is not modelled), a snapshot folder taken as its config.json,
bad JSON reported as JSON, flags overriding a job file, values past the model."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers import REPO, autoplan

HF = REPO / "tests" / "data" / "hf"
RUN = ("-c", "dgx-h100", "--gpus", "8", "-b", "64", "--top", "1")


def test_a_snapshot_folder_is_read_through_its_config_and_the_import_is_shown(tmp_path: Path) -> None:
    shutil.copy(HF / "Meta-Llama-3-8B.json", tmp_path / "config.json")
    r = autoplan("search", "-m", tmp_path, *RUN, "-s", "4096")
    assert r.returncode == 0, r.stderr
    assert (f"note: imported {tmp_path / 'config.json'} (llama): 32 layers, hidden 4096, "
            "32 heads (8 kv), 8.03B parameters") in r.stderr


def test_an_unmodelled_sliding_window_is_named() -> None:
    r = autoplan("search", "-m", HF / "Mistral-7B-v0.1.json", *RUN, "-s", "4096")
    assert r.returncode == 0, r.stderr
    assert "sliding_window is not modelled: sliding-window attention" in r.stderr


def test_bad_json_is_reported_as_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": }')
    r = autoplan("search", "-m", path, *RUN, "-s", "4096")
    assert r.returncode == 2
    assert f"{path}: line 2, column 17: invalid JSON: Expecting value" in r.stderr


def test_values_past_the_model_and_flags_that_do_nothing_are_noted() -> None:
    r = autoplan("search", "-m", "llama3-8b", *RUN, "-s", "16384", "--moe-imbalance", "1.5")
    assert r.returncode == 0, r.stderr
    assert "seq_len 16,384 exceeds llama3-8b's max_seq_len 8,192" in r.stderr
    assert "--moe-imbalance applies to mixture-of-experts models; llama3-8b is dense" in r.stderr


def test_a_flag_overriding_the_job_file_is_noted(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ngpus: 8\n"
                   "job: {global_batch: 32, seq_len: 4096}\n")
    r = autoplan("search", job, "--global-batch", "64", "--top", "1")
    assert r.returncode == 0, r.stderr
    assert f"note: --global-batch 64 overrides {job}'s 32" in r.stderr
    same = autoplan("search", job, "--global-batch", "32", "--top", "1")
    assert "overrides" not in same.stderr  # the same value changes nothing
