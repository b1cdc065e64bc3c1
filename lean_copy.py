"""A lean copy (new_project.py --lean, docs/new-project.md): copier.yml's `{% if lean %}` block
leaves out the optional parts' files; this module then takes out of the kept files what named
them, so that the copy has no dead import, no test of a missing part, and no page pointing at a
missing file. Not copied itself (copier.yml).

Two kinds of change (tests/test_new_project.py runs them on the template's files):
- generic: in Python files, an import of a left-out module goes, with the names it brought into
  `__all__`; in tests/, a top-level function that names a left-out file or module goes, and so
  do the imports only such functions used; in Markdown, a "Worked example" section that names a
  left-out part goes;
- EDITS, by hand, for prose and settings: (file, old text, new text), `old` exactly once; (file,
  a compiled pattern, replacement), matching at least once; or (file, heading, None) to drop a
  Markdown section (the heading and everything down to the next heading of its level or above).
"""

import ast
import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path

# The lean block of copier.yml: "# part: what it is" lines, then its "/path" patterns.
LEAN_BLOCK = re.compile(r"\{% if lean %\}(.*?)\{% endif %\}", re.DOTALL)

# Left as it is: it names the left-out parts to test lean copies, and skips itself in any copy
# (no copy has new_project.py).
SELF_TEST = "tests/test_new_project.py"

# (file, old, new): the prose and settings that name the left-out parts. Keep in step with the
# files (tests/test_new_project.py fails on an edit that no longer applies).
EDITS: list[tuple[str, str | re.Pattern, str | None]] = [
    # benchmarks
    ("README.md", " (`benchmarks/input_pipeline.py`) and", " and"),
    ("README.md", "### Benchmarks", None),
    ("README.md", "; the real check on a\nGPU is `benchmarks/gpu_check.sh`.", "."),
    ("README.md", "); benchmarks/: speed checks, gpu_check.sh\n", ")\n"),
    ("README.md", "measurements, `gpu_check.sh`\n", "measurements\n"),
    ("docs/performance.md", "on an H200 in `benchmarks/gpu_check.sh`:", "on an H200:"),
    ("docs/performance.md", "## On a GPU: `benchmarks/gpu_check.sh`", None),
    ("docs/performance.md", "## Benchmark options", None),
    ("docs/performance.md", "### Where a whole run's time goes", None),
    ("docs/performance.md", "| what | result | goal | command |\n|---|---|---|---|", "| what | result | goal |\n|---|---|---|"),
    ("docs/performance.md", re.compile(r"(?m)^(\|.*\|) `python benchmarks/[^|]*\|$"), r"\1"),
    ("docs/performance.md", "; `python\nbenchmarks/throughput.py`, 2026", ", 2026"),
    ("docs/performance.md", "(no model), `python benchmarks/input_pipeline.py`:", "(no model):"),
    ("docs/performance.md", "**End to end**, `python benchmarks/pipeline_training.py`:", "**End to end**:"),
    ("docs/recipes.md", "### Short of the records: what the images cost", None),
    ("docs/recipes.md", "### Measuring a config as the records report", None),
    ("docs/recipes.md", "fp32, `OMP_NUM_THREADS=2`, one run alone on the 2 cores:\n\n```bash\nOMP_NUM_THREADS=2 python benchmarks/cifar_recipe.py --set trainer.amp=null --seed 0   # and --seed 1, --seed 2\nOMP_NUM_THREADS=2 python benchmarks/cifar_recipe.py --set trainer.amp=null --seed 0 --epochs 3   # and --seed 1, --seed 2\n```\n", "fp32, `OMP_NUM_THREADS=2`, one run alone on the 2 cores:\n"),
    ("docs/recipes.md", "```bash\nOMP_NUM_THREADS=1 python benchmarks/cifar_recipe.py --set trainer.amp=null --seeds 2\nOMP_NUM_THREADS=1 python benchmarks/cifar_recipe.py --set trainer.amp=null --seeds 2 --epochs 3\n", "```bash\n"),
    ("docs/recipes.md", "```bash\nOMP_NUM_THREADS=1 python benchmarks/cifar_recipe.py --set trainer.amp=null            # seed 0\nOMP_NUM_THREADS=1 python benchmarks/cifar_recipe.py --set trainer.amp=null --seed 1   # seed 1\n```\n\n", ""),
    ("docs/config.md", "(a side-by-side run, benchmarks/lightning.py: about", "(a side-by-side run: about"),
    ("pyproject.toml", "# benchmarks/lightning.py only: the whole-process comparison with PyTorch Lightning. Not a\n# dependency of the template, and not installed by CI.\nbenchmarks = [\"lightning>=2.2\"]\n", ""),
    (".ci/run", "# The shell scripts, benchmarks/gpu_check.sh first: it runs once per GPU loan, unattended.\nshellcheck .ci/run benchmarks/*.sh\n", "shellcheck .ci/run\n"),
    ("tests/test_gpu_resume.py", " (benchmarks/gpu_check.sh's step \"resume\"; skipped without CUDA)", " (skipped without CUDA)"),
    ("tests/test_gpu_paths.py", " (benchmarks/gpu_check.sh runs them; skipped without\nCUDA)", " (skipped without CUDA)"),
    ("docs/performance.md", "; `throughput.py`\ntimes the model's steps alone, without the trainer.", "."),
    ("tests/test_newcomer.py", " torchrun and gpu_check.sh are real processes.", " torchrun is a real process."),
    ("tests/test_image_folder_pipelines.py", "# --- on a GPU (gpu_check.sh runs it) ---", "# --- on a GPU ---"),
    ("tests/test_cifar_recipe.py", "\n\n# --- benchmarks/reencode_jpeg.py: the cost of a JPEG pass (docs/recipes.md) ---------------------\n", ""),
    # examples (the worked examples of other tasks, issue 32)
    ("README.md", "distillation, tabular regression, sequences, segmentation and detection are worked examples", "distillation and tabular regression are worked examples"),
    ("README.md", ", wine, sequences, segmentation, detection\n", ", wine\n"),
    ("docs/data.md", " `SequenceDataLoader`\n(`data_loader/tasks/sequences.py`) pads with token 0:", " A loader of token\nsequences pads with token 0:"),
    ("docs/data.md", "class SequenceDataLoader(BaseDataLoader):", "class SequenceLoader(BaseDataLoader):"),
    ("docs/data.md", "(`GRUClassifier`: a mask `tokens != 0`)", "(a mask `tokens != 0`)"),
    ("docs/data.md", " (`collate_detection` in `data_loader/tasks/detection.py`)", ""),
    ("docs/data.md", "e.g. for\n`configs/segmentation.json`:", "e.g. for\na segmentation's masks:"),
    ("docs/extending.md", " with the image; see `SegmentationDataLoader`.", " with the image."),
    ("docs/extending.md", " and\n  [the sequence example](#worked-example-sequences).", "."),
    ("docs/data.md", " See\n[Worked example: detection](extending.md#worked-example-detection).", ""),
    ("docs/predict-export.md", " The sequence example (`SequenceDataLoader`, [the worked\nexample](extending.md#worked-example-sequences)) prints:", " A GRU over token sequences prints:"),
    ("docs/predict-export.md", ";\n  `SequenceDataLoader`'s random tokens `(B, 16)` without padding, so that any cut along the\n  length is still a batch of sequences. Its `read_inputs` reads a JSONL file (a `\"tokens\"` list\n  per line; a `\"label\"` is ignored), names each sequence `path:line` and pads them with 0.", "."),
    ("docs/predict-export.md", " net, as\n`SegmentationDataLoader`'s and `DetectionDataLoader`'s do)", " net)"),
    ("docs/outputs.md", " (of each step's loss: a detector's is per batch, [extending.md](extending.md#worked-example-detection))", ""),
    ("docs/predict-export.md", " `SegmentationDataLoader`'s writes each", " A segmentation's loader can write each"),
    ("model/loss.py", " (a detector's,\n    model/detector.py)", " (a detector's)"),
    ("model/metric.py", " (trainer/detection.py).", "."),
    ("model/torchvision_model.py", "; the detection task's model is TinyDetector", ""),
    ("model/torchvision_model.py", "; the segmentation task's model is UNet", ""),
    ("docs/config.md", ": the detection and segmentation tasks have models of their own, `TinyDetector` and `UNet`, in docs/extending.md)", ")"),
    ("pyproject.toml", "MeanAveragePrecision metric (configs/detection.json):", "MeanAveragePrecision metric:"),
    ("requirements-extras.txt", "MeanAveragePrecision metric (configs/detection.json):", "MeanAveragePrecision metric:"),
    ("tests/test_evaluation.py", ": tested against\n# torchmetrics for any batch cut and on two ranks in tests/test_task_detection.py.", ": tested with the\n# detection example, which a lean copy leaves out."),
    # sweeps
    ("README.md", "### Experiments: loggers, sweeps, devices", "### Experiments: loggers, devices"),
    ("README.md", "```bash\npython sweep.py -c configs/demo.json --grid 'optimizer.args.lr=[0.01,0.001]' --parallel 2\n```\n\n`sweep.py` runs one ordinary train.py run per trial (`--grid`, `--random N`, `--optuna N`) under\n`saved/sweeps/<name>/`, resumable, ranked by `trainer.monitor` in `sweep_summary.csv`; `--slurm`\nwrites a job array: [docs/sweeps.md](docs/sweeps.md). ", ""),
    ("README.md", " export.py sweep.py tune.py", " export.py tune.py"),
    ("README.md", "sweeps/       sweep.py's search spaces, trials, results, SLURM arrays, Optuna\n", ""),
    ("README.md", "- [docs/sweeps.md](docs/sweeps.md): grid, random and Optuna sweeps, parallel trials, resume, SLURM job arrays\n", ""),
    ("docs/distributed.md", "A hyper-parameter sweep runs as a job array, one trial per array task, with the same\npreemption and requeue handling: `python sweep.py ... --slurm` ([sweeps.md](sweeps.md#slurm)).\n\n", ""),
    ("docs/outputs.md", " sweep.py's `sweep.json`, `base_config.json`, trial\nrecords and `sweep_summary.json`,", ""),
    ("docs/outputs.md", "A sweep (`sweep.py`) puts each trial's run folder under `saved/sweeps/<sweep name>/`, beside\nits summary: see [sweeps.md](sweeps.md#outputs).\n\n", ""),
    ("requirements-extras.txt", "# sweep.py --optuna\noptuna>=4.0\n", ""),
    ("pyproject.toml", "# sweep.py --optuna: the TPE sampler and the median pruner (the study is kept in SQLite).\noptuna = [\"optuna>=4.0\"]\n", ""),
    ("pyproject.toml", ', "utils", "sweeps"]', ', "utils"]'),
    ("pyproject.toml", 'name = "Only the entry scripts use build.py and the sweeps"', 'name = "Only the entry scripts use build.py"'),
    ("pyproject.toml", 'forbidden_modules = ["build", "sweeps"]', 'forbidden_modules = ["build"]'),
    (".ci/run", " (e.g. optuna for\n# sweep.py --optuna), and shellcheck (its binary in a PyPI wheel).", ", and shellcheck\n# (its binary in a PyPI wheel)."),
    ("tests/conftest.py", '    "sweep": importlib.import_module("sweep"),\n', ""),
    ("tests/conftest.py", "(train, test, predict, export, sweep): its exit code and what it printed, with one\n    thread. sweep.py's trials are still processes of their own.", "(train, test, predict, export): its exit code and what it printed, with one\n    thread."),
    ("tests/conftest.py", " (sweep.py's trials)", ""),
    ("tests/test_readme.py", '"export.py", "sweep.py", "tune.py"]', '"export.py", "tune.py"]'),
    ("tests/test_layers.py", ', "data_loader", "sweeps", "build")', ', "data_loader", "build")'),
]  # fmt: skip


def lean_parts(copier_yml: str) -> dict[str, list[str]]:
    """{part: its patterns, "/" stripped} from copier.yml's lean block."""
    block = LEAN_BLOCK.search(copier_yml)
    if block is None:
        raise ValueError("copier.yml: no {% if lean %} block in _exclude")
    parts: dict[str, list[str]] = {}
    for line in filter(None, (text.strip() for text in block.group(1).splitlines())):
        if line.startswith("#"):
            parts[line[1:].split(":")[0].strip()] = []
        else:
            parts[list(parts)[-1]].append(line.lstrip("/"))
    return parts


def is_left_out(path: str, patterns: list[str]) -> bool:
    """Whether the copy's file `path` ("a/b.py") falls under one of the lean patterns."""
    return any(fnmatch.fnmatchcase(path, p) or path.startswith(p + "/") for p in patterns)


def left_out_modules(patterns: list[str]) -> set[str]:
    """The dotted names of the left-out Python modules and packages ("sweep", "sweeps"): an
    import of one of their submodules starts with one of them."""
    return {
        p.removesuffix(".py").replace("/", ".")
        for p in patterns
        if "*" not in p and (p.endswith(".py") or "." not in p)
    }


def mention(patterns: list[str], modules: set[str]) -> re.Pattern:
    """What names a left-out part: a file's path ("sweep.py", "tests/test_task_"), a folder's
    followed by "/" or as a string ("benchmarks/", '"benchmarks"'), an import of a module."""
    paths = [
        re.escape(p.split("*")[0]) + ("" if "." in p or "*" in p else "(?=/)") for p in patterns
    ]
    folders = [rf"[\"']{re.escape(p)}[\"']" for p in patterns if "." not in p and "*" not in p]
    links = [rf"(?<=\(){re.escape(p[5:])}" for p in patterns if p.startswith("docs/")]  # (page.md)
    imports = [rf"\b(?:from|import) {re.escape(m)}\b" for m in sorted(modules)]
    alternatives = [rf"(?<![\w./-])(?:{'|'.join(paths)})", *folders, *links, *imports]
    return re.compile("|".join(alternatives))


def without_imports(text: str, modules: set[str]) -> str:
    """`text` without its top-level imports of `modules` (one line each, as ruff formats them)
    and without the names they brought from `__all__`."""
    names: list[str] = []
    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and any(node.module == m or node.module.startswith(m + ".") for m in modules)
        ):
            names += [alias.asname or alias.name for alias in node.names]
    pattern = "|".join(re.escape(m) for m in sorted(modules))
    text = re.sub(rf"(?m)^from (?:{pattern})(?:\.[\w.]+)? import .*\n", "", text)
    for name in names:  # one a line (a trailing comma), or inline
        text = re.sub(rf'(?m)^    "{name}",\n|"{name}", |, "{name}"(?=\])', "", text)
    return text


def without_tests_of(text: str, named: re.Pattern) -> str:
    """A test module without its top-level functions whose source names a left-out part."""
    lines = text.splitlines(keepends=True)
    nodes = ast.parse(text).body
    for node, after in reversed(list(zip(nodes, [*nodes[1:], None], strict=True))):
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
        end = after.lineno - 1 if after else len(lines)
        if isinstance(node, ast.FunctionDef) and named.search("".join(lines[start:end])):
            del lines[start:end]
    if len(lines) == len(text.splitlines()):
        return text
    return without_unused_imports("".join(lines).rstrip("\n") + "\n")


def without_unused_imports(text: str) -> str:
    """`text` without the top-level one-line imports whose names it no longer uses (those only
    the dropped tests used)."""
    tree = ast.parse(text)
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    lines = text.splitlines(keepends=True)
    for node in reversed(tree.body):
        if not isinstance(node, ast.Import | ast.ImportFrom) or node.end_lineno != node.lineno:
            continue
        kept = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
        if not kept:
            index = node.lineno - 1
            del lines[index]
            if 0 < index < len(lines) and not lines[index - 1].strip() and not lines[index].strip():
                del lines[index]  # the blank line that closed a group now empty
        elif len(kept) < len(node.names):
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
            lines[node.lineno - 1] = f"from {node.module} import {names}\n"
    return "".join(lines)


def section(lines: list[str], heading: str) -> tuple[int, int]:
    """The lines [start, end) of the Markdown section `heading` opens: the heading and all down
    to the next heading of its level or above, outside code fences. ValueError unless `heading`
    is one line of `lines`, once."""
    if lines.count(heading + "\n") != 1:
        raise ValueError(f"no single heading {heading!r}")
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading + "\n")
    end, fenced = start + 1, False
    while end < len(lines):
        fenced ^= lines[end].startswith("```")
        marks = len(lines[end]) - len(lines[end].lstrip("#"))
        if not fenced and 0 < marks <= level and lines[end][marks : marks + 1] == " ":
            break
        end += 1
    return start, end


def without_examples_of(text: str, named: re.Pattern) -> str:
    """A Markdown page without its "Worked example" sections that name a left-out part (the
    worked examples of other tasks, docs/extending.md)."""
    for heading in re.findall(r"(?m)^#+ Worked example\b.*$", text):
        lines = text.splitlines(keepends=True)
        start, end = section(lines, heading)
        if named.search("".join(lines[start:end])):
            text = "".join(lines[:start] + lines[end:])
    return text


def edit(text: str, old: str | re.Pattern, new: str | None) -> str:
    """One EDITS entry on a file's text; ValueError when it does not apply."""
    if isinstance(old, re.Pattern):  # every match, at least one
        text, count = old.subn(new or "", text)
        if not count:
            raise ValueError(f"no match for {old.pattern!r}")
        return text
    if new is None:
        lines = text.splitlines(keepends=True)
        start, end = section(lines, old)
        return "".join(lines[:start] + lines[end:])
    if text.count(old) != 1:
        raise ValueError(f"{old[:60]!r} occurs {text.count(old)} times, not once")
    return text.replace(old, new)


def lean_text(name: str, text: str, modules: set[str], named: re.Pattern) -> str:
    """A kept file's text in a lean copy."""
    for path, old, new in EDITS:
        if path == name:
            try:
                text = edit(text, old, new)
            except ValueError as error:
                raise ValueError(f"lean_copy.EDITS, {name}: {error}") from None
    if name.endswith(".md"):
        text = without_examples_of(text, named)
    if name.endswith(".py") and name != SELF_TEST:
        text = without_imports(text, modules)
        if name.startswith("tests/"):
            text = without_tests_of(text, named)
    return text


def texts(root: Path, folder: Path, files: Iterable[str] = ()) -> dict[str, str]:
    """{file: new text} for each file of `folder` (the template `root`, or a lean copy of it)
    that a lean copy changes: those EDITS names, and among `files` its Python and Markdown files.
    ValueError when an edit no longer applies to the file."""
    parts = lean_parts((root / "copier.yml").read_text(encoding="utf-8"))
    patterns = [pattern for part in parts.values() for pattern in part]
    modules = left_out_modules(patterns)
    named = mention(patterns, modules)
    names = {name for name, _, _ in EDITS} | {n for n in files if n.endswith((".py", ".md"))}
    changed = {}
    for name in sorted(name for name in names if not is_left_out(name, patterns)):
        if not (folder / name).is_file():
            raise ValueError(f"lean_copy.EDITS names {name}, which {folder} does not have")
        text = (folder / name).read_text(encoding="utf-8")
        try:
            new = lean_text(name, text, modules, named)
        except ValueError as error:
            raise ValueError(f"{error}: the template changed; update lean_copy.py") from None
        if new != text:
            changed[name] = new
    return changed
