"""Evaluate measurement rows with simsp and summarise the errors, per group and overall."""

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from simsp.batch_work import TOTAL_TIME_LIMIT_S
from simsp.scenario.work import check_work
from simsp.engine.collectives.ring_plan import COLLECTIVES
from simsp.errors import UserError
from simsp.units import parse_size
from simsp.validation.measurements import Measurement, MeasurementSet, read_measurements
from simsp.validation.quantities import METRICS, UNITS, Job
from simsp.validation.scenarios import scenario_of

BUNDLED = "published.toml"
EXAMPLE = "example.csv"


def data_path(name: str) -> Path:
    """Path of a data file bundled with simsp (simsp/validation/data/)."""
    return Path(str(resources.files("simsp.validation") / "data" / name))


@dataclass(frozen=True)
class Comparison:
    """One row's result: reference and simsp in the row's unit, and the signed error."""

    row: Measurement
    simsp: float

    @property
    def error_pct(self) -> float:
        """100 (simsp / reference - 1)."""
        return 100.0 * (self.simsp / self.row.measured - 1.0)


def check_row(row: Measurement) -> None:
    """Metric, unit and metric-specific fields are consistent."""
    if row.metric not in METRICS:
        raise UserError(row.where, f"unknown metric {row.metric!r} (known: {', '.join(METRICS)})")
    units = UNITS[METRICS[row.metric].dimension]
    if row.unit not in units:
        raise UserError(row.where, f"unit {row.unit!r} does not fit {row.metric} (use one of "
                                   f"{', '.join(units)})")
    if row.baseline and row.metric != "activation_ratio":
        raise UserError(row.where, "baseline only applies to metric activation_ratio")
    wants_busbw = row.metric == "busbw"
    for key, value in (("collective", row.collective), ("size", row.size)):
        if bool(value) != wants_busbw:
            raise UserError(row.where, f"{key} is {'needed' if wants_busbw else 'only for'} "
                                       "metric busbw")
    if wants_busbw and row.collective not in COLLECTIVES:
        raise UserError(row.where, f"collective {row.collective!r} is not one of "
                                   f"{', '.join(COLLECTIVES)}")


def job_of(mset: MeasurementSet, row: Measurement) -> Job:
    """The scenario(s) and inputs simsp needs for `row`."""
    check_row(row)
    scenario = scenario_of(mset, row, row.flags)
    if row.metric == "activation_ratio":
        return Job(scenario, baseline=scenario_of(mset, row, row.baseline))
    if row.metric == "busbw":
        return Job(scenario, collective=row.collective,
                   size_bytes=parse_size(row.size, f"{row.where}: size"))
    return Job(scenario)


def compare(mset: MeasurementSet, row: Measurement) -> Comparison:
    """simsp's value of the row's metric, in the row's unit."""
    job = job_of(mset, row)
    value_si = METRICS[row.metric].evaluate(job)
    return Comparison(row, value_si / UNITS[METRICS[row.metric].dimension][row.unit])


def load_sets(paths: list[str]) -> list[MeasurementSet]:
    """The user's measurement files, or the bundled published set when none is given."""
    return [read_measurements(p) for p in paths] if paths else [read_measurements(data_path(BUNDLED))]


def select_groups(sets: list[MeasurementSet], only: list[str] | None) -> list[tuple]:
    """[(group, title, note, [(set, row)])] in file order, restricted to `only` if given; a
    group whose [groups.NAME] says `default = false` runs only when named in `only`."""
    groups: dict = {}
    for mset in sets:
        for row in mset.rows:
            info = mset.groups.get(row.group, {})
            entry = groups.setdefault(row.group, (row.group, info.get("title", row.group),
                                                  info.get("note", ""), []))
            entry[3].append((mset, row))
    if only:
        unknown = [g for g in only if g not in groups]
        if unknown:
            raise UserError("--only", f"unknown group(s) {', '.join(unknown)} (known: "
                                      f"{', '.join(groups)})")
        return [groups[g] for g in groups if g in only]
    opt_in = {name for mset in sets for name, info in mset.groups.items()
              if isinstance(info, dict) and info.get("default") is False}
    return [entry for name, entry in groups.items() if name not in opt_in]


def check_all(selected: list[tuple], force: bool = False) -> None:
    """Resolve every row's inputs before simulating anything: bad rows fail fast, and each
    row's scenarios pass run's work check (simsp.scenario.work), the whole set the sweep limit
    (simsp.batch_work) unless `force`."""
    total = 0.0
    for *_, rows in selected:
        for mset, row in rows:
            job = job_of(mset, row)
            for sc in (job.scenario, job.baseline):
                if sc is None:
                    continue
                try:
                    check_work(sc, force=force)
                except UserError as exc:
                    raise UserError(row.where, str(exc)) from None
                from simsp.shortcuts.work_counts import row_seconds  # the shortcut check: networkx
                total += row_seconds(sc)
    if total > TOTAL_TIME_LIMIT_S and not force:
        raise UserError("work", f"about {total:.3g} CPU seconds for these rows, above the "
                                f"limit of {TOTAL_TIME_LIMIT_S:g} s (--force to run anyway)")


def summary(comparisons: list[Comparison]) -> dict:
    """Mean and worst |error| (percent) and the worst row's name."""
    errors = [abs(c.error_pct) for c in comparisons]
    worst = max(range(len(errors)), key=errors.__getitem__)
    return {"row_count": len(errors), "mean_abs_error_pct": sum(errors) / len(errors),
            "worst_abs_error_pct": errors[worst], "worst_row": comparisons[worst].row.name}
