"""CacheOPT's parts (Shen et al.; spec B2): padding lives in kvstudy/cacheopt/padding.py; here are embedding, allocation and
preemption as small functions (the policy in kvstudy/cacheopt/policy.py calls them), what a run prepares before its
first iteration (setup.py: SLOs, direction classifier, error ranges, swap/recompute costs) and the study's tables
(study.py)."""
