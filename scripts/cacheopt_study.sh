#!/usr/bin/env bash
# Every run of the CacheOPT study (issue 25; docs/cacheopt.md), then notebook 04. ~21 minutes on 2 cores.
# Finished runs are skipped when this is run again (a killed study resumes where it stopped).
set -euo pipefail
OPT175="model=opt_175b hardware=a100_tp8"
python -m kvstudy +experiment=cacheopt_motivation
# main comparison (Figs. 12-13): rates around each trace's knee in this simulator
python -m kvstudy +experiment=cacheopt_main workload=alpaca demand.scale=1,2,2.5,3
python -m kvstudy +experiment=cacheopt_main workload=sharegpt demand.scale=0.15,0.2,0.25,0.3
python -m kvstudy +experiment=cacheopt_main workload=bookcorpus demand.scale=0.6,0.75,0.9,1.0
python -m kvstudy +experiment=cacheopt_main $OPT175 workload=alpaca demand.scale=0.5,1,1.5,2
python -m kvstudy +experiment=cacheopt_main $OPT175 workload=sharegpt demand.scale=0.05,0.1,0.125,0.15
python -m kvstudy +experiment=cacheopt_main $OPT175 workload=bookcorpus demand.scale=0.2,0.3,0.4,0.5
# ablations (Figs. 14-15): one loaded rate per trace
python -m kvstudy +experiment=cacheopt_ablation workload=alpaca demand.scale=2.5
python -m kvstudy +experiment=cacheopt_ablation workload=sharegpt demand.scale=0.25
python -m kvstudy +experiment=cacheopt_ablation workload=bookcorpus demand.scale=0.9
python -m kvstudy +experiment=cacheopt_ablation $OPT175 workload=alpaca demand.scale=1.5
python -m kvstudy +experiment=cacheopt_ablation $OPT175 workload=sharegpt demand.scale=0.125
python -m kvstudy +experiment=cacheopt_ablation $OPT175 workload=bookcorpus demand.scale=0.4
# sensitivity (Fig. 17), ShareGPT / OPT-13B at 0.25 x its Table 1 rate
python -m kvstudy +experiment=cacheopt_sensitivity policy.slo.scale=0.5,1.0,1.5,2.0,2.5
python -m kvstudy +experiment=cacheopt_sensitivity memory.block_size=4,8,16,32
python -m kvstudy +experiment=cacheopt_sensitivity policy.m=0,1,2,4,8
python -m kvstudy +experiment=cacheopt_sensitivity policy.reserve_blocks=0,2,4,8,16
python -m kvstudy +experiment=cacheopt_sensitivity policy.adaptive=true policy.alpha=0.5,0.6,0.7,0.8,0.9,1.0
python -m kvstudy +experiment=cacheopt_sensitivity policy.adaptive=true policy.beta=0.001,0.01,0.1,1.0
python -m kvstudy +experiment=cacheopt_sensitivity policy.confidence=0.5,0.8,0.9,0.95,0.99
