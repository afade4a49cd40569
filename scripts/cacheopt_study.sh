#!/usr/bin/env bash
# Every run of the CacheOPT study (issues 25 and 33; docs/cacheopt.md), then notebook 04. About an hour on 2 cores
# (docs/benchmarks.md). Finished runs are skipped when this is run again (a killed study resumes where it stopped).
set -euo pipefail
OPT175="model=opt_175b hardware=a100_tp8"
# main comparison (Figs. 12-13): 10,000 requests, rates dense across each trace's knee in this simulator
python -m kvstudy +experiment=cacheopt_main workload=sharegpt demand.scale=0.18,0.2,0.21,0.22,0.23,0.24,0.25
python -m kvstudy +experiment=cacheopt_main workload=alpaca demand.scale=1.5,2,2.25,2.5,2.75,3
python -m kvstudy +experiment=cacheopt_main workload=bookcorpus demand.scale=0.75,0.8,0.85,0.9,0.95,1.0
# ablations (Figs. 14-15) and sensitivity (Fig. 17): 2,000 requests, one loaded rate per trace
python -m kvstudy +experiment=cacheopt_ablation workload=sharegpt demand.scale=0.22
python -m kvstudy +experiment=cacheopt_ablation workload=alpaca demand.scale=2.5
python -m kvstudy +experiment=cacheopt_ablation workload=bookcorpus demand.scale=0.9
python -m kvstudy +experiment=cacheopt_sensitivity policy.slo.scale=0.5,1.0,1.5,2.0,2.5
python -m kvstudy +experiment=cacheopt_sensitivity memory.block_size=4,8,16,32
python -m kvstudy +experiment=cacheopt_sensitivity policy.m=0,1,2,4,8
python -m kvstudy +experiment=cacheopt_sensitivity policy.reserve_blocks=0,2,4,8,16
python -m kvstudy +experiment=cacheopt_sensitivity policy.adaptive=true policy.alpha=0.5,0.6,0.7,0.8,0.9,1.0
python -m kvstudy +experiment=cacheopt_sensitivity policy.adaptive=true policy.beta=0.001,0.01,0.1,1.0
python -m kvstudy +experiment=cacheopt_sensitivity policy.confidence=0.5,0.8,0.9,0.95,0.99
# OPT-175B on eight A100s (TP8, spec B8.8)
python -m kvstudy +experiment=cacheopt_main $OPT175 workload=sharegpt demand.scale=0.09,0.1,0.11,0.115,0.12,0.125
python -m kvstudy +experiment=cacheopt_main $OPT175 workload=alpaca demand.scale=0.5,0.6,0.7,0.8,0.9,1.0
python -m kvstudy +experiment=cacheopt_main $OPT175 workload=bookcorpus demand.scale=0.45,0.5,0.55,0.6,0.65,0.7
python -m kvstudy +experiment=cacheopt_ablation $OPT175 workload=sharegpt demand.scale=0.115
python -m kvstudy +experiment=cacheopt_ablation $OPT175 workload=alpaca demand.scale=1.0
python -m kvstudy +experiment=cacheopt_ablation $OPT175 workload=bookcorpus demand.scale=0.5
# the motivation study (Sec. 2, Figs. 1-8)
python -m kvstudy +experiment=cacheopt_motivation
jupyter nbconvert --to notebook --execute --inplace notebooks/04_cacheopt.ipynb
