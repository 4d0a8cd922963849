"""A model file's per-layer kinds (issue 51): read strictly, written back as read, and
every reject names the field, exits 2 and leaves nothing behind."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from autoplan.descriptors.library import resolve_model
from autoplan.descriptors.model import GDN, MAMBA, NO_MIXER, NO_MLP, Vision
from autoplan.errors import InputError
from tests.helpers import autoplan

BASE = {"name": "hybrid", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 2,
        "ffn_hidden": 2816, "vocab": 32000, "activation": "swiglu", "position": "rope",
        "tied_embeddings": False, "max_seq_len": 8192}
GDN_SIZES = {"linear_heads": 8, "linear_key_heads": 4, "linear_key_dim": 64,
             "linear_value_dim": 64, "conv_kernel": 4}


def _write(tmp_path: Path, model: dict) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"model": model}), encoding="utf-8")
    return path


def test_a_hybrid_model_file_is_read_and_written_back_as_it_was(tmp_path: Path) -> None:
    model = resolve_model(str(_write(tmp_path, {**BASE, "mixers": "GGGA", **GDN_SIZES})))
    assert [model.mixer(i) for i in range(4)] == [GDN, GDN, GDN, "A"]
    again = resolve_model(str(_write(tmp_path, model.to_dict())))
    assert again == model and again.params_total == model.params_total


def test_every_builtin_of_the_new_families_round_trips_through_its_file(tmp_path: Path) -> None:
    for name in ("nemotron-h-56b", "qwen3-vl-235b-a22b", "deepseek-v3.2", "gpt-oss-120b"):
        model = resolve_model(name)
        assert resolve_model(str(_write(tmp_path, model.to_dict()))) == model


def test_mixer_free_and_mlp_free_layers_count_one_norm_each() -> None:
    """Nemotron-H's blocks: a Mamba block and an MLP block each have one norm, so a pattern
    of M. and .- layers counts the mixer, the MLP and two norms per pair."""
    m = resolve_model("nemotron-h-56b")
    mamba = m.params_kind((MAMBA, NO_MLP))
    mlp = m.params_kind((NO_MIXER, "-"))
    assert mamba == m.params_mamba + m.hidden
    assert mlp == 2 * m.hidden * 32768 + m.hidden


def test_vision_counts_qwen3_vl_tower_exactly() -> None:
    """Qwen3-VL-235B's tower: 576,388,336 weights (its checkpoint's vision tensors: the
    published total 235,670,022,896 less the text model's, docs/research)."""
    v = Vision(layers=27, hidden=1152, heads=16, ffn_hidden=4304, patch_size=16, out_hidden=4096,
               merge=2, temporal_patch=2, positions=2304, deepstack=3)
    assert v.params == 576_388_336
    assert resolve_model("qwen3-vl-235b-a22b").vision == v


def test_a_linear_projectors_norm_counts_one_scale_of_the_vision_width_and_is_written_when_set() -> None:
    """Gemma 3's projector: mm_soft_emb_norm (1152) before mm_input_projection_weight."""
    plain = Vision(layers=1, hidden=1152, heads=16, ffn_hidden=4304, patch_size=14,
                   out_hidden=5376, merge=4, projector="linear")
    normed = dataclasses.replace(plain, projector_norm=True)
    assert normed.params_merger - plain.params_merger == 1152
    assert "projector_norm" not in plain.to_dict()  # files of the towers before it unchanged
    assert normed.to_dict()["projector_norm"] is True


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"mixers": "GGXA"}, "mixers", "unknown symbol 'X'"),
    ({"mixers": "GGA"}, "mixers", "one symbol per layer (4), got 3"),
    ({"mixers": "GGGA", **{k: v for k, v in GDN_SIZES.items() if k != "linear_key_dim"}},
     "linear_key_dim", "gated delta net layers (G) need it"),
    ({"sliding_window": 128}, "sliding_window", "no layer is W"),
    ({"mixers": "DDDD", "index_heads": 4, "index_head_dim": 64, "index_topk": 256},
     "mixers", "give kv_lora_rank"),
    ({"mlps": "-E-E"}, "mlps", "give experts too"),
    ({"mixers": "A..A", "mlps": "-..-"}, "mlps", "needs an MLP"),
    ({"mixers": "...."}, "mixers", "no layer mixes tokens"),
    ({"vision": {"layers": 2, "hidden": 100, "heads": 3, "ffn_hidden": 10, "patch_size": 14,
                 "out_hidden": 1024}}, "vision.heads", "divisor of hidden"),
    ({"vision": {"layers": 2, "hidden": 96, "heads": 3, "ffn_hidden": 10, "patch_size": 14,
                 "out_hidden": 1024, "projector": "conv"}}, "vision.projector", "mlp | linear"),
    ({"vision": {"layers": 2, "hidden": 96, "heads": 3, "ffn_hidden": 10, "patch_size": 14,
                 "out_hidden": 1024, "projector_norm": True}}, "vision.projector_norm",
     "projector: linear"),
    ({"mixers": "G" * 20_000, **GDN_SIZES}, "mixers", "one symbol per layer (4), got 20000"),
])
def test_a_bad_layer_pattern_is_refused_naming_its_field(tmp_path: Path, change: dict, field: str,
                                                         words: str) -> None:
    path = _write(tmp_path, {**BASE, **change})
    with pytest.raises(InputError) as err:
        resolve_model(str(path))
    assert any(p.field.endswith(field) and words in p.message for p in err.value.problems), \
        err.value.problems
    out = tmp_path / "plan.yaml"
    result = autoplan("search", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8",
                      "--global-batch", "64", "--seq-len", "4096", "--out", str(out))
    assert result.returncode == 2 and field in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
