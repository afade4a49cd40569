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


def _device(name, field):
    """``${device:NAME,FIELD}``: a number of device NAME in kvstudy/profiles/devices.py, the one place GPU numbers
    are written (conf/hardware/*.yaml: ``pcie_gbps: ${device:${hardware.device},pcie_gbps}``)."""
    from kvstudy.profiles.devices import DEVICES  # on use: the registry is not needed to import kvstudy

    device = DEVICES.get(str(name))
    if device is None:  # an unknown device: None here, and the config check names hardware.device (validate.py)
        return None
    if not hasattr(device, str(field)):
        raise ValueError(f"${{device:{name},{field}}}: no such field; allowed: a field of kvstudy/profiles/devices.py's "
                         f"Device")
    return getattr(device, str(field))


OmegaConf.register_new_resolver("device", _device, replace=True)
