"""``memory.capacity_tokens=auto`` against vLLM's own start-up logs, and Llama2-70B on two A100s by hand.

The published logs (each a named model, GPU, TP and gpu_memory_utilization, as printed in a public GitHub thread):

1. vllm-project/vllm PR #10511 ("[core] overhaul memory profiling", comment of 2024-12-14), ``vllm serve
   meta-llama/Meta-Llama-3-8B`` on an H100-80G (``total_gpu_memory 79.22GiB``; the same figure is an "H100-80G" in
   PR #12126), TP 1, gpu_memory_utilization 0.90::

       total_gpu_memory 79.22GiB / gpu_memory_utilization 0.90 / the current vLLM instance can use 71.29GiB /
       model weights take 14.96GiB / non_torch_memory 1.79GiB / PyTorch activation peak memory 1.26GiB /
       available_kv_cache_memory 53.29GiB

2. The same comment, ``vllm serve meta-llama/Meta-Llama-3-8B -tp 2``::

       total_gpu_memory 79.22GiB / gpu_memory_utilization 0.90 / 71.29GiB / model weights take 7.48GiB /
       non_torch_memory 3.58GiB / PyTorch activation peak memory 1.26GiB

   (the available line is cut in the stored copy; by vLLM's formula it is 71.29 - 7.48 - 3.58 - 1.26 = 58.97 GiB).

3. vllm-project/vllm PR #2031 ("Fix peak memory profiling", Woosuk Kwon, 2023-12-12): "Llama2-7B with TP=1 and
   1xA100-80GB ... This PR: # GPU blocks: 7351" (vLLM 0.2.5, gpu_memory_utilization 0.9, block size 16).

Tolerance: kvstudy's available KV memory within 2% of each log's. The logs print GiB to two decimals (0.01% of
~55 GiB); what remains is kvstudy's estimate of the activation peak (0.05-0.4 GiB off: 1.21 against 1.26 GiB at TP 1,
0.88 against 1.26 GiB at TP 2) and the non-torch memory, which vLLM versions measure differently (vLLM 0.2.5 counted
everything the device had in use after profiling, 1.0 GiB less than kvstudy's 1.79 GiB on Llama-2-7B: -1.7%). Logs 1
and 2 are where kvstudy's non-torch figures (1.79 / 3.58 GiB) come from: for them this test checks the device total,
the weights, the activation estimate and the block rounding, not the non-torch term; log 3 is independent of it.

Not matched, and why (asserted as a bracket below): PR #2031's Llama2-70B on 4 A100s, 31,615 blocks before the PR and
20,865 after it. vLLM 0.2.5 took the whole device's used memory after profiling as the peak, with Ray workers and NCCL
buffers on the same GPUs (the PR's author saw 77.5 GB in use at 0.9); kvstudy's 28,784 lies between the two.

The architectures of Meta-Llama-3-8B (config.json: 32 layers, 32 / 8 heads, 4,096 / 14,336, vocab 128,256, context
8,192, 8.03e9 parameters) and Llama-2-7B (32 layers, 32 / 32 heads, 4,096 / 11,008, vocab 32,000, context 4,096,
6.738e9 parameters) are written here only; Llama-2-70B's with the Hugging Face vocab of 32,000 (kvstudy's model
config pads it to Vidur's 32,768)."""
from __future__ import annotations

import pytest

from kvstudy import api
from kvstudy.costs.arch import ModelArch
from kvstudy.costs.capacity import auto_breakdown, settings_of
from kvstudy.errors import ConfigError
from kvstudy.latency.tables import HardwareSpec

GIB = 2 ** 30
TOLERANCE = 0.02


def _llama(name, layers, q, kv, h, f, vocab, context, params):
    return ModelArch(name=name, num_layers=layers, num_q_heads=q, num_kv_heads=kv, embedding_dim=h, mlp_hidden_dim=f,
                     max_model_len=context, vocab_size=vocab, use_gated_mlp=True, use_bias=False, use_qkv_bias=False,
                     post_attn_norm=True, activation="silu", norm="rms_norm", uses_rope=True, num_params=params)


LLAMA3_8B = _llama("meta-llama-3-8b", 32, 32, 8, 4096, 14336, 128256, 8192, 8.03e9)
LLAMA2_7B = _llama("llama-2-7b", 32, 32, 32, 4096, 11008, 32000, 4096, 6.738e9)
LLAMA2_70B = _llama("llama-2-70b", 80, 64, 8, 8192, 28672, 32000, 4096, 68.98e9)
H100 = {tp: HardwareSpec(f"h100_tp{tp}", "h100", "h100_dgx", tp) for tp in (1, 2)}
A100 = {tp: HardwareSpec(f"a100_tp{tp}", "a100", "a100_dgx", tp) for tp in (1, 2, 4)}

#: (log, model, hardware, vLLM's available KV memory in bytes)
LOGS = [
    ("vllm#10511 Meta-Llama-3-8B H100 TP1", LLAMA3_8B, H100[1], 53.29 * GIB),
    ("vllm#10511 Meta-Llama-3-8B H100 TP2", LLAMA3_8B, H100[2], (71.29 - 7.48 - 3.58 - 1.26) * GIB),
    ("vllm#2031 Llama-2-7B A100-80GB TP1", LLAMA2_7B, A100[1], 7351 * 16 * (2 * 32 * 32 * 128 * 2)),
]


@pytest.mark.parametrize("log, arch, hw, vllm_bytes", LOGS, ids=[log[0] for log in LOGS])
def test_auto_capacity_is_within_two_percent_of_vllms_log(log, arch, hw, vllm_bytes):
    b = auto_breakdown(arch, hw)  # vLLM's defaults: gpu_memory_utilization 0.9, 16-token blocks
    assert b["available_bytes"] == pytest.approx(vllm_bytes, rel=TOLERANCE), log
    per_block = 16 * b["kv_bytes_per_token_per_gpu"]
    assert b["tokens"] == b["blocks"] * 16 and b["blocks"] == int(b["available_bytes"] // per_block)
    assert b["blocks"] == pytest.approx(vllm_bytes / per_block, rel=TOLERANCE)


def test_the_logs_terms_one_by_one():
    """Log 1's printed terms: the device total, the weights and the activation peak (the non-torch term is taken
    from this log, module docstring)."""
    b = auto_breakdown(LLAMA3_8B, H100[1])
    assert round(b["total_bytes"] / GIB, 2) == 79.22
    assert round(0.9 * b["total_bytes"] / GIB, 2) == 71.29
    assert round(b["weights_bytes"] / GIB, 2) == 14.96
    assert round(auto_breakdown(LLAMA3_8B, H100[2])["weights_bytes"] / GIB, 2) == 7.48
    assert b["profile_tokens"] == 8192  # vLLM 0.6's max(max_model_len, 2048)
    assert b["activation_bytes"] / GIB == pytest.approx(1.26, abs=0.1)


def test_vllm_0_2_5_llama2_70b_on_four_a100s_is_bracketed():
    """Not within tolerance (module docstring): between vLLM 0.2.5's conservative profiler and the one before it."""
    blocks = auto_breakdown(LLAMA2_70B, A100[4])["blocks"]
    assert 20865 < blocks < 31615


def test_llama2_70b_on_a100_tp2_by_hand():
    """The MC-SF setting (hardware=a100_tp2, kvstudy's llama2_70b config): per GPU 0.9 x 79.15 GiB, less 68.98e9 B of
    weights (half of 68.98e9 parameters x 2 B), a 4,096-token profiling pass (one layer's 2 x 8,192 + 3 x 28,672 / 2
    values per token x 2 B, and 256 sequences' logits of 32,768 entries x 14 B) and 3.58 GiB non-torch memory, in
    blocks of 16 x 163,840 B (K and V of 80 layers x 4 KV heads x 128 x 2 B). The issue's estimate was 27k-37k
    tokens with less non-torch memory; the MC-SF paper measured M = 16,492 (App. C, kvstudy's default capacity of
    that study, unchanged): kvstudy's 18,672 is 13% above it, where the old 80e9-byte formula gave 6,205."""
    total = round(79.15 * GIB)
    available = 0.9 * total - 68.98e9 - (4096 * (2 * 8192 + 3 * 14336) * 2 + 256 * 32768 * 14) - 3.58 * GIB
    blocks = int(available // (16 * 163840))
    assert (blocks, blocks * 16) == (1167, 18672)
    cfg = api.compose(["+policy=vllm", "memory=paged", "hardware=a100_tp2", "memory.capacity_tokens=auto"])
    arch, hw, capacity, _ = api.model_setup(cfg, latency=False)
    assert capacity == 18672 and 1.1 < capacity / 16492 < 1.2
    # the default capacity of the MC-SF study stays the paper's M
    assert api.model_setup(api.compose(["+policy=mcsf"]), latency=False)[2] == 16492


def test_gpu_memory_utilization_is_a_setting_and_describe_names_every_term():
    common = ["+policy=vllm", "memory=paged", "hardware=a100_tp1", "model=opt_13b", "memory.capacity_tokens=auto"]
    caps = {}
    for util in (0.8, 0.9, 0.95):
        cfg = api.compose([*common, f"memory.gpu_memory_utilization={util}"])
        caps[util] = api.model_setup(cfg, latency=False)[2]
        assert settings_of(cfg)["gpu_memory_utilization"] == util
    # each 0.05 of 79.15 GiB is 3.96 GiB more KV: 5,063 tokens of OPT-13B's 800 KiB (40 layers x 5,120 x 2 x 2 B)
    step = 0.05 * round(79.15 * GIB) / (2 * 40 * 5120 * 2)
    assert caps[0.95] - caps[0.9] == pytest.approx(step, abs=16) and caps[0.9] - caps[0.8] == pytest.approx(2 * step, abs=16)
    cfg = api.compose(common)
    arch, hw, capacity, _ = api.model_setup(cfg, latency=False)
    from kvstudy.costs.capacity import describe

    line = describe("auto", arch, hw, capacity, **settings_of(cfg))
    for term in ("0.9 x 79.15 GiB", "weights 23.93 GiB", "activation peak", "(2,048-token profiling pass)",
                 "non-torch 1.79 GiB", "CUDA graphs 0", "blocks of 16 x 819,200 B", f"{capacity:,} tokens"):
        assert term in line, (term, line)


def test_a_hardware_configs_memory_overrides_the_registry_in_gib():
    common = ["+policy=vllm", "memory=paged", "hardware=a100_tp1", "model=opt_13b", "memory.capacity_tokens=auto"]
    base = api.model_setup(api.compose(common), latency=False)[2]
    smaller = api.model_setup(api.compose([*common, "hardware.memory_gb_per_gpu=70"]), latency=False)[2]
    assert base - smaller == pytest.approx(0.9 * (round(79.15 * GIB) - 70 * GIB) / 819200, abs=16)


@pytest.mark.parametrize("override, match", [
    ("memory.gpu_memory_utilization=1.5", r"^memory.gpu_memory_utilization=1.5: allowed at most 1"),
    ("memory.gpu_memory_utilization=0", r"^memory.gpu_memory_utilization=0: allowed a number > 0"),
    ("memory.gpu_memory_utilization=0.3", r"does not fit on hardware 'a100_tp2'.*memory.gpu_memory_utilization"),
])
def test_bad_utilization_is_one_line(override, match):
    with pytest.raises(ConfigError, match=match):
        api.model_setup(api.compose(["+policy=mcsf", "hardware=a100_tp2", "memory.capacity_tokens=auto", override]),
                        latency=False)


def test_utilization_with_a_fixed_capacity_is_said_to_have_no_effect():
    from kvstudy.running.no_effect import no_effect

    cfg = api.compose(["+policy=mcsf", "memory.gpu_memory_utilization=0.8"])
    assert any(n.startswith("memory.gpu_memory_utilization=0.8 has no effect with memory.capacity_tokens=16492")
               for n in no_effect(cfg, None))
    assert not any("gpu_memory_utilization" in n for n in no_effect(
        api.compose(["+policy=mcsf", "memory.gpu_memory_utilization=0.8", "memory.capacity_tokens=auto"]), None))


def test_a_run_finished_before_the_change_holds_the_same_config():
    """A run folder written when hardware configs said memory_gb_per_gpu: 80 and memory had no gpu_memory_utilization
    is the same config as today's (kvstudy/running/execute.py), so it is not refused as another one."""
    from omegaconf import OmegaConf

    from kvstudy.running.execute import _first_difference, _result_config

    new = OmegaConf.to_container(api.compose(["+policy=mcsf", "hardware=h200_tp2"]), resolve=True)
    old = {**new, "hardware": {**new["hardware"], "memory_gb_per_gpu": 141},
           "memory": {k: v for k, v in new["memory"].items() if k != "gpu_memory_utilization"}}
    assert new["hardware"]["memory_gb_per_gpu"] is None and new["memory"]["gpu_memory_utilization"] == 0.9
    assert _first_difference(_result_config(old), _result_config(new)) is None
    other = {**old, "hardware": {**old["hardware"], "memory_gb_per_gpu": 100}}
    assert _first_difference(_result_config(other), _result_config(new)) == ("hardware.memory_gb_per_gpu", 100, None)


#: vllm-project/vllm issue #10517 (comment of 2024-12-02, vLLM 0.6.x's ``Memory profiling results`` line), Llama-3.1-8B-
#: Instruct on one RTX 3090 at gpu_memory_utilization 0.90 and --max-model-len 20000 (so a 20,000-token profiling pass):
#:     Loading model weights took 14.9888 GB / total_gpu_memory=23.58GiB / peak_torch_memory=17.06GiB /
#:     non_torch_memory=0.35GiB / kv_cache_size=3.81GiB / # GPU blocks: 1952
#: and at --max-model-len 29000: peak_torch_memory=17.98GiB, kv_cache_size=2.89GiB, # GPU blocks: 1478.
#: An independent log (another GPU, another vLLM version, its own non-torch figure), so this checks the formula and
#: the activation estimate with the non-torch memory as that vLLM measured it (``memory.non_torch_gib``).
RTX3090 = HardwareSpec("rtx3090", "rtx3090", "none", 1)
LLAMA31_8B_20K = _llama("llama-3.1-8b-20k", 32, 32, 8, 4096, 14336, 128256, 20000, 8.03e9)
LLAMA31_8B_29K = _llama("llama-3.1-8b-29k", 32, 32, 8, 4096, 14336, 128256, 29000, 8.03e9)


@pytest.mark.parametrize("arch, blocks, activation_gib", [(LLAMA31_8B_20K, 1952, 17.06 - 14.9888),
                                                         (LLAMA31_8B_29K, 1478, 17.98 - 14.9888)],
                         ids=["max-model-len 20000", "max-model-len 29000"])
def test_an_independent_log_on_an_rtx3090(arch, blocks, activation_gib):
    b = auto_breakdown(arch, RTX3090, memory_gib=23.58, non_torch_gib=0.35)
    assert b["profile_tokens"] == arch.max_model_len  # vLLM 0.6's max(max_model_len, 2048) below 32K
    # kvstudy's activation estimate against the peak vLLM measured less the weights: within 13%
    assert b["activation_bytes"] / GIB == pytest.approx(activation_gib, rel=0.13)
    per_block = 16 * b["kv_bytes_per_token_per_gpu"]
    vllm_bytes = blocks * per_block
    # the KV memory itself is small here (3.8 / 2.9 GiB), so the activation estimate's 0.2-0.3 GiB is 7-9% of it;
    # tolerance 10% of the KV memory (0.4% of the device)
    assert b["available_bytes"] == pytest.approx(vllm_bytes, rel=0.10)


def test_non_torch_memory_is_a_setting_and_moves_the_capacity_by_its_bytes():
    common = ["+policy=vllm", "memory=paged", "hardware=a100_tp2", "memory.capacity_tokens=auto"]
    default = api.model_setup(api.compose(common), latency=False)[2]
    caps = {nt: api.model_setup(api.compose([*common, f"memory.non_torch_gib={nt}"]), latency=False)[2]
            for nt in (0.35, 1.79, 3.58)}
    assert caps[3.58] == default == 18672
    # every GiB is GIB / 163,840 B = 6,553.6 Llama2-70B tokens per GPU pair, block-rounded
    assert caps[0.35] - caps[3.58] == pytest.approx((3.58 - 0.35) * GIB / 163840, abs=16)
    assert caps[1.79] - caps[3.58] == pytest.approx(1.79 * GIB / 163840, abs=16)
    with pytest.raises(ConfigError, match=r"^memory.non_torch_gib=-1"):
        api.model_setup(api.compose([*common, "memory.non_torch_gib=-1"]), latency=False)
