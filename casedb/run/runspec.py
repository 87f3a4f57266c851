"""One definition of a run's options.

A :class:`RunSpec` field declares, in its :class:`Flag`, every way the option is given and what
it is: its ``casedb run`` flags, its pytest option (always ``--casedb-…``; the RFC-0186 spelling
too where no other plugin or conftest owns it), an option pytest or another plugin already has
(``-k``, ``-m``, ``-n``), its environment variable, and whether it is part of *what* runs (kept
with the run, reused by ``--resume``) or of *how* (jobs, timeout, fail-fast). From these come the
Typer options of ``casedb run`` (:mod:`casedb.cli`), the plugin's ``pytest_addoption``
(:mod:`casedb.pytest_plugin`), the argv ``casedb run`` hands pytest (:meth:`RunSpec.pytest_argv`),
the stored selection (:meth:`RunSpec.selection`, loaded tolerantly by
:meth:`RunSpec.from_selection`) and the target (:meth:`casedb.run.target.Target.from_spec`).

Adding an option is one field here; the code that uses it reads ``spec.<name>``.
"""

from __future__ import annotations

import os
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from casedb.errors import CasedbError
from casedb.outcomes import MAX_TIMEOUT
from casedb.judge import judges, numerics

SELECTION_VERSION = 2
SAME = "<the field default>"  # Flag.cli_default: casedb run uses the field's default
# Bounds on how a run runs: each worker is a process holding torch (a few hundred MB), so far more
# workers than CPUs only thrash (100000 hung the machine); the timeout's: outcomes.MAX_TIMEOUT.
JOBS_PER_CPU = 4


def max_jobs() -> int:
    """The most --jobs a run takes here: JOBS_PER_CPU per CPU this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return JOBS_PER_CPU * max(cpus, 1)


def _joined(name: str, value: str) -> list[str]:
    """An option and its value as one argv element (``--casedb-op=V``, ``-mV``; an empty value
    stays apart: it cannot be read as an option). A value given as an element of its own is read by
    pytest's early ``-p`` scan, so ``--op=-pNAME`` (or a stored selection of a DB from elsewhere)
    would import NAME as a plugin before any option is parsed."""
    if name.startswith("--"):
        return [f"{name}={value}"]
    return [f"{name}{value}"] if value else [name, value]


@dataclass(frozen=True)
class Flag:
    """How one RunSpec option is spelled and what it is."""

    help: str
    cli: tuple = ()              # `casedb run` spellings ("--model",); () = not a casedb run option
    pytest: str | None = None    # the plugin's own option, "--casedb-<name>"
    rfc: str | None = None       # the RFC-0186 spelling, registered only where nobody else owns it
    builtin: str | None = None   # pytest's (or a pytest plugin's) own option that carries the value
    env: str | None = None       # environment variable giving the default
    what: bool = True            # what runs (stored with the run) vs how it runs
    target: bool = False         # a Target field: where and how each case executes
    metavar: str | None = None
    choices: tuple | None = None  # the values it takes (checked by every front end)
    cli_default: Any = SAME      # casedb run's default, where it differs from the field's


def opt(default, flag: Flag, factory=None):
    meta = {"flag": flag}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def default_backend() -> str:
    """The backend a run uses unless told: env TEST_COMPILE_BACKEND, else inductor."""
    return os.environ.get("TEST_COMPILE_BACKEND") or "inductor"


@dataclass(frozen=True)
class RunSpec:
    """What a run selects and where, and how it runs. See the module docstring. Immutable once
    built: a changed spec is a new one (``dataclasses.replace``), so every process of a run and
    the stored selection see the values it was built with."""

    # ------------------------------------------------------------------ what: the selection
    models: list = opt(None, Flag(
        "Run these models' cases (repeatable; gpt_oss = gpt-oss, case-insensitive).",
        cli=("--model",), pytest="--casedb-model", rfc="--model", metavar="NAME"), factory=list)
    all_models: bool = opt(False, Flag(
        "Run every model's cases (the pytest front end runs a small smoke set without --model, unless --op, -k, "
        "--shard, --limit or --max-numel selects: then every model's, as casedb run).",
        pytest="--casedb-all-models", rfc="--all-models"))
    dedupe: bool = opt(True, Flag(
        "Run each unique case once and judge it for every model that has it (default), or every occurrence.",
        cli=("--dedupe",), pytest="--casedb-dedupe", rfc="--dedupe"))
    keyword: str | None = opt(None, Flag(
        "pytest -k: op (torch.add, aten.mm), case or model name.", cli=("-k",), builtin="-k"))
    markexpr: str | None = opt(None, Flag(
        "Marker expression, e.g. 'not constant' (casedb run default: every selected case; the pytest front "
        "end applies the RFC's 'not largedimtensor and not fp32operation and not bf16operation and not "
        "constant' unless -m is given).", cli=("-m",), builtin="-m", cli_default=""))
    op: list = opt(None, Flag("Only cases of this op (exact or substring; repeatable: cases of any of them).",
                              cli=("--op",), pytest="--casedb-op", metavar="OP"), factory=list)
    limit: int | None = opt(None, Flag("Only the first N selected cases.",
                                       cli=("--limit",), pytest="--casedb-limit", metavar="N"))
    shard: str | None = opt(None, Flag("Only slice I/N (stable by signature), e.g. 2/4.",
                                       cli=("--shard",), pytest="--casedb-shard", metavar="I/N"))
    max_numel: int | None = opt(None, Flag(
        "Only cases whose inputs hold at most N elements in all, and whose outputs too (sized on fake tensors: "
        "a factory such as torch.full counts the tensor it makes; for a device with little memory).",
        cli=("--max-numel",), pytest="--casedb-max-numel", metavar="N"))
    triage: list = opt(None, Flag(
        "Triage file (YAML: expected status per case and target, tolerance rules; repeatable; default "
        "triage/*.yaml of the working directory when present; the shipped triage is added unless "
        "--no-shipped-triage; see casedb.triage.entries).", cli=("--triage",), pytest="--casedb-triage",
        metavar="PATH"), factory=list)
    shipped_triage: bool = opt(True, Flag(
        "Also load the triage shipped with casedb's manifests (manifests/triage/*.yaml: known failures of "
        "torch.compile over the shipped cases, each entry scoped to the backend it fails on).",
        cli=("--shipped-triage",), pytest="--casedb-shipped-triage"))
    # ------------------------------------------------------------------ what: the target
    device: str | None = opt(None, Flag(
        "Target device (default: cuda when available, else cpu; any device torch knows).",
        cli=("--device",), pytest="--casedb-device", rfc="--device", target=True, metavar="DEVICE"))
    backend: str | None = opt(None, Flag(
        "Dynamo backend, or eager for no compile (default: env TEST_COMPILE_BACKEND, else inductor).",
        cli=("--backend",), pytest="--casedb-backend", rfc="--compile-backend", env="TEST_COMPILE_BACKEND",
        target=True, metavar="NAME"))
    imports: list = opt(None, Flag(
        "Module (or .py file; NAME.py in the working directory for NAME) imported in every "
        "process running cases, first (repeatable); --resume needs them given again.",
        cli=("--import",), pytest="--casedb-import", target=True, metavar="MODULE"), factory=list)
    reference_dtype: str | None = opt(None, Flag(
        "Also compare with an upcast reference (float32/float64).",
        cli=("--reference-dtype",), pytest="--casedb-reference-dtype", target=True, metavar="DTYPE"))
    run_skipped: bool = opt(False, Flag(
        "Also run the occurrences a skip_if condition skips (a v2 config's mode: skip, an excluded or unsupported "
        "dtype), on purpose: judged as any other; triage exclusions still apply.",
        cli=("--run-skipped",), pytest="--casedb-run-skipped", target=True))
    check_determinism: bool = opt(False, Flag(
        "Run the target twice; require identical bits.",
        cli=("--check-determinism",), pytest="--casedb-check-determinism", target=True))
    judge: str = opt(numerics.DEFAULT_JUDGE, Flag(
        "How a result is judged: " + "; ".join(f"{j.name} ({j.about})" for j in judges.JUDGES.values())
        + f". Default {numerics.DEFAULT_JUDGE} (casedb.judge.judges, casedb.judge.numerics).",
        cli=("--judge",), pytest="--casedb-judge", target=True, choices=numerics.JUDGES))
    values: str = opt("random", Flag(
        "The inputs' values: random (the case's own, default) or extremal (the ranges of casedb.cases.value_ranges: "
        "large magnitudes where overflow and cancellation are the risk, inf/NaN/subnormals/-0 where the op defines "
        "them; cases of ops without a rule are skipped), stored as separate results of the same case.",
        cli=("--values",), pytest="--casedb-values", target=True, choices=("random", "extremal")))
    replace_device: bool = opt(True, Flag(
        "Give device strings recorded in cases (cuda:0) the target device (default), or keep them as written.",
        cli=("--device-replace",), pytest="--casedb-device-replace", rfc="--device-replace", target=True))
    arch: str | None = opt(None, Flag(
        "The target's architecture, for triage entries scoped to one (e.g. sm_90, spyre-v1); default: the "
        "device's (CUDA: sm_<major><minor>), else none.", cli=("--arch",), pytest="--casedb-arch", target=True,
        metavar="ARCH"))
    measure: bool = opt(False, Flag(
        "Also time every passed case on the target and on the baseline (torch.utils.benchmark: warmed up, "
        "compile excluded, the device synchronized), with its FLOPs and bytes; stored with the result "
        "(casedb.run.measure; casedb report shows speedups, rooflines and latency changes).",
        cli=("--measure",), pytest="--casedb-measure", target=True, what=False))
    measure_baseline: str = opt("eager", Flag(
        "What --measure compares the target with: eager (on the target device; default), cpu (eager on the "
        "CPU) or a dynamo backend's name (on the target device).",
        cli=("--measure-baseline",), pytest="--casedb-measure-baseline", target=True, what=False, metavar="NAME"))
    measure_budget: float = opt(2.0, Flag(
        "Seconds --measure may spend timing one case (half for the target, half for the baseline).",
        cli=("--measure-budget",), pytest="--casedb-measure-budget", target=True, what=False, metavar="S"))
    # ------------------------------------------------------------------ how
    jobs: int = opt(1, Flag("Worker processes (pytest-xdist); 0: in this process, no isolation.",
                            cli=("-j", "--jobs"), builtin="-n", what=False))
    timeout: float = opt(300.0, Flag("Seconds per case before it counts as a timeout (0: none).",
                                     cli=("--timeout",), builtin="--timeout", what=False))
    fail_fast: bool = opt(False, Flag("Stop at the first unexpected outcome.",
                                      cli=("--fail-fast", "-x"), builtin="-x", what=False))
    reference_cache: bool = opt(True, Flag(
        "Take CPU references, and the inputs of cases expensive to build, from the cache beside the DB "
        "(<db>.refcache, casedb.run.refcache) and keep new ones there (default); --no-reference-cache "
        "bypasses both: computes every reference, generates every input and keeps none.",
        cli=("--reference-cache",), pytest="--casedb-reference-cache", what=False))
    threads: int | None = opt(None, Flag("torch threads per process running cases.",
                                         pytest="--casedb-threads", what=False, target=True, metavar="N"))

    def __post_init__(self):
        # (frozen: the constructor's own normalization sets through object.__setattr__); the one
        # place the default backend is decided
        normal = {"backend": default_backend() if self.backend is None else self.backend,
                  "models": list(self.models or []), "imports": list(self.imports or []),
                  # a run stored before --op was repeatable keeps one op, or None
                  "op": [self.op] if isinstance(self.op, str) else list(self.op or [])}
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ derived views
    def selection(self) -> dict:
        """The *what* of this spec, as a run stores it (``runs.selection.options``)."""
        return {f.name: getattr(self, f.name) for f, flag in spec_fields() if flag.what}

    @classmethod
    def from_selection(cls, options: dict, **how) -> "RunSpec":
        """The spec of a stored run (any version: unknown keys are ignored, missing ones take
        their defaults), with ``how`` (jobs, timeout, ...) from the caller."""
        known = {f.name for f, flag in spec_fields() if flag.what}
        kept = {k: v for k, v in (options or {}).items() if k in known}
        return cls(**kept, **how)

    def with_how(self, other: "RunSpec") -> "RunSpec":
        """This spec's *what* with ``other``'s *how*."""
        return replace(self, **{f.name: getattr(other, f.name) for f, flag in spec_fields() if not flag.what})

    def pytest_argv(self) -> list[str]:
        """The pytest options that give this spec's values to the plugin (jobs and timeout are
        handed to pytest-xdist and pytest-timeout by the runner, with what they need around them)."""
        args: list[str] = []
        for f, flag in spec_fields():
            value = getattr(self, f.name)
            default = _field_default(f)
            if flag.builtin in ("-n", "--timeout"):
                continue
            name = flag.pytest or flag.builtin
            if name is None:
                continue
            if f.name == "markexpr":
                if value is not None:
                    args += _joined("-m", value)
            elif isinstance(default, bool) or f.type == "bool":
                if value != default:
                    args.append(name if value else negative(name))
            elif isinstance(value, list):
                for v in value:
                    args += _joined(name, str(v))
            elif value is not None and value != default:
                args += _joined(name, str(value))
        return args

    def validate(self) -> "RunSpec":
        """Check every value once, before anything runs; raises CasedbError saying what to give."""
        from casedb.cases import dtypes, marks

        for f, flag in spec_fields():
            value = getattr(self, f.name)
            if flag.choices and value is not None and value not in flag.choices:
                raise CasedbError(f"{(flag.cli or (flag.pytest,))[-1]} takes {', '.join(flag.choices)}, not {value!r}")
        if self.jobs < 0:
            raise CasedbError("--jobs must be 0 (in this process, no isolation) or more")
        if self.jobs > max_jobs():
            raise CasedbError(f"--jobs {self.jobs} is more than {max_jobs()} ({JOBS_PER_CPU} per CPU of this machine): "
                              "each worker is a process holding torch; give fewer")
        if self.limit is not None and self.limit < 1:
            raise CasedbError("--limit must be at least 1")
        if not 0.01 <= self.measure_budget <= 600:  # NaN fails both comparisons
            raise CasedbError(f"--measure-budget takes seconds from 0.01 to 600, not {self.measure_budget!r}")
        if self.max_numel is not None and self.max_numel < 1:
            raise CasedbError(f"--max-numel must be at least 1, not {self.max_numel}")
        if self.threads is not None and self.threads < 1:
            raise CasedbError(f"--casedb-threads must be at least 1, not {self.threads}")
        if self.timeout is not None and not 0 <= self.timeout <= MAX_TIMEOUT:  # NaN fails both comparisons
            raise CasedbError(f"--timeout takes seconds from 0 (none) to {MAX_TIMEOUT:g}, not {self.timeout!r}")
        parse_shard(self.shard)
        if self.markexpr:
            try:
                marks.MarkExpression(self.markexpr)
            except ValueError as e:
                raise CasedbError(str(e)) from None
        if self.reference_cache:
            from casedb.run.refcache import MAX_BYTES_ENV, parse_bytes

            parse_bytes(os.environ.get(MAX_BYTES_ENV))
        if self.reference_dtype:
            try:
                dtypes.reference_dtype(self.reference_dtype)
            except dtypes.UnknownDtype as e:
                raise CasedbError(f"--reference-dtype: {e}") from None
        return self


def negative(flag: str) -> str:
    """``--casedb-dedupe`` -> ``--casedb-no-dedupe``; ``--dedupe`` -> ``--no-dedupe``."""
    if flag.startswith("--casedb-"):
        return "--casedb-no-" + flag[len("--casedb-"):]
    return "--no-" + flag[2:]


def spec_fields() -> list[tuple]:
    """(dataclass field, Flag) of every RunSpec option, in declaration order."""
    return [(f, f.metadata["flag"]) for f in fields(RunSpec)]


def _field_default(f):
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def field_default(name: str):
    return _field_default(next(f for f in fields(RunSpec) if f.name == name))


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"2/4"`` -> (2, 4): the second of four slices (1-based, as CI matrices count)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise CasedbError(f"--shard takes I/N with 1 <= I <= N (e.g. 1/4 ... 4/4), not {text!r}")
    return int(m.group(1)), int(m.group(2))
