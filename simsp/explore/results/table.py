"""The results table: one row per configuration, in configuration order, as a DataFrame and as
results.csv / results.jsonl (byte-identical whatever executor produced the rows)."""

from pathlib import Path

import pandas as pd

from simsp.explore.configs.run_line import run_command
from simsp.explore.configs.grid import Config
from simsp.io_out import write_file
from simsp.jsonout import dumps
from simsp.explore.configs.fields import all_fields, spell


def changes_from_first(config: Config, first: Config) -> str:
    """The flags that turn the first configuration into this one (`--sequence-parallel ...`)."""
    mine, theirs = config.overrides(), first.overrides()
    spelled = [spell(f, mine[f.path]) for f in all_fields()
               if f.path != ("run", "name") and mine[f.path] != theirs[f.path]]
    return " ".join(spelled)


def gpus_of(config: Config) -> int:
    """GPUs the configuration uses: t·cp·p·d."""
    values = config.overrides()
    try:
        return (values[("parallel", "tensor_model_parallel_size")]
                * values.get(("parallel", "context_parallel_size"), 1)
                * values[("parallel", "pipeline_model_parallel_size")]
                * values[("parallel", "data_parallel_size")])
    except TypeError:  # a non-numeric size: the row carries its error
        return None


def table_row(index: int, config: Config, first: Config, result: dict) -> dict:
    """Identity, GPUs, every configuration field, the flags that differ from the first, what
    deriving d from the GPUs did, the results."""
    row = {"index": index, "variant": config.name, "gpus": gpus_of(config),
           "command": run_command(config.overrides(), config.source),
           "changes": changes_from_first(config, first), "note": config.note}
    row.update({key: value for (_, key), value in config.values})
    row.update(result)
    return row


def results_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows (already in configuration order) as a DataFrame; columns in first-seen order."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return pd.DataFrame(rows, columns=columns)


def write_results(rows: list[dict], frame: pd.DataFrame, out: str | Path) -> list[Path]:
    """results.csv (every column) and results.jsonl (each row's own keys) under `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, jsonl_path = out / "results.csv", out / "results.jsonl"
    write_file(csv_path, frame.to_csv(index=False, lineterminator="\n"))
    write_file(jsonl_path, "".join(dumps(row) + "\n" for row in rows))  # strict JSON
    return [csv_path, jsonl_path]
