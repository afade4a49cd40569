"""A policy's preparation hook (kvstudy/running/run_context.py): the API calls ``before_run`` / ``after_run`` for any policy
that has them, knows no policy by name, and checks what the hook returns."""
import pytest

from kvstudy import api
from kvstudy.engine.states import PolicyError
from kvstudy.policies.mcsf import MCSF

SMALL = ["+demand=high", "workload.num_requests=30", "latency=linear", "engine.progress=false"]


class Hooked(MCSF):
    """MC-SF that records what its run prepared."""

    seen = {}

    def before_run(self, ctx):
        Hooked.seen = {"n": len(ctx.requests), "capacity": ctx.capacity, "seed": ctx.seed,
                       "model": ctx.arch.name, "simulate": ctx.simulate is api.simulate}
        return None

    def after_run(self, result, ctx):
        result.requests["hooked"] = result.requests["prompt_tokens"] * 0 + ctx.seed
        result.extra["hooked"] = True


class BadHook(MCSF):
    def before_run(self, ctx):
        return {"no_such_input": 1}


def test_hooks_are_called_for_any_policy():
    cfg = api.compose(["+policy=mcsf", "policy._target_=tests.running.test_run_context.Hooked", "seed=3"] + SMALL)
    result, _ = api.simulate(cfg)
    assert Hooked.seen == {"n": 30, "capacity": 16492, "seed": 3, "model": "llama2_70b", "simulate": True}
    assert (result.requests["hooked"] == 3).all() and result.extra["hooked"]


def test_a_hook_returning_an_unknown_engine_input_is_named():
    cfg = api.compose(["+policy=mcsf", "policy._target_=tests.running.test_run_context.BadHook"] + SMALL)
    with pytest.raises(PolicyError, match="before_run returns None or a dict with keys among"):
        api.simulate(cfg)


def test_the_api_names_no_policy():
    """The circle api -> cacheopt set-up -> api is gone: the API (api.py and the modules it re-exports from,
    kvstudy/running/) imports no policy module, the set-up no api."""
    import inspect

    from kvstudy.cacheopt import setup
    from kvstudy.running import assemble, compose, execute, no_effect, results, targets

    for module in (api, compose, targets, assemble, no_effect, execute, results):
        source = inspect.getsource(module)
        assert "kvstudy.cacheopt" not in source and "kvstudy.policies" not in source, module.__name__
        assert module is api or ("kvstudy import api" not in source and "kvstudy.api" not in source), module.__name__
    assert "kvstudy import api" not in inspect.getsource(setup)
