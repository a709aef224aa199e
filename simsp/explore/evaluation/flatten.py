"""Metrics of `simsp run --json` as one flat table row, whatever keys the metrics grow.

Scalars stay as they are; a dict becomes `key.sub` columns; a per-stage list becomes
`key_stage{i}` columns (and, for lists of dicts, `key_max.sub` over stages). The per-rank list
becomes per-stage maxima of each numeric rank key (`peak_bytes_stage0`, ..., `peak_bytes_max`).
"""

RANK_IDENTITY = ("rank", "tp", "pp", "dp", "simulated", "oom")


def _is_scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def flatten_value(key: str, value, row: dict) -> None:
    """Write `value` under `key` into `row`, expanding dicts and lists (see module docstring)."""
    if _is_scalar(value):
        row[key] = value
    elif isinstance(value, dict):
        for sub, inner in value.items():
            flatten_value(f"{key}.{sub}", inner, row)
    elif isinstance(value, list):
        stem = key.removesuffix("_per_stage")
        for i, inner in enumerate(value):
            flatten_value(f"{stem}_stage{i}", inner, row)
        if value and all(isinstance(v, dict) for v in value):
            _max_over_stages(stem, value, row)


def _max_over_stages(key: str, stages: list[dict], row: dict) -> None:
    """`key_max.sub`: the largest numeric value of each sub-key over the stages."""
    subs = dict.fromkeys(sub for stage in stages for sub, v in stage.items() if _is_number(v))
    for sub in subs:
        row[f"{key}_max.{sub}"] = max(stage.get(sub, 0.0) for stage in stages)


def stage_maxima(ranks: list[dict]) -> dict:
    """Per pipeline stage, the maximum over its ranks of every numeric rank key."""
    keys = dict.fromkeys(k for r in ranks for k, v in r.items()
                         if k not in RANK_IDENTITY and _is_number(v))
    stages = sorted({r["pp"] for r in ranks})
    row = {}
    for key in keys:
        per_stage = [max(r.get(key, 0) for r in ranks if r["pp"] == pp) for pp in stages]
        row.update({f"{key}_stage{pp}": v for pp, v in zip(stages, per_stage)})
        row[f"{key}_max"] = max(per_stage)
    return row


def flatten_metrics(metrics: dict) -> dict:
    """Every metric as a flat row (the per-rank list summarised per stage)."""
    row = {}
    for key, value in metrics.items():
        if key != "ranks":
            flatten_value(key, value, row)
    row.update(stage_maxima(metrics.get("ranks", [])))
    return row
