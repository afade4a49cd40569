#!/usr/bin/env bash
# The sweeps whose results a refactoring must leave bit-identical (issues 45 and 56: 1,501 + 248 + 42 runs; issue 57's
# disaggregation studies), run from
# checkout SRC into OUT; then `python bench/compare_runs.py BEFORE_OUT AFTER_OUT`. prefix_mooncake needs the shared data: a worktree
# outside the project folder finds it through KVSTUDY_SHARED=/path/to/shared/reference.
#   git worktree add /tmp/base <commit>
#   bash bench/compare_set.sh /tmp/base /tmp/cmp/before 1 && bash bench/compare_set.sh . /tmp/cmp/after 1
# NJOBS (third argument): each sweep's workers. KVSTUDY_CACHE_DIR is shared so both trees load the same predictors.
set -u
SRC=$(cd "$1" && pwd); OUT=$2; NJ=${3:-1}
export KVSTUDY_CACHE_DIR=${KVSTUDY_CACHE_DIR:-/tmp/cmp/cache} HF_HUB_OFFLINE=1
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$SRC"
r(){ name=$1; shift; python -m kvstudy -m "$@" hydra.launcher.n_jobs=$NJ hydra.sweep.dir="$OUT/$name" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(date +%T)"; }
r table1 +experiment=table1
r table1_authors +experiment=table1 regime=authors
r table1_unit +experiment=table1 latency=unit
r fig5 +experiment=fig5
r rr_sjf_policies +experiment=rr_sjf_policies
r three_papers +experiment=three_papers
r cacheopt_ablation +experiment=cacheopt_ablation workload=sharegpt demand.scale=0.25 workload.num_requests=2000
r cluster_lmsys +experiment=cluster_lmsys
r prefix_mooncake +experiment=prefix_mooncake workload.num_requests=2000 memory.capacity_tokens=131072,auto
# the hardware study (issue 48: 248 runs) and the offload study (issue 49: 42 runs), as kvstudy.reproduce runs them
r hardware_rr_sjf +experiment=hardware_rr_sjf
r hardware_table1 +experiment=hardware_table1
r hardware +experiment=hardware
r hardware_cacheopt +experiment=hardware_cacheopt
r offload_mooncake +experiment=offload_mooncake
r offload_mooncake_cluster +experiment=offload_mooncake_cluster
# the disaggregation studies (issue 57), as kvstudy.reproduce runs them
r disaggregation +experiment=disaggregation
r disaggregation_hardware +experiment=disaggregation_hardware
r disaggregation_ha +experiment=disaggregation_hardware +deployment=ha_p1d3,ha_p2d2,ha_p3d1 hardware=a100_tp2
r disaggregation_link +experiment=disaggregation_link
