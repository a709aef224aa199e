"""`simsp layer`: one transformer layer forward then backward on one TP group; bytes, FLOPs, time."""

from dataclasses import replace

from simsp import analytic
from simsp.scenario.work import check_work
from simsp.scenario.config import one_layer_fields
from simsp.hardware.costmodel import calibration_table
from simsp.scenario.flags import add_scenario_arguments
from simsp.scenario.outside import scenario_from_args
from simsp.hardware.constants import cluster_compute, LinkCalibration
from simsp.jsonout import dumps
from simsp.metrics.memory import oom_report
from simsp.model.architecture import architecture
from simsp.units import format_bytes, format_seconds


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("layer", help="one layer, forward then backward, per rank")
    add_scenario_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--ops", action="store_true", help="also list rank 0's kernels: time "
                        "and achieved TFLOP/s or GB/s (docs/attention_kernels.md)")
    parser.set_defaults(handler=run)


def layer_only(sc):
    """The work of `simsp layer`: one layer, one micro-batch (for the bounds estimate)."""
    m, p = sc.model, sc.parallel
    one = replace(m, **one_layer_fields(m))
    return replace(sc, model=one, parallel=replace(p, global_batch_size=p.micro_batch_size,
                                                   data_parallel_size=1,
                                                   pipeline_model_parallel_size=1,
                                                   pipeline_model_parallel_layout=None))


def _comm_by_phase(rank) -> dict:
    """{phase: {collective kind: bytes sent by this rank}}, sorted for stable output."""
    out = {"forward": {}, "backward": {}}
    for (phase, kind), nbytes in sorted(rank.comm_bytes.items()):
        out["backward" if phase == "recompute" else phase].setdefault(kind, 0)
        out["backward" if phase == "recompute" else phase][kind] += nbytes
    return out


def layer_report(result) -> dict:
    """The JSON document of `simsp layer` (keys fixed by issue #2 and #4)."""
    sc = result.scenario
    m, p = sc.model, sc.parallel
    llama = m.llama_layer or p.recompute_modules
    if llama:  # docs/llama.md
        formula = analytic.cp_layer_activation_bytes(m, p, p.recompute_granularity,
                                                     p.recompute_module_set)
    else:
        formula = analytic.layer_activation_bytes(
            m.seq_length, p.micro_batch_size, m.hidden_size, m.num_attention_heads, p.tp,
            p.sequence_parallel, p.recompute_granularity, m.ffn, m.hidden_dropout > 0,
            m.attention_dropout > 0)
    first = result.ranks[0]
    report = {
        "scenario": sc.run.name,
        "mode": sc.run.mode,
        "tensor_model_parallel_size": p.tp,
        "sequence_parallel": p.sequence_parallel,
        "recompute_granularity": p.recompute_granularity,
        "activation_bytes_per_rank": [rec.activation_bytes for rec in result.records],
        "saved_tensors": [{"name": n, "bytes": b} for n, b in result.records[0].saved],
        "formula_bytes": formula,
        "peak_bytes_per_rank": [r.ledger.peak_total for r in result.ranks],
        "oom_per_rank": [oom_report(r.ledger.oom) for r in result.ranks],
        "flops": dict(first.flops),
        "comm_bytes_per_rank": [_comm_by_phase(r) for r in result.ranks],
        "forward_time_s": result.forward_time_s,
        "backward_time_s": result.backward_time_s,
        "cost_model": calibration_table(cluster_compute(sc.cluster)),
        "link_calibration": LinkCalibration.from_cluster(sc.cluster).describe(),
    }
    if result.max_rel_err is not None:
        report["max_rel_err"] = result.max_rel_err
    if llama:  # the GPT layer's document stays as it was
        source = "docs/mla.md" if m.multi_latent_attention else "docs/llama.md"
        report.update(formula=source, architecture=architecture(m))
    if p.recompute_granularity == "selective" and p.recompute_modules is not None:
        report["recompute_modules"] = " ".join(p.recompute_modules.split())  # Megatron's names
    return report


def kernel_rows(log: list) -> list:
    """Rank 0's kernels as rows: name, phase, kind, seconds and the achieved TFLOP/s (FLOPs
    over time) or GB/s (bytes over time) of each."""
    rows = []
    for name, phase, kind, flops, nbytes, seconds in log:
        row = {"name": name, "phase": phase, "kind": kind, "seconds": seconds}
        if flops and seconds:
            row["TFLOPs"] = flops / seconds / 1e12
        elif nbytes and seconds:
            row["GBps"] = nbytes / seconds / 1e9
        rows.append(row)
    return rows


def _print_ops(rows: list) -> None:
    print(f"{'kernel (rank 0)':<34}{'phase':<10}{'time':>12}{'achieved':>18}")
    for row in rows:
        rate = (f"{row['TFLOPs']:.1f} TFLOP/s" if "TFLOPs" in row else
                f"{row['GBps']:.0f} GB/s" if "GBps" in row else "")
        print(f"{row['name']:<34}{row['phase']:<10}{format_seconds(row['seconds']):>12}"
              f"{rate:>18}")


def _print_table(report: dict) -> None:
    print(f"layer: t={report['tensor_model_parallel_size']} SP={report['sequence_parallel']} "
          f"recompute={report['recompute_granularity']}"
          + (f" ({report['recompute_modules']})" if "recompute_modules" in report else "")
          + f" mode={report['mode']}")
    if "architecture" in report:
        print(f"architecture: {report['architecture']}")
    print(f"{'saved tensor (rank 0)':<28}{'bytes':>14}")
    for item in report["saved_tensors"]:
        print(f"{item['name']:<28}{item['bytes']:>14}")
    measured = report["activation_bytes_per_rank"][0]
    print(f"{'activations (ledger)':<28}{measured:>14}  {format_bytes(measured)}")
    source = report.get("formula", "K22 Table 2")
    print(f"{'formula (' + source + ')':<28}{report['formula_bytes']:>14}")
    print(f"peak per rank: {', '.join(format_bytes(b) for b in report['peak_bytes_per_rank'])}")
    flops = report["flops"]
    print(f"GEMM FLOPs rank 0: forward {flops['forward']:.4g}, backward {flops['backward']:.4g}, "
          f"recompute {flops['recompute']:.4g}")
    for phase, kinds in report["comm_bytes_per_rank"][0].items():
        for kind, nbytes in kinds.items():
            print(f"comm rank 0 {phase:<9}{kind:<24}{nbytes:>14}")
    print(f"forward {format_seconds(report['forward_time_s'])}, "
          f"backward {format_seconds(report['backward_time_s'])}")
    if "max_rel_err" in report:
        print(f"max relative error vs single-device reference: {report['max_rel_err']:.3e}")


def run(args) -> int:
    from simsp.training.driver.layer_sim import simulate_layer  # not when the CLI is built
    sc = scenario_from_args(args)
    check_work(layer_only(sc), force=args.force)
    result = simulate_layer(sc, log_kernels=args.ops)
    report = layer_report(result)
    if args.ops:
        report["ops"] = kernel_rows(result.ranks[0].kernel_log)
    if args.json:
        print(dumps(report, indent=2))
    else:
        _print_table(report)
        if args.ops:
            _print_ops(report["ops"])
    return 0
