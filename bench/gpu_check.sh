#!/usr/bin/env bash
# The GPU check, in stages that each fit one call on a lent GPU machine (<= 5 minutes); see
# bench/gpu_check.py for the stages, where the log and the table go ($OUT), and --dry-run (CPU).
#
#   bash bench/gpu_check.sh --stage install --wheel 'dist/fastbert-*.whl'
#   bash bench/gpu_check.sh --stage kernels      # then: ops, bench
#   bash bench/gpu_check.sh --dry-run            # on CPU: the plumbing, nothing needs a GPU
set -u -o pipefail
exec "${PYTHON:-python}" "$(dirname "$0")/gpu_check.py" "$@"
