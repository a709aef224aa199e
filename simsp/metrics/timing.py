"""Where one iteration's time went: its length, the pipeline bubble, and each stage's time split
by what its program was doing (exposure)."""


def iteration_time(run) -> float:
    """From the first op to the last rank's optimizer step."""
    return max(run.results.end_s.values())


def stage_ranks(run) -> list[int]:
    """One simulated rank per pipeline stage (tp = 0, dp = 0), in stage order."""
    return [run.inputs.rank_of(0, 0, pp) for pp in range(run.inputs.sc.parallel.pp)]


def bubble(run) -> tuple[float, list[float]]:
    """The pipeline bubble as a fraction in [0, 1], defined once from pipeline wait (exposure's
    pp_wait: blocked on a peer stage in fill and drain, plus the idle tail): per stage pp_wait
    over pp_wait plus the stage's schedule work (its steps, from input ready to end), the share
    of its pipeline time the stage sits idle; the pipeline's is all stages' wait over all their
    wait and work. Uniform stages give GPipe's (p−1)/(m+p−1) (Huang et al., arXiv:1811.06965
    §2.2), N21 §2.2.1's ratio t_pb/t_id = (p−1)/m turned into a share (that ratio exceeds 1
    when m < p − 1 or a stage works little, e.g. a last stage of one layer); docs/schedules.md.
    0 at p = 1, where none waits."""
    waits, works = [], []
    for rank, row in zip(stage_ranks(run), exposure(run)):
        waits.append(row["pp_wait"])
        works.append(sum(end - begin for *_, begin, end in run.results.steps.get(rank, [])))
    per_stage = [_share(wait, work) for wait, work in zip(waits, works)]
    return _share(sum(waits), sum(works)), per_stage


def _share(wait: float, work: float) -> float:
    """wait / (wait + work), 0 without work."""
    return wait / (wait + work) if work else 0.0


COMM_KEYS = ("tp_comm", "pp_transfer", "dp_comm", "cp_comm")  # communication proper
EXPOSURE_KEYS = ("compute", "tp_comm", "pp_transfer", "pp_wait", "dp_comm", "optimizer")
CP_KEYS = ("cp_comm",)  # context parallelism's ring exchanges (only where cp > 1)
# only where the run has them: MoE dispatch and combine (docs/moe.md), FP8 delayed scaling's amax
# all-reduces (training/fp8_amax.py)
OPTIONAL_KEYS = ("ep_comm", "fp8_amax")


def exposure(run) -> list[dict]:
    """Per stage, the iteration time split by what its program was doing (sums to it).

    compute: kernels (optimizer excluded); tp_comm, pp_transfer, dp_comm: blocked on that
    communication while data moved; pp_wait: blocked on a peer that had not arrived (pipeline
    fill, bubble, drain), plus the idle tail after the stage's own end; optimizer: Adam step;
    cp_comm (cp > 1 only): blocked on ring attention's K/V and dK/dV exchanges."""
    t_iter, p = iteration_time(run), run.inputs.sc.parallel
    keys = EXPOSURE_KEYS + (CP_KEYS if p.cp > 1 else ()) + \
        (("offload",) if p.cpu_offloading else ())  # training/pipeline/offload.py
    rows = []
    for rank in stage_ranks(run):
        r = run.inputs.world.ranks[rank]
        blocked = r.exposed_s
        row = {key: blocked.get(key, 0.0) for key in keys}
        row["compute"] = sum(r.busy_s.values()) - row["optimizer"]
        row["pp_wait"] += t_iter - run.results.end_s[rank]
        for key in OPTIONAL_KEYS:  # where the run has them
            if key in blocked:
                row[key] = blocked[key]
        rows.append(row)
    return rows
