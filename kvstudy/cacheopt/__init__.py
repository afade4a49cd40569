"""CacheOPT's components (Shen et al., Sec. 3; spec B2), as small functions the policy will call (issue 25)."""
