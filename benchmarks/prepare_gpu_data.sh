#!/usr/bin/env bash
# On the CPU machine, before a GPU loan: put what benchmarks/gpu_check.sh reads into
# data/gpu_check/ (ignored by git), to be carried to the GPU machine with the working tree
# (carry: ["data/gpu_check"]; docs/gpu_check.md).
#
#   bash benchmarks/prepare_gpu_data.sh              # the CIFAR-10 training images
#   bash benchmarks/prepare_gpu_data.sh --airbench   # and airbench's wheel (from PyPI)
#
# cifar10-train.tar.gz: the 50,000 training JPEGs (16 MB) from ../shared/data/cifar10-train/
# (or CIFAR_ARCHIVE=PATH), carried packed and unpacked on the GPU machine: unpacked they are
# 47 MB in 50,000 files, most of the 64 MiB a carry may hold. The steps cifar_recipe, airbench
# and lightning read it. airbench-*.whl: the public record's code (a pure-Python wheel, built
# here from its source package with `pip wheel --no-deps`), imported from the wheel there.
set -euo pipefail
cd "$(dirname "$0")/.."

source_archive=${CIFAR_ARCHIVE:-../shared/data/cifar10-train/train.tar.gz}
if [[ ${1:-} != "" && ${1:-} != --airbench ]]; then
    echo "usage: bash benchmarks/prepare_gpu_data.sh [--airbench]" >&2
    exit 2
fi
if [[ ! -f $source_archive ]]; then
    echo "error: no $source_archive (set CIFAR_ARCHIVE=PATH to the CIFAR-10 training JPEGs)" >&2
    exit 2
fi
mkdir -p data/gpu_check
install -m 644 "$source_archive" data/gpu_check/cifar10-train.tar.gz
if [[ ${1:-} == --airbench ]]; then
    "${PYTHON:-python3}" -m pip wheel --quiet --no-deps airbench==0.1.8 -w data/gpu_check
fi
ls -l data/gpu_check
echo "carry: [\"data/gpu_check\"] ($(du -sh data/gpu_check | cut -f1))"
