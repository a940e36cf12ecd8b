#!/usr/bin/env bash
# The GPU check of an air-gapped GPU machine in one command, no network (docs/gpu.md): installs the
# folder `make wheelhouse` made into a private target beside the machine's own packages (its CUDA
# torch is never replaced), checks the imports, then runs the GPU tests, P6, a PPO update's
# throughput and `make run`'s training on the GPU, each step timed and recorded, within 10 minutes.
#
#   scripts/offline_gpu_check.sh OUT_DIR [--dry-run] [--budget-s 600]
#
# OUT_DIR receives results.json and log.txt. --dry-run runs every step on the CPU with tiny sizes.
# PYTHON (default: python3) is the machine's Python; WHEELHOUSE (default: ./wheelhouse) the folder;
# VERLOG_SITE (default: ./.offline-site) the private target, made anew each time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: scripts/offline_gpu_check.sh OUT_DIR [--dry-run] [--budget-s 600]" >&2
    exit 2
fi
exec "${PYTHON:-python3}" "$root/scripts/offline_gpu_check.py" "$@" \
    --wheelhouse "${WHEELHOUSE:-$root/wheelhouse}" --site "${VERLOG_SITE:-$root/.offline-site}"
