#!/usr/bin/env bash
# The GPU check, in one shot on a borrowed machine with one CUDA GPU (docs/gpu_check.md): the
# steps below in order of value, each under its own time limit, all within DEADLINE seconds (a
# step whose limit no longer fits is recorded as skipped, never started). Each step ends with a
# figure and passes only when the figure meets the threshold written beside it.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine (exit 0: every step that ran passed)
#   bash benchmarks/gpu_check.sh --plan     # anywhere: the steps, limits, thresholds and total
#                                           # (GPU_CHECK_DRY_RUN=1 does the same)
#   GPU_CHECK_STEPS=fsdp,knobs bash benchmarks/gpu_check.sh   # those steps alone (a second try)
#
# Results, kept as they come (the machine returns only what is under $OUT):
#   $OUT/gpu_check.log       everything printed, each step's whole output included
#   $OUT/summary.tsv         step, status, seconds, figure, threshold: a row as each step ends
#   $OUT/failed_steps.tar.gz the small files of the failed steps' folders
# Without OUT, they go to saved/gpu_check/<time>/. Data comes only from the working tree:
# data/gpu_check/ (bash benchmarks/prepare_gpu_data.sh on the CPU machine, then carry it).
# GPU_PYTHON=/path/to/python picks the interpreter; by default the first of python3,
# /usr/bin/python3, /usr/local/bin/python3 and python that sees CUDA, never one inside this
# repository (a virtualenv carried with the working tree is the CPU machine's). Nothing is
# installed. No `set -e`: a failing command is its step's result, and the summary is written.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

DEADLINE=420   # seconds, everything included: the borrowed machine's window, with room to rerun
PREFLIGHT=15   # choosing the interpreter (importing torch, starting CUDA) and nvidia-smi
WRAP_UP=5      # the summary and the failures' archive
GRACE=5        # a step past its limit gets SIGTERM, then SIGKILL this much later (in its limit)
data_dir=data/gpu_check
archive=$data_dir/cifar10-train.tar.gz

# The thresholds (docs/gpu_check.md says what each step proves).
knobs_tolerance=0.02     # |val/accuracy - fp32's| for every knob
knobs_min_accuracy=0.95  # fp32's val/accuracy after 3 epochs of the demo (0.985 on a CPU)
pipeline_min_ratio=2     # samples/s of pipeline "device" / the DataLoader's (17.6 on a CPU)
decode_min_ratio=1       # samples/s of decode "device" (nvJPEG) / PIL in the workers
decode_max_mean=3        # mean |nvJPEG - PIL| in levels (nvJPEG upsamples colour differently)
augment_max_syncs=1      # host-device syncs per batch of decode "device" with auto_augment
recipe_min_accuracy=0.89 # config.json's val/accuracy (91.08 to 91.46 % on a CPU)
airbench_max_ratio=3     # seconds per training FLOP of the recipe / of airbench94, same images
lightning_max_ratio=1.1  # whole-process seconds of train.py / of Lightning, one round

# name, limit in seconds, what passes. Sized for an H200: a process spends 5-10 s importing
# torch and starting CUDA, torch.compile 20-40 s.
steps=(
    "gpu_tests|41|no gpu-marked test fails; only the two-GPU test may skip"
    "resume|23|2 runs stopped mid-epoch and resumed end bit-exact (weights, optimizer, loss)"
    "fsdp|60|FSDP trains with SGD (and resumes) and with AdamW: exit 0, finite loss"
    "compile|45|0 recompilations after epoch 1 of 3 (validation's in epoch 1 seen)"
    "tf32_compile|35|compile with tf32: 0 recompilations after epoch 1, old TF32 flags read True"
    "knobs|34|fp32 >= $knobs_min_accuracy, each knob within $knobs_tolerance of fp32"
    "device_pipeline|28|pipeline device >= ${pipeline_min_ratio}x the DataLoader's samples/s, decode device >= ${decode_min_ratio}x PIL's"
    "device_decode|12|nvJPEG within $decode_max_mean levels of PIL on average (grayscale, CMYK, EXIF); a truncated JPEG a one-line DataError; the memory full: OutOfMemoryError, not PIL, and device_split's one line"
    "device_augment|15|alternating flip, decode device: each image mirrored once in 2 passes; auto_augment <= $augment_max_syncs sync per batch in one of 12 passes"
    "cifar_recipe|43|config.json val/accuracy >= $recipe_min_accuracy"
    "airbench|24|recipe seconds per training FLOP <= ${airbench_max_ratio}x airbench94's on the same images"
    "lightning|40|train.py / Lightning whole-process time <= $lightning_max_ratio"
)

# cmd_<name> DIR: sets `step_command` (an array), or `skip` to the reason the step cannot run here.
cmd_gpu_tests() {
    local files
    mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py | grep -v test_gpu_resume.py)
    step_command=("$python" benchmarks/gpu/gpu_tests.py -m gpu --allow-skip "needs two CUDA devices"
        "${files[@]}")
}
cmd_resume() { step_command=("$python" benchmarks/gpu/gpu_tests.py -m gpu tests/test_gpu_resume.py); }
cmd_fsdp() { step_command=("$python" benchmarks/gpu/gpu_training.py fsdp --work "$1"); }
cmd_compile() { step_command=("$python" benchmarks/gpu/gpu_training.py compile --work "$1"); }
cmd_tf32_compile() {
    step_command=("$python" benchmarks/gpu/gpu_training.py compile --tf32 --epochs 2 --work "$1")
}
cmd_knobs() {
    step_command=("$python" benchmarks/gpu/gpu_training.py knobs --work "$1"
        --tolerance "$knobs_tolerance" --min-accuracy "$knobs_min_accuracy")
}
cmd_device_pipeline() {
    step_command=("$python" benchmarks/input_pipeline.py --device cuda --num-workers 8
        --jpeg-images 512 --min-ratio "$pipeline_min_ratio" --min-decode-ratio "$decode_min_ratio")
}
cmd_device_decode() {
    step_command=("$python" benchmarks/gpu/device_decode.py --device cuda --work "$1"
        --max-mean "$decode_max_mean")
}
cmd_device_augment() {
    step_command=("$python" benchmarks/gpu/device_augment.py --device cuda --work "$1"
        --max-syncs-per-batch "$augment_max_syncs")
}
cmd_cifar_recipe() {
    [[ -f $archive ]] || { skip="no $archive (benchmarks/prepare_gpu_data.sh)"; return; }
    step_command=("$python" benchmarks/cifar_recipe.py --archive "$archive" --data "$work_dir/cifar10"
        --out "$1" --min-accuracy "$recipe_min_accuracy" --set n_gpu=1
        --set data_loader.args.num_workers=12)  # decodes the 50,000 JPEGs once, into a cache
}
cmd_airbench() {
    local wheels=("$data_dir"/airbench-*.whl)
    [[ -f ${wheels[0]} ]] || { skip="no airbench wheel in $data_dir (prepare_gpu_data.sh --airbench)"; return; }
    [[ -f $archive ]] || { skip="no $archive"; return; }
    # A pure-Python wheel imports from its zip file: nothing is installed.
    step_command=(env "PYTHONPATH=${wheels[0]}" "$python" benchmarks/gpu/airbench_ratio.py
        --data "$work_dir/cifar10" --recipe "$work_dir/cifar_recipe" --work "$1"
        --max-ratio "$airbench_max_ratio")
}
cmd_lightning() {
    [[ -f $archive ]] || { skip="no $archive (benchmarks/prepare_gpu_data.sh)"; return; }
    step_command=("$python" benchmarks/lightning.py --device cuda --archive "$archive" --images 5000
        --epochs 2 --workers 8 --rounds 1 --work "$work_dir/lightning_work"
        --max-ratio "$lightning_max_ratio")
}

plan() {
    local step name limit threshold total=$((PREFLIGHT + WRAP_UP))
    printf 'step\tlimit_s\tpasses when\tnow\n'
    printf 'preflight\t%s\tan interpreter here sees CUDA\t\n' "$PREFLIGHT"
    for step in "${steps[@]}"; do
        IFS='|' read -r name limit threshold <<<"$step"
        step_command=() skip=""
        "cmd_$name" "$work_dir/$name"
        printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$threshold" "${skip:+skipped: $skip}"
        total=$((total + limit))
    done
    printf 'wrap_up\t%s\tthe summary and the failures archive\t\n' "$WRAP_UP"
    printf 'total\t%s\tdeadline %s s\t\n' "$total" "$DEADLINE"
}

if [[ ${1:-} == --plan || ${GPU_CHECK_DRY_RUN:-} == 1 ]]; then
    python=python3 work_dir=WORK
    plan
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: bash benchmarks/gpu_check.sh [--plan]" >&2
    exit 2
fi

out_dir=${OUT:-saved/gpu_check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out_dir" || exit 2
log=$out_dir/gpu_check.log summary=$out_dir/summary.tsv failures=$out_dir/failed_steps.tar.gz
work_dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 2
run_tag=gpu-check-$$-$RANDOM  # in each step's environment, to find what it left running
failed=()
say() { printf '%s\n' "$@" | tee -a "$log"; }
record() {  # name status seconds figure threshold
    printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$summary"
    say "--- $1: $2 in $3 s: $4"
}

# Processes a step left behind: torchrun starts its workers in sessions of their own, beyond
# the process group that `timeout` ends.
end_leftovers() {
    local environ pid
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/} pid=${pid%/environ}
        if [[ $pid != "$$" ]] && grep -qa "GPU_CHECK_TAG=$1" "$environ" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null && say "ended process $pid, left behind by $1"
        fi
    done
}

archive_failures() {  # the failed steps' folders, files under 512 KiB (no checkpoints, no data)
    local files
    mapfile -t files < <(cd "$work_dir" && find "${failed[@]}" -type f -size -512k 2>/dev/null)
    ((${#files[@]})) && tar -czf "$failures" -C "$work_dir" "${files[@]}" 2>>"$log"
}

run_step() {  # name limit threshold
    local name=$1 limit=$2 threshold=$3 dir=$work_dir/$1 start offset code figure left status last
    step_command=() skip=""
    mkdir -p "$dir"
    "cmd_$name" "$dir"
    left=$((DEADLINE - WRAP_UP - SECONDS))
    if [[ -n ${GPU_CHECK_STEPS:-} && ,$GPU_CHECK_STEPS, != *",$name,"* ]]; then
        record "$name" skipped 0 "not in GPU_CHECK_STEPS" "$threshold"
        return
    elif [[ -n $skip ]]; then
        record "$name" skipped 0 "$skip" "$threshold"
        return
    elif ((limit > left)); then
        record "$name" skipped 0 "its limit ${limit} s > the ${left} s left" "$threshold"
        return
    fi
    say "" "=== $name (limit $limit s; passes when: $threshold)" "$ ${step_command[*]}"
    start=$SECONDS offset=$(($(stat -c %s "$log") + 1))
    # Straight into the log, as it comes: no pipe, which a process left behind (a torchrun
    # worker) would hold open past the limit.
    GPU_CHECK_TAG=$run_tag-$name PYTHONUNBUFFERED=1 timeout -k "$GRACE" "$((limit - GRACE))" \
        "${step_command[@]}" >>"$log" 2>&1 </dev/null
    code=$?
    end_leftovers "$run_tag-$name"
    tail -c "+$offset" "$log" >"$dir/output.log"
    figure=$(grep -a '^figure: ' "$dir/output.log" | tail -n 1)
    figure=${figure#figure: }
    if ((code == 0)); then
        status=pass
    else
        status=$( ((code == 124 || code == 137)) && echo timeout || echo fail)
        last=$(grep -av '^[[:space:]]*$' "$dir/output.log" | tail -n 1 | cut -c1-200)
        figure="${figure:-exit $code: $last}"
        failed+=("$name")
        tail -n 15 "$dir/output.log" | cut -c1-300  # the end of its output, here only
        archive_failures
    fi
    record "$name" "$status" "$((SECONDS - start))" "$figure" "$threshold"
}

printf 'step\tstatus\tseconds\tfigure\tthreshold\n' >"$summary"
{
    echo "=== gpu_check.sh $(git rev-parse --short HEAD 2>/dev/null), $(date -u '+%F %T') UTC"
    echo "results: $out_dir, run folders: $work_dir"
    timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} >>"$log" 2>&1
python="" machine=""
for candidate in ${GPU_PYTHON:+"$GPU_PYTHON"} python3 /usr/bin/python3 /usr/local/bin/python3 python; do
    found=$(command -v "$candidate") || continue
    [[ $found == "$PWD"/* && $candidate != "${GPU_PYTHON:-}" ]] && continue
    if machine=$(timeout 60 "$found" -c 'import sys, torch
if not torch.cuda.is_available(): sys.exit(1)
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}")' 2>>"$log"); then
        python=$found
        break
    fi
done
if [[ -z $python ]]; then  # one line on the terminal; the summary and the log keep it too
    message="no python here sees CUDA (torch.cuda.is_available()); set GPU_PYTHON, or run --plan on a CPU"
    printf 'preflight\tfail\t%s\t%s\tan interpreter here sees CUDA\n' "$SECONDS" "$message" >>"$summary"
    echo "error: $message" | tee -a "$log" >&2
    exit 2
fi
cat "$log"  # the header and the GPU, here too
record preflight pass "$SECONDS" "$python: $machine" "an interpreter here sees CUDA"

for step in "${steps[@]}"; do
    IFS='|' read -r name limit threshold <<<"$step"
    run_step "$name" "$limit" "$threshold"
done

say "" "=== summary ($SECONDS s of $DEADLINE; $summary)"
cut -f1-4 "$summary" | tee -a "$log"
if ((${#failed[@]})); then
    say "FAILED: ${failed[*]} (their files: $failures; run folders: $work_dir)"
    exit 1
fi
rm -rf "$work_dir"
say "every step that ran passed"
