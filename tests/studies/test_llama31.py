"""model=llama31_8b (issue 36, a long-context model): the config composes on one, two and four A100s, its committed
profiles are what the builder writes, and `auto` capacity is the KV formula's."""
import math

import pandas as pd
import pytest

from kvstudy import api
from kvstudy.costs.arch import ModelArch
from kvstudy.running.paths import CALIBRATION_FILE, PROFILES_DIR, SHARED_REFERENCE, load_model_arch
from tests.conftest import needs_shared

PROFILE = PROFILES_DIR / "compute" / "a100" / "llama31_8b"


@pytest.mark.parametrize("hardware,tp", [("a100_tp1", 1), ("a100_tp2", 2), ("a100_tp4", 4)])
def test_config_composes(hardware, tp):
    from kvstudy.config.validate import check_config

    cfg = api.compose(["+policy=vllm", "model=llama31_8b", f"hardware={hardware}"])
    check_config(cfg)
    arch = ModelArch.from_mapping(api._plain(cfg.model))
    assert arch == load_model_arch("llama31_8b")
    # meta-llama/Llama-3.1-8B config.json
    assert (arch.num_layers, arch.num_q_heads, arch.num_kv_heads, arch.head_dim) == (32, 32, 8, 128)
    assert (arch.embedding_dim, arch.mlp_hidden_dim, arch.vocab_size, arch.max_model_len) == (4096, 14336, 128256, 131072)
    assert api.hardware_spec(cfg).tensor_parallel == tp
    arch.check_tensor_parallel(tp)


def test_profile_matches_a_rebuild(tmp_path):
    """Every TP of both files, byte for byte (a rebuild takes a few seconds), labelled as the other models' rows are."""
    from kvstudy.profiles.builder import build_model
    from kvstudy.profiles.calibration import load_calibration

    for path in build_model(load_model_arch("llama31_8b"), load_calibration(CALIBRATION_FILE), tmp_path):
        committed = PROFILES_DIR / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), f"{committed} differs from a rebuild"
    for name in ("mlp.csv", "attention.csv"):
        columns = pd.read_csv(PROFILE / name, nrows=0).columns
        assert list(columns) == list(pd.read_csv(PROFILES_DIR / "compute/a100/llama2_70b" / name, nrows=0).columns)
    mlp = pd.read_csv(PROFILE / "mlp.csv")
    assert {tuple(r) for r in mlp[["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size"]].values} \
        == {(32, 8, 4096, 14336, 128256)}
    assert sorted(mlp.num_tensor_parallel_workers.unique()) == [1, 2, 4, 8]
    assert mlp.num_tokens.max() == 131072  # a prompt as long as the context is one profiled iteration
    att = pd.read_csv(PROFILE / "attention.csv")
    assert set(att.max_model_len) == {131072} and set(att.block_size) == {16}
    prefill, decode = att[att.is_prefill], att[~att.is_prefill]
    assert prefill.prefill_chunk_size.max() == 131072 and (prefill.kv_cache_size + prefill.prefill_chunk_size).max() <= 131072
    assert decode.kv_cache_size.max() == 131072 and decode.batch_size.max() == 1024
    assert PROFILE.joinpath("attention.csv").stat().st_size < 12e6  # the long-context grid coarsens past 4,096


@pytest.mark.parametrize("hardware", ["a100_tp1", "a100_tp2", "a100_tp4"])
def test_auto_capacity_is_the_kv_formula(hardware):
    cfg = api.compose(["+policy=vllm", "model=llama31_8b", f"hardware={hardware}", "memory.capacity_tokens=auto"])
    arch, hw, capacity, _ = api.model_setup(cfg, latency=False)
    tp = hw.tensor_parallel
    # kvstudy/costs/capacity.py, as vLLM sizes its cache: 90% of the A100's 79.15 GiB as CUDA reports it, less bf16
    # weights, a 512-token profiling pass (vLLM turns chunked prefill on above a 32K context: 512 tokens; one layer's
    # 2 h + 3 f / tp values per token, 2 bytes, and 256 sequences' logits of 128,256 entries at 2 + 12 bytes) and
    # non-torch memory (1.79 GiB on one GPU, 3.58 GiB on several), in blocks of 16 tokens of K and V of 32 layers x
    # ceil(8 / tp) KV heads x 128 x 2 bytes
    gib = 2 ** 30
    activation = 512 * (2 * 4096 + 3 * 14336 / tp) * 2 + 256 * 128256 * 14
    usable = 0.9 * round(79.15 * gib) - 8.03e9 * 2 / tp - activation - (1.79 if tp == 1 else 3.58) * gib
    per_token = 2 * 32 * math.ceil(8 / tp) * 128 * 2
    assert capacity == math.floor(usable / (16 * per_token)) * 16
    if hardware == "a100_tp1":
        assert per_token == 131072 and capacity == 442448  # 128 KiB per token: 3.4 full contexts


@needs_shared
def test_same_shape_gemm_against_llama2_7b_measurements():
    """Llama-2-7B's measured attn_post_proj is the same 4096 x 4096 GEMM per TP as Llama-3.1-8B's: the generated rows
    sit within the calibration's GEMM target of it (Llama-2-7B is one of the fitted models: a check of the rows, not
    an out-of-sample error)."""
    real = pd.read_csv(SHARED_REFERENCE / "vidur-data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
    ours = pd.read_csv(PROFILE / "mlp.csv")
    col = "time_stats.attn_post_proj.median"
    keys = ["num_tokens", "num_tensor_parallel_workers"]
    both = real[keys + [col]].merge(ours[keys + [col]], on=keys, suffixes=("_real", "_ours"))
    both = both[both[f"{col}_real"] > 0]
    assert len(both) > 1000
    ape = (both[f"{col}_ours"] / both[f"{col}_real"] - 1).abs() * 100
    assert ape.median() <= 10.0
