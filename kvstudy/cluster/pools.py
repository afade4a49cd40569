"""Pools of replicas (issue 57): ``cluster.pools`` names groups of replicas, each with a role, its replicas' hardware
and, optionally, its own policy, router and memory settings. ``cluster.replicas: N`` is one mixed pool of N replicas
of the run's hardware (kvstudy/cluster/driver.py), and a pool written out that way gives the same run, bit for bit.

A pool in a config (``cluster.pools.<name>``)::

    cluster:
      pools:
        main: {role: mixed, replicas: 4, hardware: [h100_tp2, h100_tp2, a100_tp2, a100_tp2]}

* ``role``: ``mixed`` (a replica prefills and decodes its requests, as every replica today), ``prefill`` or
  ``decode`` (prefill/decode disaggregation: Splitwise, Patel et al. ISCA'24; DistServe, Zhong et al. OSDI'24);
* ``replicas``: how many (at least 1); may be left out when ``hardware`` is a list (one entry per replica);
* ``hardware``: an option of the ``hardware`` group (conf/hardware/) for every replica, or a list of them, one per
  replica (a *mixed-GPU pool*: the router sees each replica's own KV capacity, ``ReplicaView.num_blocks``); left out:
  the run's ``hardware``;
* ``policy``, ``router``: an option of the ``policy`` / ``router`` group for this pool; left out: the run's;
* ``memory``: settings over the run's ``memory`` group for this pool's replicas (``{capacity_tokens: auto}``).

Each replica's KV capacity, latency model and memory come from its own hardware (kvstudy/running/assemble.py
``pool_contexts``); the model, the requests and everything else are the run's.

What runs: one ``mixed`` pool (of any hardware), or one ``prefill`` and one ``decode`` pool (each of any hardware),
joined by the KV handoff (``cluster.handoff``: kvstudy/cluster/handoff.py, kvstudy/cluster/disaggregated.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
import re
from typing import Dict, List, Mapping, Optional, Tuple

from kvstudy.errors import ConfigError

ROLES = ("mixed", "prefill", "decode")
FIELDS = ("role", "replicas", "hardware", "policy", "router", "memory")
#: a pool's name: it is part of keys (cluster.pools.<name>.replicas) and of records
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: the most replicas a pool may have (cluster.replicas' bound, kvstudy/config/schema.py)
MAX_REPLICAS = 1024


@dataclass(frozen=True)
class Pool:
    """One pool as read from ``cluster.pools.<name>``: its replicas' hardware options, one per replica (None: the
    run's own), its policy and router options (None: the run's) and its memory settings over the run's."""

    name: str
    role: str
    hardware: Tuple[Optional[str], ...]
    policy: Optional[str] = None
    router: Optional[str] = None
    memory: Dict[str, object] = field(default_factory=dict)

    @property
    def replicas(self) -> int:
        return len(self.hardware)


def read_pools(cluster: Mapping, hardware_options: Optional[List[str]] = None,
               policy_options: Optional[List[str]] = None, router_options: Optional[List[str]] = None
               ) -> Optional[List[Pool]]:
    """``cluster.pools`` of a config's ``cluster`` node (a plain mapping, interpolations resolved) read and checked;
    None when it has none. A bad pool is one line naming the key, the value and what is allowed. ``*_options``: the
    options of the hardware, policy and router groups, to check the names against (None: not checked here; the
    config's check, kvstudy/config/validate.py, has no search path to look in, the run's assembly does)."""
    node = cluster.get("pools")
    if node is None:
        return None
    if not isinstance(node, Mapping) or not len(node):
        raise ConfigError(f"cluster.pools={_show(node)}: not a mapping of pools; allowed: a mapping name -> "
                          f"{{role, replicas, hardware, policy, router, memory}} with at least one pool")
    if cluster.get("replicas", 1) not in (1, None):
        raise ConfigError(f"cluster.replicas={cluster.get('replicas')} beside cluster.pools: give the replicas in "
                          f"the pools (cluster.pools.<name>.replicas), not both; allowed: cluster.replicas=1")
    pools = [_read_pool(str(name), spec, hardware_options, policy_options, router_options)
             for name, spec in node.items()]
    total = sum(p.replicas for p in pools)
    if total > MAX_REPLICAS:
        raise ConfigError(f"cluster.pools={{...}}: {total} replicas in all; allowed: at most {MAX_REPLICAS}")
    return pools


def _read_pool(name: str, spec, hardware_options, policy_options, router_options) -> Pool:
    key = f"cluster.pools.{name}"
    if not NAME.fullmatch(name):
        raise ConfigError(f"{key}: pool name {name!r} not allowed; allowed: letters, digits and _, not starting with a "
                          f"digit (the name is part of every message and record key)")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{key}={_show(spec)}: not a pool; allowed: a mapping with keys {', '.join(FIELDS)}")
    unknown = [k for k in spec if k not in FIELDS]
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}={_show(spec[unknown[0]])}: not a pool setting; allowed: "
                          f"{', '.join(FIELDS)}")
    role = spec.get("role", "mixed")
    if role not in ROLES:
        raise ConfigError(f"{key}.role={_show(role)}: allowed: {', '.join(ROLES)}")
    hardware = spec.get("hardware")
    count = spec.get("replicas")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_REPLICAS):
        raise ConfigError(f"{key}.replicas={_show(count)}: allowed: a whole number of replicas, 1 to {MAX_REPLICAS} "
                          f"(a pool with no replicas serves nothing: leave the pool out)")
    if isinstance(hardware, (list, tuple)):
        names = list(hardware)
        if not names:
            raise ConfigError(f"{key}.hardware=[]: allowed: a hardware option, or a list with one per replica")
        if count is not None and count != len(names):
            raise ConfigError(f"{key}.hardware lists {len(names)} replica(s) but {key}.replicas={count}; allowed: "
                              f"one hardware option per replica, or one option for all")
    else:
        if count is None:
            raise ConfigError(f"{key}.replicas=null: missing; allowed: a whole number of replicas (or a hardware list, "
                              f"one option per replica)")
        names = [hardware] * count
    for k, hw in enumerate(names):
        if isinstance(hardware, (list, tuple)) and not isinstance(hw, str):
            raise ConfigError(f"{key}.hardware[{k}]={_show(hw)}: allowed: a hardware option's name (a list names one "
                              f"per replica; leave hardware out for the run's own)")
        if hw is not None and not isinstance(hw, str):
            raise ConfigError(f"{key}.hardware={_show(hardware)}: allowed: a hardware option's name, or a list of "
                              f"them, one per replica")
        if hw is not None and hardware_options is not None and hw not in hardware_options:
            at = f"{key}.hardware[{k}]" if isinstance(hardware, (list, tuple)) else f"{key}.hardware"
            raise ConfigError(f"{at}={_show(hw)}: unknown hardware; allowed: {', '.join(hardware_options)}")
    policy, router = spec.get("policy"), spec.get("router")
    if policy is not None and not isinstance(policy, str):
        raise ConfigError(f"{key}.policy={_show(policy)}: allowed: the name of a policy option (conf/policy/)")
    if router is not None and not isinstance(router, str):
        raise ConfigError(f"{key}.router={_show(router)}: allowed: the name of a router option (conf/router/)")
    if policy is not None and policy_options is not None and policy not in policy_options:
        raise ConfigError(f"{key}.policy={_show(policy)}: unknown policy; allowed: {', '.join(policy_options)}")
    if router is not None and router_options is not None and router not in router_options:
        raise ConfigError(f"{key}.router={_show(router)}: unknown router; allowed: {', '.join(router_options)}")
    memory = spec.get("memory")
    memory = {} if memory is None else memory
    if not isinstance(memory, Mapping):
        raise ConfigError(f"{key}.memory={_show(memory)}: allowed: a mapping of memory settings "
                          f"({{capacity_tokens: auto}})")
    return Pool(name, role, tuple(names), policy, router, dict(memory))


def runnable(pools: List[Pool], handoff=None) -> bool:
    """What runs (module docstring): one mixed pool, or one ``prefill`` and one ``decode`` pool (returns True: a
    disaggregated cluster, kvstudy/cluster/disaggregated.py). Anything else is one line saying what is allowed;
    ``handoff`` (``cluster.handoff``) is read by a disaggregated cluster only."""
    roles = sorted(p.role for p in pools)
    if roles == ["decode", "prefill"]:
        return True
    if roles == ["mixed"]:
        if handoff is not None:
            raise ConfigError("cluster.handoff is read by a prefill pool and a decode pool (disaggregation); allowed: "
                              "cluster.handoff=null with a mixed pool")
        return False
    named = ", ".join(f"{p.name} ({p.role})" for p in pools)
    if "mixed" in roles:
        raise ConfigError(f"cluster.pools: {named}: a mixed pool beside others is not built (a router over pools); "
                          f"allowed: one mixed pool, or one prefill pool and one decode pool")
    missing = "decode" if "decode" not in roles else "prefill"
    if roles.count("prefill") > 1 or roles.count("decode") > 1:
        raise ConfigError(f"cluster.pools: {named}: allowed: one pool of each role (one prefill pool and one decode "
                          f"pool; give a pool more replicas, or a hardware list for a mixed-GPU pool)")
    raise ConfigError(f"cluster.pools: {named}: a {roles[0]} pool needs a {missing} pool (a request prefilled on one "
                      f"decodes on the other); allowed: one prefill pool and one decode pool, or one mixed pool")


def _show(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)
