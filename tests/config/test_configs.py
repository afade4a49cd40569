"""Every config of every group composes (Hydra Compose API) and builds its object."""
import pytest

from kvstudy import api
from kvstudy.costs.arch import ModelArch
from kvstudy.running.paths import CONF_DIR

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")  # launchers: test_sweeps
APPENDED = {"policy", "demand", "algo", "experiment", "deployment"}  # not in the defaults list: chosen with +group=option


def test_groups_present():
    assert {"model", "hardware", "latency", "policy", "demand", "workload", "predictor"} <= set(GROUPS)


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in api.options(g)])
def test_every_option_composes(group, option):
    prefix = "+" if group in APPENDED else ""
    chooses_policy = group in ("policy", "algo") or (group == "experiment" and option not in ("table1", "fig3", "fig5_reference"))
    cfg = api.compose([f"{prefix}{group}={option}"] + ([] if chooses_policy or group == "experiment" else ["+policy=mcsf"]))
    if group in ("policy", "demand", "model", "hardware", "latency", "workload", "predictor"):
        assert cfg[group].name == option
    if group == "model":
        ModelArch.from_mapping(api._plain(cfg.model))
    if group == "hardware":
        api.hardware_spec(cfg)
    if group == "policy":
        assert api.build_policy(cfg).name == option
    if group == "algo":
        assert api.build_policy(cfg).name in ("mcsf", "mc_benchmark", "alpha_greedy", "alpha_beta")
    if group == "experiment":
        from omegaconf import OmegaConf

        raw = OmegaConf.load(CONF_DIR / "experiment" / f"{option}.yaml")
        plain = OmegaConf.to_container(raw, resolve=False)  # a sweep dir may interpolate the model's name
        assert plain["hydra"]["mode"] == "MULTIRUN" and plain["hydra"]["sweeper"]["params"] and \
            plain["hydra"]["sweep"]["dir"]
        assert cfg.engine.progress is False
    from kvstudy.config.validate import check_config

    check_config(cfg)  # every shipped option passes the value checks (an experiment's capacity: auto, say)


@pytest.mark.parametrize("latency", ["unit", "linear"])
def test_default_run_composes_and_simulates(latency, tmp_path):
    cfg = api.compose(["+policy=mcsf", "+demand=high", f"latency={latency}", "workload.num_requests=30",
                       "engine.progress=false"])
    summary = api.run(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["completed"] == 30
    run = api.load_run(tmp_path)
    assert len(run.requests) == 30 and run.config.policy.name == "mcsf"


def test_paper_regime_hardware_is_a_timing_model():
    """a100_vidur_default (issue 26): Vidur's default replica, one A100 on the pairwise-NVLink node. It times a
    model it cannot hold, so `auto` capacity refuses it by name while the paper's fixed M runs."""
    from kvstudy.errors import ConfigError

    cfg = api.compose(["+policy=mcsf", "+demand=high", "hardware=a100_vidur_default"])
    hw = api.hardware_spec(cfg)
    assert (hw.tensor_parallel, hw.pipeline_parallel, hw.node) == (1, 1, "a100_pairwise_nvlink")
    assert cfg.memory.capacity_tokens == 16492
    with pytest.raises(ConfigError, match="does not fit on hardware 'a100_vidur_default'"):
        api.model_setup(api.compose(["+policy=mcsf", "hardware=a100_vidur_default", "memory.capacity_tokens=auto"]),
                        latency=False)


@pytest.mark.parametrize("experiment", ["table1", "table1_fixed_set", "fig3", "fig5", "fig5_remedy", "fig5_reference",
                                        "alpha_beta_sweep"])
def test_mcsf_experiments_keep_each_regime_in_its_own_folder(experiment):
    """Each MC-SF experiment's folder names the regime (the hardware, or `authors` under regime=authors) and its run
    folders do not, so `hardware=a100_tp2` given explicitly finds the default's finished runs (no duplicates in one
    folder) and the authors' regime never mixes with a hardware's."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml"), resolve=False)
    assert plain["hydra"]["sweep"]["dir"] == f"outputs/{experiment}/${{regime.folder}}"
    assert {"hardware", "regime"} <= set(plain["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"])
    assert api.compose([f"+experiment={experiment}"]).regime.folder == "a100_tp2"
    assert api.compose([f"+experiment={experiment}", "hardware=a100_vidur_default"]).regime.folder == "a100_vidur_default"
    assert api.compose([f"+experiment={experiment}", "regime=authors"]).regime.folder == "authors"
