"""kvstudy: LLM-inference scheduling studies on Vidur's latency model (README.md)."""
from omegaconf import OmegaConf

from kvstudy.paths import SHARED_REFERENCE

# ${shared:PATH} in a config: PATH inside the shared reference data (../shared/reference beside the checkout, or
# $KVSTUDY_SHARED), which is never copied into the repository (conf/workload/mooncake.yaml)
OmegaConf.register_new_resolver("shared", lambda path: str(SHARED_REFERENCE / str(path)), replace=True)
