"""kvstudy: LLM-inference scheduling studies on Vidur's latency model (README.md)."""
from omegaconf import OmegaConf

from kvstudy.running.paths import SHARED_REFERENCE

# ${shared:PATH} in a config: PATH inside the shared reference data (../shared/reference beside the checkout, or
# $KVSTUDY_SHARED), which is never copied into the repository (conf/workload/mooncake.yaml)
OmegaConf.register_new_resolver("shared", lambda path: str(SHARED_REFERENCE / str(path)), replace=True)


def _mul(*values):
    """``${mul:a,b,...}``: the product (a whole number when every factor is one), e.g. a load per replica times
    ``cluster.replicas`` (conf/experiment/cluster_lmsys.yaml)."""
    out = 1
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"${{mul:...}} multiplies numbers, got {v!r}")
        out *= v
    return out


OmegaConf.register_new_resolver("mul", _mul, replace=True)
