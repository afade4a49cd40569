"""Building blocks for tests of the preemptive engine (memory=paged)."""
from kvstudy.latency.models import LinearLatency
from kvstudy.latency.tables import HardwareSpec
from kvstudy.memory import PagedMemory
from kvstudy.running.paths import load_model_arch
from kvstudy.policies.step import StepPolicy
from kvstudy.engine.assembly import build_engine
from kvstudy.costs.swap_models import PcieSwap

ARCH = load_model_arch("llama2_70b")
HW = HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2)
ONE_SECOND = LinearLatency(d0=1.0, d1=0.0)  # every iteration takes 1 s: times count iterations


def prepare(policy, req, ttft=5.0, tbt=1.5, ranges=None, cost=None):
    """What kvstudy.api gives a policy that asks for per-request SLOs (CacheOPT): fixed SLOs in iterations here."""
    if callable(getattr(policy, "prepare", None)) and getattr(policy, "slo_tft", None) is None:
        n = len(req)
        policy.prepare([ttft] * n, [tbt] * n, ranges or {}, cost)


def step_engine(req, policy, capacity=16, block_size=4, watermark=0.0, swap_space_gb=4.0, latency=ONE_SECOND,
                swap=None, stall_limit=100, seed=0, direction=None, decode_block_check="boundary", predicted=None,
                prefix_caching=False):
    """A step engine over ``req``; the policy sees ``predicted`` output lengths (default: the true ones)."""
    prepare(policy, req)
    policy.reset(seed)
    memory = PagedMemory(capacity, block_size=block_size, watermark=watermark, swap_space_gb=swap_space_gb,
                         decode_block_check=decode_block_check, prefix_caching=prefix_caching)
    return build_engine(req, req.output_tokens if predicted is None else predicted, policy, latency, memory,
                        swap or PcieSwap(), ARCH, HW, stall_limit=stall_limit, direction=direction)


class Recorder(StepPolicy):
    """Wraps a policy and checks, at every step, what the engine shows it: blocks held cover each running
    request's context, and a preempted request comes back with exactly the tokens it had generated."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.at_preemption = {}
        self.indexed_waiting = getattr(inner, "indexed_waiting", False)  # the engine keeps the queue the policy reads
        if callable(getattr(inner, "prepare", None)):  # CacheOPT's SLOs pass through
            self.prepare = inner.prepare
        if callable(getattr(inner, "overflow_victims", None)):  # an adapted admission policy: the engine detects it
            self.overflow_victims = self._overflow

    def _overflow(self, view):
        victims = self.inner.overflow_victims(view)
        for i in victims:
            self.at_preemption[i] = view.generated[i]
        return victims

    def reset(self, seed):
        self.inner.reset(seed)
        self.at_preemption = {}

    def step(self, view):
        mem = view.memory
        for i in view.running:
            ctx = view.prefilled[i] if view.in_prefill(i) else view.prompt[i] + view.generated[i] - 1
            assert mem.held(i) >= mem.blocks(ctx)
        assert mem.used <= mem.num_blocks and mem.host_used <= mem.host_blocks_total
        past = [i for i in view.running if not view.in_prefill(i)]  # the engine's running sums, kept incrementally
        assert view._state.decode_prompt_tokens == sum(view.prompt[i] for i in past)
        assert view._state.decode_context_tokens == sum(view.prompt[i] + view.generated[i] - 1 for i in past)
        d = self.inner.step(view)
        for i in d.swap_in + [i for i, _ in d.prefill if i in self.at_preemption]:
            assert view.generated[i] == self.at_preemption.pop(i)
        for i, _ in d.preempt:
            self.at_preemption[i] = view.generated[i]
        return d
