"""`blazar tune MODEL` and `blazar drafts MODEL`: measure a model's settings on real
children and keep the winner as its profile; list the models that could draft for it.

The work is `blazar.tune` (plan, measure, decide, record); this module reads the flags,
draws the progress bar on a terminal and prints the tables (docs/tune.md).
"""

from __future__ import annotations

import difflib
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_count, table

MANIFEST = click.option(
    "--manifest",
    "manifest_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The manifest whose declarations apply (default: yours).",
)


def _manifest(ctx: Context, path: Path | None) -> Any:
    from blazar.reconcile.apply import load_or_empty

    return load_or_empty(path or ctx.paths.manifest)


@click.command("tune")
@click.argument("model")
@click.option(
    "--spec-race",
    is_flag=True,
    help="Race dense, n-gram and draft decoding (the default when no stage is asked).",
)
@click.option(
    "--search",
    is_flag=True,
    help="Try slots, batch sizes, threads and cache types "
    "one at a time, within what `blazar fit` says fits.",
)
@click.option("--ngram", is_flag=True, help="Refine the n-gram lookup's sizes and min hits.")
@click.option("--cache-reuse", is_flag=True, help="Try cache_reuse on the long-prompt workload.")
@click.option("--slots", type=click.IntRange(1, 64), default=None, help="Slots of every child.")
@click.option(
    "--replicas",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Children per candidate; the clients are spread over them.",
)
@click.option(
    "--load", type=click.IntRange(1, 64), default=1, show_default=True, help="Concurrent clients."
)
@click.option(
    "--runs",
    type=click.IntRange(1, 50),
    default=3,
    show_default=True,
    help="Measured runs per candidate (their median decides), after a warm-up.",
)
@click.option(
    "--workload",
    default=None,
    help="repetitive, chat, long-prompt or a workload file (default: each stage's own).",
)
@click.option(
    "--requests", type=click.IntRange(1), default=None, help="Only the workload's first N requests."
)
@click.option(
    "--tokens",
    type=click.IntRange(1, 4096),
    default=None,
    help="Tokens each request generates (default: the workload's).",
)
@click.option(
    "--threshold",
    type=click.FloatRange(0, 1),
    default=0.05,
    show_default=True,
    help="How much a candidate must beat the baseline by to be adopted.",
)
@click.option("--draft", "drafts", multiple=True, help="Race this model as a draft too.")
@click.option("--dry-run", is_flag=True, help="Show the runs and their argv; start nothing.")
@click.option("--forget", is_flag=True, help="Drop MODEL's profile (history stays) and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs and decisions as JSON.")
@MANIFEST
@pass_context
def tune(
    ctx: Context,
    model: str,
    spec_race: bool,
    search: bool,
    ngram: bool,
    cache_reuse: bool,
    slots: int | None,
    replicas: int,
    load: int,
    runs: int,
    workload: str | None,
    requests: int | None,
    tokens: int | None,
    threshold: float,
    drafts: tuple[str, ...],
    dry_run: bool,
    forget: bool,
    as_json: bool,
    manifest_path: Path | None,
) -> None:
    """Measure MODEL's settings on real children and record the winner as its profile.

    Each stage races candidates against a baseline on a workload and adopts one only
    when the median of its runs beats the baseline by more than the threshold (5%),
    printing the figures either way. The next spawn uses the profile, except where the
    manifest pins a field (`blazar ps` shows what the profile set).

    Example: blazar tune gemma3-270m --spec-race --workload repetitive
    """
    from blazar.store.profiles import ProfileStore
    from blazar.tune.plan import Options
    from blazar.tune.session import Tuner

    if forget:
        ProfileStore(ctx.store).forget(model)
        click.echo(f"{model}: profile dropped; the next spawn uses the manifest's settings")
        return
    options = Options(
        search=search,
        spec_race=spec_race,
        ngram=ngram,
        cache_reuse=cache_reuse,
        slots=slots,
        replicas=replicas,
        load=load,
        runs=runs,
        workload=workload,
        requests=requests,
        tokens=tokens,
        threshold=threshold,
        drafts=drafts,
    )
    tuner = Tuner(ctx.store, ctx.paths, _manifest(ctx, manifest_path), model, options)
    if dry_run:
        report = tuner.plan()
    else:
        bar = _Bar(report_total(tuner.plan(), options.runs), enabled=sys.stderr.isatty())
        report = tuner.run(progress=bar.step)
        bar.close()
    if as_json:
        echo_json(report.to_json())
        return
    for result in report.stages:
        _echo_stage(result, options, dry_run)
    if dry_run:
        click.echo("Dry run: nothing was started.")
    else:
        shown = ", ".join(f"{k} = {v!r}" for k, v in sorted(report.settings.items())) or "none"
        click.echo(
            f"Profile of {report.model} recorded: {shown}. The next spawn uses it "
            "(`blazar ps` shows it)."
        )
    for note in report.notes:
        click.echo(f"  ! {note}")


def report_total(plan: Any, runs: int) -> int:
    return sum(
        (runs + 1) * sum(c.skip is None for c in r.stage.candidates)
        for r in plan.stages
        if sum(c.skip is None for c in r.stage.candidates) > 1
    )


class _Bar:
    """`[#####.....] 6/16 runs  spec-race: ngram  0:42` on stderr, redrawn in place."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total, self.done, self.enabled = max(1, total), 0, enabled
        self.started = time.monotonic()

    def step(self, stage: str, label: str) -> None:
        self.done = min(self.total, self.done + 1)
        if not self.enabled:
            return
        filled = int(20 * self.done / self.total)
        seconds = int(time.monotonic() - self.started)
        line = (
            f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} runs  "
            f"{stage}: {label}  {seconds // 60}:{seconds % 60:02d}"
        )
        click.echo(f"\r{line:<78}", nl=False, err=True)

    def close(self) -> None:
        if self.enabled:
            click.echo("", err=True)


def _changed(base: tuple[str, ...], argv: tuple[str, ...]) -> str:
    """The arguments a candidate has that the baseline has not (inserted or changed)."""
    ops = difflib.SequenceMatcher(a=base, b=argv, autojunk=False).get_opcodes()
    return " ".join(a for tag, _, _, j1, j2 in ops if tag != "equal" for a in argv[j1:j2])


def _echo_stage(result: Any, options: Any, dry_run: bool) -> None:
    from blazar.tune.plan import FIGURE

    stage = result.stage
    click.echo(f"{stage.name} on the {stage.workload} workload ({options.runs} runs each):")
    base = result.argv.get(stage.candidates[0].label, ())
    found = {f.label: f for f in result.figures}
    if dry_run:
        for c in stage.candidates:
            argv = result.argv.get(c.label)
            shown = shlex.join(argv) if argv is not None else f"skipped: {c.skip}"
            click.echo(f"  {c.label}{' (baseline)' if c.baseline else ''}: {shown}")
        click.echo("")
        return
    rows = []
    for c in stage.candidates:
        argv = result.argv.get(c.label, ())
        extra = _changed(base, argv) or ("(baseline)" if c.baseline else "")
        f = found.get(c.label)
        if c.skip is not None:
            rows.append([c.label, f"skipped: {c.skip}"] + [None] * 6)
        elif f is None or f.error is not None:
            rows.append([c.label, f"failed: {f.error}" if f and f.error else extra] + [None] * 6)
        else:
            rows.append(
                [
                    c.label,
                    extra,
                    f"{f.median:.1f}",
                    _num(f.decode_tps),
                    _num(f.prompt_tps),
                    f"{f.acceptance:.0%}" if f.acceptance is not None else None,
                    f"{f.ttft_s:.2f} s" if f.ttft_s is not None else None,
                    f"{f.memory_mb:.0f} MB" if f.memory_mb is not None else None,
                ]
            )
    figure = "STREAM TOK/S" if FIGURE[stage.name] == "stream" else "E2E TOK/S"
    headers = ["MODE", "ARGV", figure, "DECODE TOK/S", "PROMPT TOK/S", "ACCEPTED", "TTFT", "MEMORY"]
    click.echo(table(headers, rows))
    if result.decision is not None:
        click.echo(f"  {result.decision.reason}")
    else:
        click.echo("  nothing to race: every candidate but one was skipped")
    click.echo("")


def _num(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


@click.command("drafts")
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per candidate draft.")
@MANIFEST
@pass_context
def drafts(ctx: Context, model: str, manifest_path: Path | None, as_json: bool) -> None:
    """The declared and held models that could draft for MODEL: whether their vocabulary
    matches (read from both GGUFs), and their size beside MODEL's.

    Example: blazar drafts qwen3-8b
    """
    from blazar.tune.drafts import draft_options

    target, options = draft_options(ctx.store, _manifest(ctx, manifest_path), model)
    if as_json:
        for option in options:
            echo_json(option.to_json())
        return
    rows = [
        [
            o.name,
            "yes" if o.declared else "",
            "yes" if o.held else "",
            {True: "matches", False: "differs", None: "-"}[o.fits],
            o.reason,
            human_count(o.parameters) if o.parameters else None,
            f"{o.ratio:.3g}x" if o.ratio is not None else None,
        ]
        for o in options
    ]
    click.echo(f"Drafts for {target} (set models.{target}.draft to one that matches):")
    click.echo(
        table(["MODEL", "DECLARED", "HELD", "VOCABULARY", "WHY NOT", "PARAMETERS", "SIZE"], rows)
    )


COMMANDS = [tune, drafts]
