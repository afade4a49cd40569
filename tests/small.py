"""Small versions of the experiments (same code path, fewer and smaller runs): used by the notebook test
and the README-command test."""

SMALL = {  # experiment -> overrides that shrink it (same code path, fewer and smaller runs)
    "table1": ["seed=0,1", "workload.num_requests=150"],
    "table1_fixed_set": ["seed=0,1", "workload.num_requests=150"],
    "table1_batch_cap": ["+algo=a030,a020_b010", "engine.max_batch=64,128", "seed=0", "workload.num_requests=150"],
    "fig3": ["+algo=mcsf,mc_benchmark,a030,a010_b010", "workload.num_requests=100,200"],
    "fig5": ["seed=0", "workload.num_requests=150"],
    "fig5_reference": ["seed=0", "workload.num_requests=150"],
    "fig5_remedy": ["seed=0", "workload.num_requests=150"],
    "alpha_beta_sweep": ["policy.alpha=0.1,0.2", "policy.beta=0.1,0.2", "seed=0", "workload.num_requests=150"],
    "rr_sjf_policies": ["workload.num_requests=60", "memory.capacity_tokens=4000", "seed=0,1"],
    "rr_sjf_quantum": ["policy.steps_before_preemption=5,50", "workload.num_requests=60", "memory.capacity_tokens=4000"],
    "rr_sjf_noise": ["predictor.sigma=0,100", "seed=0,1", "workload.num_requests=60", "memory.capacity_tokens=4000"],
    "rr_sjf_rate": ["demand.rate=10,50", "seed=0,1", "workload.num_requests=60", "memory.capacity_tokens=4000"],
    "three_papers": ["seed=0", "+demand=high", "workload.num_requests=60"],
    "cacheopt_motivation": ["seed=0", "workload.num_requests=60"],
    "cacheopt_main": ["workload=sharegpt", "demand.scale=0.2,0.3", "seed=0,1", "workload.num_requests=60"],
    "cacheopt_ablation": ["workload=sharegpt", "demand.scale=0.3", "seed=0", "workload.num_requests=60"],
    "cacheopt_sensitivity": ["policy.confidence=0.8,0.9", "seed=0", "workload.num_requests=60"],
    "prefix_mooncake": ["+policy=vllm,lpm,mcsf_prefix", "workload.num_requests=150", "memory.capacity_tokens=131072",
                        "workload.rate_scale=0.05"],
    "prefix_sessions": ["+policy=vllm,mcsf_prefix", "workload.source=composed", "workload.num_sessions=30",
                        "memory.capacity_tokens=131072", "workload.session_rate=0.5"],
    "cluster_lmsys": ["+policy=mcsf,vllm", "router=round_robin,least_outstanding", "cluster.replicas=2",
                      "workload.num_requests=80"],
    "cluster_mooncake": ["+policy=vllm", "router=round_robin,prefix_affinity", "cluster.replicas=2",
                         "workload.num_requests=150", "memory.capacity_tokens=131072"],
    "disaggregation": ["+policy=vllm", "+deployment=colocated4,p1d3", "demand.rate=1.0", "workload.num_requests=60"],
    # on the linear latency model (no predictor per GPU); the Splitwise-HA deployment in the same sweep
    "disaggregation_hardware": ["+policy=vllm", "+deployment=colocated4,p1d3,ha_p1d3", "hardware=a100_tp2",
                                "workload=splitwise_conv,splitwise_code", "demand.rate=1.0",
                                "workload.num_requests=60", "latency=linear"],
    "disaggregation_link": ["demand.rate=1.0", "workload.num_requests=60"],
    # the hardware study on the linear latency model: the notebook's code path without training a predictor per GPU
    # (tests/studies/test_hardware.py runs the study's hardware under Vidur)
    "hardware": ["+policy=mcsf,vllm,rr_sjf", "seed=0", "workload.num_requests=40", "latency=linear"],
    "hardware_table1": ["seed=0", "workload.num_requests=40", "latency=linear"],
    "hardware_rr_sjf": ["workload.num_requests=40", "latency=linear"],
    "hardware_cacheopt": ["seed=0", "workload.num_requests=60", "latency=linear"],
    # the offload study on the prefix study's predictor (Llama-3.1-8B, a table to 131,072 tokens)
    "offload_mooncake": ["+policy=vllm,lpm", "memory.offload.host_gb=null,64", "memory.offload.load=blocking",
                         "workload.num_requests=150", "memory.capacity_tokens=131072"],
    "offload_mooncake_cluster": ["router=round_robin", "memory.offload.host_gb=64", "cluster.replicas=2",
                                 "workload.num_requests=150", "memory.capacity_tokens=131072"],
}
#: where an experiment's sweep goes under the results root, as its config puts it under outputs/
FOLDER = {**{name: f"{name}/a100_tp2" for name in ("table1", "table1_fixed_set", "fig3", "fig5", "fig5_reference",
                                                    "fig5_remedy", "alpha_beta_sweep")},
          "table1_batch_cap": "table1_batch_cap/authors",
          **{f"rr_sjf_{part}": f"rr_sjf/llama32_1b_l4_tp1/{part}" for part in ("policies", "quantum", "noise", "rate")},
          **{f"cacheopt_{part}": f"cacheopt/opt_13b_a100_tp1/{part}" for part in ("motivation", "main", "ablation",
                                                                                    "sensitivity")},
          "prefix_mooncake": "prefix/mooncake_llama31_8b_a100_tp1", "prefix_sessions": "prefix/sessions_llama31_8b_a100_tp1",
          "cluster_lmsys": "cluster/lmsys", "cluster_mooncake": "cluster/mooncake",
          "disaggregation": "disaggregation/splitwise_conv", "disaggregation_hardware": "disaggregation/hardware",
          "disaggregation_link": "disaggregation/link",
          "hardware": "hardware/three_papers", "hardware_table1": "hardware/table1", "hardware_rr_sjf": "hardware/rr_sjf",
          "hardware_cacheopt": "hardware/cacheopt", "offload_mooncake": "offload/mooncake",
          "offload_mooncake_cluster": "offload/mooncake_cluster"}
#: the MC-SF experiments notebook 01 also shows in the paper's likely regime (hardware=a100_vidur_default)
PAPER_REGIME = ("table1", "fig3")
#: the MC-SF experiments notebook 01 also shows in the authors' regime (regime=authors)
AUTHORS_REGIME = ("table1", "table1_fixed_set", "fig3", "fig5", "alpha_beta_sweep")
