#!/usr/bin/env bash
# Every run of the CacheOPT study (issues 25 and 33; docs/cacheopt.md), then notebook 04 to HTML
# (outputs/reproduce/cacheopt/). About an hour on 2 cores (docs/benchmarks.md). Finished runs are skipped when this
# is run again (a killed study resumes where it stopped). The commands are listed in one place, kvstudy/reproduce.py
# (print them with --dry-run); arguments are passed on, e.g. --jobs 1, --figures-only, --gallery, -- <overrides>.
set -euo pipefail
exec python -m kvstudy.reproduce cacheopt "$@"
