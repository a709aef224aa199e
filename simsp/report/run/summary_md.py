"""The human report of `simsp run`: Markdown built from the metrics dict alone.

The same text is printed to stdout and written to summary.md. Units: memory in GiB with two
decimals (MiB when every figure is below 1 GiB, as for the numeric toy models), times through
units.format_seconds (three decimals in s, ms or us), percentages with one decimal.
"""

from pathlib import Path

from simsp.version import __version__
from simsp.engine.memory import HELD_FOR_WGRAD
from simsp.io_out import markdown_code, markdown_text, write_file
from simsp.metrics.layout import layout
from simsp.report.run.overlap_summary import overlap_lines
from simsp.report.run.in_network import in_network_lines
from simsp.report.run.glossary import glossary
from simsp.report.run.markdown import memory_unit, pct, plural, seconds, table
from simsp.report.run.memory_summary import (
    allocator_section, oom_categories, oom_section, switch_section)
from simsp.report.run.shown_categories import report_categories
from simsp.units import format_bytes

MEMORY_COLUMNS = (("weights", "weights"), ("gradients", "gradients"),
                  ("optimizer", "optimizer"), ("activations", "activations (peak)"),
                  ("temporaries", "temporaries"), ("held_for_wgrad", "held for wgrad"),
                  ("communication", "communication"))
COMM_TRACKS = (("compute", "compute"), ("tp_comm", "TP comm exposed"),
               ("pp_transfer", "pipeline transfer exposed"), ("pp_wait", "pipeline wait"),
               ("dp_comm", "DP comm exposed"), ("optimizer", "optimizer"),
               ("cp_comm", "CP comm exposed"), ("ep_comm", "EP comm exposed"),
               ("fp8_amax", "FP8 amax reduction exposed"))


def stage_rows(metrics: dict) -> list[dict]:
    """The rank with tp = 0, dp = 0 of each pipeline stage, in stage order."""
    rows = [r for r in metrics["ranks"] if r["tp"] == 0 and r["dp"] == 0]
    return sorted(rows, key=lambda r: r["pp"])


def run_label(sc) -> str:
    """variant_label of a scenario before its metrics exist (the same words)."""
    return variant_label({"scenario": sc.run.name, "layout": layout(sc)})


def variant_label(m: dict) -> str:
    """The scenario and its layout in a few words, naming the variant in titles."""
    lay = m["layout"]
    sp = "SP" if lay["sequence_parallel"] else "no SP"
    return (f"{m['scenario']} (t={lay['t']} p={lay['p']} d={lay['d']}, {sp}, recompute "
            f"{lay['recompute']}, b={lay['micro_batch']})")


# ---------------------------------------------------------------- sections

def _provenance(m: dict) -> list[str]:
    """Which simsp made the report, and with what command."""
    command = m.get("command")
    return [f"Made by simsp {__version__}"
            + (f" with {markdown_code(command)}." if command else "."), ""]


def _header(m: dict) -> list[str]:
    """The title, then the layout, the model (its architecture, its hardware) a line each."""
    lay = m["layout"]
    sp = "SP" if lay["sequence_parallel"] else "no SP"
    extra = ", distributed optimizer" if lay.get("distributed_optimizer") else ""
    sizes = "x".join(lay.get("hierarchical_context_parallel_sizes", "").split())
    cp = (f" cp={lay['cp']} ({lay['cp_comm_type']}{' ' + sizes if sizes else ''})"
          if "cp" in lay else "")  # cp > 1 only
    return [
        f"# simsp run: {markdown_text(m['scenario'])} ({m['mode']} mode)", "",
        f"Layout: t={lay['t']}{cp} p={lay['p']} d={lay['d']} on {lay['gpus']} GPUs "
        f"({plural(lay['nodes'], 'node')}), {sp}, recompute {lay['recompute']}{_modules(lay)}, "
        f"schedule {lay['schedule']}{_stage_layers(lay)}, micro-batch {lay['micro_batch']}, "
        f"global batch "
        f"{lay['global_batch']} ({plural(lay['micro_batches'], 'micro-batch')} per data-parallel "
        f"replica){extra}.",
        f"Model: L={lay['layers']} h={lay['hidden']} a={lay['heads']} s={lay['seq']} "
        f"v={lay['vocab']}.", *_architecture(m), *_parameters(m), *_hardware_line(lay), ""]


def _stage_layers(lay: dict) -> str:
    """An uneven split's layers per stage, e.g. " (layers per stage 15 + 16 x 6 + 15)"
    (docs/llama.md)."""
    if "stage_layers" not in lay:
        return ""
    runs = [[n, 1] for n in lay["stage_layers"][:1]]
    for n in lay["stage_layers"][1:]:
        if n == runs[-1][0]:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    words = " + ".join(f"{n} x {k}" if k > 1 else f"{n}" for n, k in runs)
    given = f", layout {markdown_code(lay['pipeline_layout'])}" if "pipeline_layout" in lay else ""
    return f" (layers per stage {words}{given})"


def _modules(lay: dict) -> str:
    """Selective recompute's --recompute-modules when given, e.g. " (mlp)"."""
    return f" ({lay['recompute_modules']})" if "recompute_modules" in lay else ""


def _architecture(m: dict) -> list[str]:
    """The Llama-class variant in words (none for K22's GPT layer)."""
    if "architecture" not in m:
        return []
    return [f"Architecture: {m['architecture']}; model FLOPs by {m['flops_formula']}."]


def _parameters(m: dict) -> list[str]:
    """Total parameters of every model, and active per token where routed experts make them
    differ (simsp/model/param_counts.py); none in metrics from before they were counted."""
    if "parameters" not in m:
        return []
    n = m["parameters"]
    mtp = (f"; multi-token prediction {_billions(n['mtp']['total'])} more "
           f"({_billions(n['mtp']['active'])} active), sharing them" if "mtp" in n else "")
    active = (f", {_billions(n['active'])} active per token "
              f"({100 * n['active'] / n['total']:.1f}%)" if n["active"] != n["total"]
              else " (all active per token)")
    return [f"Parameters: {_billions(n['total'])} total{active}, embedding and output layer "
            f"{_billions(n['embedding'])}{mtp}."]


def _billions(n: int) -> str:
    """`8.03B`, or the exact count below ten million (a small test model's)."""
    return f"{n / 1e9:.2f}B" if n >= 10**7 else f"{n:,}"


def _layer_doc(m: dict) -> str:
    """The document of the layer's closed form: docs/mla.md for multi-latent attention."""
    return "docs/mla.md" if m.get("architecture", "").startswith("MLA") else "docs/llama.md"


def _hardware_line(lay: dict) -> list[str]:
    """GPU, system and FP8, when not the default A100 in BF16 (docs/hardware.md)."""
    if "gpu" not in lay:
        return []
    return [f"Hardware: {lay['gpu']}" + (f" in {lay['system']}" if lay["system"] else "")
            + (f", FP8 {lay['fp8']}" if lay["fp8"] else ", BF16") + "."]


def _verdict(m: dict) -> list[str]:
    """Out of memory: the verdict, its cause and the switches that fit, before any table."""
    explanation = m.get("oom_explanation")
    if not m["oom"] or not explanation:
        return []
    stages = stage_rows(m)
    failing = [r for r in stages if r["oom"]]
    cause = next(iter(explanation["stages"][0]["in_use_by_category_bytes"]))
    fits = [f"{s['switch']} (`{s['flags']}`: peak {format_bytes(s['peak_bytes'])}, "
            f"iteration {seconds(s['iteration_time_s'])})"
            for s in explanation["switches"] if s.get("fits")]
    return [f"**Out of memory** on {len(failing)} of {len(stages)} pipeline stages; the largest "
            f"category when the first allocation failed: **{cause}**. "
            + ("Switches that fit, each verified by its own simulated iteration: "
               + "; ".join(fits) + "." if fits else "None of the switches tried fits alone."),
            ""]


def _performance(m: dict) -> list[str]:
    """Iteration time, tokens/s, MFU and HFU (both counts), bubble, exposed communication, loss
    and the out-of-memory verdict as a table."""
    source = "Megatron" if "flops_formula" in m else "K22"
    rows = [["iteration time", seconds(m["iteration_time_s"])],
            ["tokens/s", f"{m['tokens_per_s']:,.0f}"],
            [f"MFU ({source} model FLOPs)", pct(m["mfu"])],
            [f"HFU ({source} hardware FLOPs)", pct(m["hfu"])],
            ["MFU (counted FLOPs)", pct(m["mfu_counted"])],
            ["HFU (counted FLOPs)", pct(m["hfu_counted"])],
            [f"model FLOPs ({source} / counted)",
             f"{m['model_flops']:.4g} / {m['counted_model_flops']:.4g}"],
            [f"hardware FLOPs ({source} / counted)",
             f"{m['hardware_flops']:.4g} / {m['counted_hardware_flops']:.4g}"],
            ["bubble fraction", pct(m["bubble_fraction"])],
            ["exposed communication (worst stage, excl. pipeline wait)",
             seconds(m["exposed_comm_s"])]]
    if m.get("loss") is not None:
        rows.append(["loss", f"{m['loss']:.6f}"])
    rows.append(["out of memory", "**yes**" if m["oom"] else "no"])
    return ["## Performance", "", *table(["metric", "value"], rows), "", _mfu_to_quote(m, source),
            ""]


def _mfu_to_quote(m: dict, source: str) -> str:
    """Which of the two MFUs to quote, and why the other differs (glossary "MFU to quote")."""
    quote = (f"MFU to quote: {pct(m['mfu'])}, by the {source} formula, as Megatron-LM logs it "
             "and papers report it, so it compares with them.")
    if abs(m["mfu_counted"] - m["mfu"]) < 5e-4:  # the same to the 0.1% shown
        return quote + " The FLOPs simsp's GEMMs counted give the same here."
    return quote + (f" The counted MFU ({pct(m['mfu_counted'])}) divides the FLOPs of the GEMMs "
                    "simsp ran instead: lower where the kernels skip work the formula counts (a "
                    "causal FlashAttention kernel skips the masked half of the s × s attention "
                    "scores, most at long context), higher where they run work it leaves out; "
                    "it says how much of peak the kernels' own work used.")


def _stages(m: dict, stages: list[dict]) -> list[str]:
    """Per stage: its rank, bubble fraction and exposed seconds by track."""
    exposed = m.get("exposed_s_per_stage") or m["exposed_comm_s_per_stage"]
    keys = {k for e in exposed for k in e}
    tracks = [(k, n) for k, n in COMM_TRACKS if k in keys]
    tracks += [(k, k) for k in sorted(keys - {k for k, _ in COMM_TRACKS})]
    header = ["stage", "rank", "bubble"] + [name for _, name in tracks]
    rows = []
    for stage, (bubble, e) in enumerate(zip(m["bubble_fraction_per_stage"], exposed)):
        rank = next((r["rank"] for r in stages  # the stage's cp = 0 rank (its exposure's)
                     if r["pp"] == stage and r.get("cp", 0) == 0), "?")
        rows.append([str(stage), str(rank), pct(bubble)]
                    + [seconds(e.get(k, 0.0)) for k, _ in tracks])
    return ["## Pipeline stages: bubble and where the iteration time went", "",
            *table(header, rows), ""]


def _memory(m: dict, stages: list[dict]) -> list[str]:
    """Per stage: peak bytes by category and the out-of-memory verdict; held for wgrad only
    where the run holds some (shown_categories.py)."""
    shown = report_categories(m)
    columns = [(c, name) for c, name in MEMORY_COLUMNS if c in shown]
    unit, scale = memory_unit(stages)
    header = ["stage", "rank"] + [f"{name} ({unit})" for _, name in columns]
    header += [f"peak total ({unit})", "verdict"]
    rows = []
    for r in stages:
        peaks = r["peak_by_category_bytes"]
        cells = [f"{peaks.get(c, 0) / scale:.2f}" for c, _ in columns]
        verdict = "**OOM**" if r["oom"] else "fits"
        rows.append([str(r["pp"]), str(r["rank"]), *cells, f"{r['peak_bytes'] / scale:.2f}",
                     verdict])
    held = (" Held for wgrad: the linear inputs and output gradients a split backward's B keeps "
            "for its deferred W step (zero-bubble, DualPipe, --delay-wgrad-compute)."
            if HELD_FOR_WGRAD in shown else "")
    lines = ["## Memory per pipeline stage (rank tp 0, dp 0)", "",
             "Each category's own peak; the peak total is the highest sum at one moment." + held,
             "",
             *table(header, rows, left=(len(header) - 1,)), ""]
    failing = [r for r in stages if r["oom"]]
    if failing:
        explained = {s["stage"]: s for s in (m.get("oom_explanation") or {}).get("stages", [])}
        lines += oom_section(failing[0]) + oom_categories(failing, explained, shown)
    return lines + switch_section(m.get("oom_explanation"))


def _activations(m: dict, stages: list[dict]) -> list[str]:
    """Stage 0's activation peak measured against its closed form."""
    formula = m["first_stage_activation_formula_bytes"]
    measured = stages[0]["activation_peak_bytes"]
    diff = f"{(measured - formula) / formula * 100:+.1f}%" if formula else "n/a"
    source = f"{_layer_doc(m)} per layer, K22 §4.2.3" if "architecture" in m else "K22 §4.2.3"
    rows = [[f"formula ({source})", format_bytes(formula), f"{formula:,.0f}"],
            ["measured (ledger, stage 0 activation peak)", format_bytes(measured),
             f"{measured:,}"],
            ["difference (measured vs formula)", diff, ""]]
    return ["## First-stage activation memory", "",
            *table(["", "size", "bytes"], rows), ""]


def _layer_tensors(m: dict) -> list[str]:
    """Llama-class runs: what one layer keeps, tensor by tensor, and the closed form."""
    if "layer_tensors" not in m:
        return []
    lt = m["layer_tensors"]
    rows = [[item["name"], format_bytes(item["bytes"]), f"{item['bytes']:,}"]
            for item in sorted(lt["saved"], key=lambda i: -i["bytes"])]
    rows += [["total (ledger)", format_bytes(lt["measured_bytes"]), f"{lt['measured_bytes']:,}"],
             [f"closed form ({_layer_doc(m)})", format_bytes(lt["formula_bytes"]),
              f"{lt['formula_bytes']:,}"]]
    return ["## One layer's kept tensors (rank 0, largest first)", "",
            *table(["tensor", "size", "bytes"], rows), ""]


def _value(v) -> str:
    """A calibration constant as text (floats as %g)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def _calibration(m: dict) -> list[str]:
    """The cost model's and links' constants the run used, as tables."""
    lines = ["## Calibration constants", ""]
    rows = []
    for group, values in m.get("calibration", {}).items():
        if isinstance(values, dict):
            rows += [[group, f"`{k}`", _value(v)] for k, v in values.items()]
        else:
            rows.append([group, "", f"`{values}`"])
    lines += table(["group", "constant", "value"], rows, right_from=2) if rows else ["(none)"]
    shortcuts = m.get("shortcuts", {})
    used = [k for k, v in shortcuts.items() if v]
    lines += ["", "## Shortcuts", "",
              "Used: " + (", ".join(used) if used else "none (full simulation)") + "."
              + (f" Not used: {', '.join(k for k, v in shortcuts.items() if not v)}."
                 if used and len(used) < len(shortcuts) else ""), ""]
    reasons = m.get("shortcuts_used", {})
    if any(not why.startswith("used: ") or "where exact" in why for why in reasons.values()):
        lines += [f"- {name}: {why}" for name, why in reasons.items()] + [""]
    return lines


# ---------------------------------------------------------------- entry points

def _expert_load(metrics: dict) -> list[str]:
    """MoE models: the slowest expert rank, the dropped tokens, the dispatched bytes (forward,
    per rank: docs/moe.md); nothing for a dense model."""
    moe = metrics.get("moe")
    if not moe:
        return []
    sent = moe["dispatched_bytes_per_rank"]
    header = ["slowest expert rank", "its rows", "mean rows", "imbalance", "routed pairs",
              "dropped", "padding rows", "dispatched per rank (max)"]
    row = [str(moe["slowest_expert_rank"]), str(moe["slowest_expert_rows"]),
           f"{moe['mean_expert_rows']:.1f}", f"{moe['expert_load_imbalance']:.3f}x",
           str(moe["routed_pairs"]), f"{moe['dropped_pairs']} ({pct(moe['dropped_fraction'])})",
           str(moe["padding_rows"]), format_bytes(max(sent.values(), default=0))]
    return ["## Mixture of experts: expert load (forward, whole iteration)", "",
            *table(header, [row]), ""]


def summary_text(metrics: dict) -> str:
    """The Markdown report of one run's metrics (what `simsp run` prints)."""
    stages = stage_rows(metrics)
    lines = (_header(metrics) + _provenance(metrics) + _verdict(metrics) + _performance(metrics) + _stages(metrics, stages)
             + overlap_lines(metrics) + in_network_lines(metrics)
             + _expert_load(metrics)
             + _memory(metrics, stages) + allocator_section(metrics) + _activations(metrics, stages) + _layer_tensors(metrics)
             + _sharding(metrics) + _calibration(metrics))
    return "\n".join(lines).rstrip("\n") + "\n"


def _sharding(metrics: dict) -> list[str]:
    """The FSDP and activation-offload sections, from their module only when the run has one."""
    if not (metrics.get("fsdp") or metrics.get("offload")):
        return []
    from simsp.report.run.fsdp_summary import fsdp_lines, offload_lines
    return fsdp_lines(metrics) + offload_lines(metrics)


def figure_links(figures: list[tuple[str, str]]) -> list[str]:
    """[(file name, caption)] -> a Figures section of linked PNGs."""
    if not figures:
        return []
    lines = ["## Figures", ""]
    for name, caption in figures:
        lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    return lines


def glossary_lines(metrics: dict) -> list[str]:
    """The glossary as a Markdown definition list (bold term, then its meaning), the terms of
    the categories the report shows (glossary.glossary)."""
    lines = ["## Glossary", ""]
    for term, meaning in glossary(report_categories(metrics)):
        lines += [f"**{term}**: {meaning}", ""]
    return lines


def summary_document(metrics: dict, figures: list[tuple[str, str]] = ()) -> str:
    """summary.md: the summary, the figures as linked PNGs, and the glossary."""
    text = summary_text(metrics).rstrip("\n").split("\n")
    lines = text + [""] + figure_links(list(figures)) + glossary_lines(metrics)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_summary(metrics: dict, path, figures: list[tuple[str, str]] = ()) -> Path:
    """Write summary_document(metrics, figures) to `path` and return the path."""
    path = Path(path)
    write_file(path, summary_document(metrics, figures))
    return path
