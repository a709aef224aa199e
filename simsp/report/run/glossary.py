"""Every term the run report uses, defined once in plain words (with its source)."""

HELD_FOR_WGRAD_TERM = "held for wgrad (held_for_wgrad)"

GLOSSARY = (
    ("TP (tensor parallelism)", "Each layer's weight matrices are split over t GPUs of one "
     "node; every layer then needs collectives (all-reduce, or all-gather + reduce-scatter with "
     "SP) to combine partial results (Megatron-LM, K22 §2)."),
    ("SP (sequence parallelism)", "Inside a TP group, the layer-norm and dropout regions are "
     "split along the sequence, so their activations are stored once over t GPUs instead of t "
     "times; each TP all-reduce becomes an all-gather (g) plus a reduce-scatter (g-bar) of the "
     "same bytes (K22 §4.2.2)."),
    ("PP (pipeline parallelism)", "The layers are cut into p consecutive stages on different "
     "GPUs; micro-batches flow through them (N21 §2.2)."),
    ("DP (data parallelism)", "d replicas of the whole model each take a share of the batch and "
     "average their gradients with an all-reduce; d = GPUs / (t·p)."),
    ("micro-batch", "The b sequences that go through the pipeline together; a global batch of "
     "B sequences is m = B / (b·d) micro-batches per replica."),
    ("schedule (1F1B, interleaved, zero-bubble)", "The order in which each stage runs forward "
     "(F) and backward (B) steps; interleaving gives each GPU several model chunks (virtual "
     "stages) to shrink the bubble (N21 §2.2). The zero-bubble schedules (ZB-H1, ZB-H2, ZB-V) "
     "split the backward into B, the input gradients the previous stage waits for, and W, the "
     "weight gradients, run where the stage would idle (arXiv:2401.10241); ZB-V and DualPipeV "
     "hold two chunks per stage as a V (docs/dualpipe.md). The schedule figure draws F blue, "
     "B green, W brown, DualPipe's F&B pairs pink, waits grey; the trace colours its schedule "
     "steps the same way (docs/schedules.md)."),
    ("bubble", "The share of a stage's pipeline time spent waiting on peer stages (fill, "
     "drain, the idle tail): its wait over its wait plus its schedule's work (its forward and "
     "backward steps), a fraction in [0, 1]; (p−1)/(m+p−1) for uniform 1F1B stages (GPipe, "
     "arXiv:1811.06965); the pipeline's is all stages' wait over all their wait and work; 0 "
     "with one stage (docs/schedules.md)."),
    ("activation", "A tensor saved in the forward pass for use in the backward pass; activation "
     "memory grows with the micro-batches in flight (K22 §4)."),
    ("recompute", "Saving fewer activations and recomputing them in the backward pass. "
     "Selective recompute redoes only the attention softmax part (cheap, large); full recompute "
     "keeps only each layer's input and reruns the whole layer forward (K22 §5)."),
    ("distributed optimizer", "The fp32 master weights and Adam moments are sharded over the "
     "data-parallel replicas (Megatron-LM --use-distributed-optimizer, like ZeRO-1)."),
    ("weights, gradients, optimizer", "Memory categories: 16-bit weights (2 bytes/parameter) "
     "and gradients, and the optimizer's fp32 master copy and two Adam moments (12 "
     "bytes/parameter)."),
    ("temporaries, communication", "Short-lived buffers inside one op, and the buffers a "
     "collective or pipeline transfer holds while it runs."),
    (HELD_FOR_WGRAD_TERM, "What a split backward's B step keeps for the W step "
     "it defers (ZB-H1, ZB-V, DualPipe, DualPipeV; --delay-wgrad-compute): each linear's input "
     "and output gradient, from B until W has run its weight-gradient GEMM; 0 under 1F1B, "
     "whose backward is whole (docs/schedules.md)."),
    ("peak, capacity, out of memory", "The highest total of the categories at one moment, the "
     "GPU's memory (80 GiB for A100-SXM4-80GB), and a run whose peak goes above it."),
    ("MFU (model FLOPs utilisation)", "Model FLOPs per iteration (no recompute counted) over "
     "iteration time × GPUs × peak 312 TFLOP/s (K22 §6.3, App. A)."),
    ("HFU (hardware FLOPs utilisation)", "Like MFU, but counting the FLOPs of recomputation "
     "too: what the hardware actually executed (K22 §6.3)."),
    ("counted FLOPs", "FLOPs of the GEMMs the simulation ran, beside the K22 closed forms; a "
     "causal FlashAttention kernel computes only the unmasked tiles of the s × s scores (about "
     "half), which the formulas count whole."),
    ("MFU to quote", "The MFU by the formula (K22, or Megatron-LM's count for Llama-class and "
     "MoE models): Megatron-LM logs it and papers report it, so it compares with them. The "
     "counted MFU is lower where the kernels skip work the formula counts (causal attention, "
     "most at long context): it says how much of peak the kernels' own work used."),
    ("parameters", "Every weight of the model counted from the shapes it allocates, the "
     "embedding and output layer included; for MoE models also the active ones, those one "
     "token's forward touches (its top-k routed experts of E)."),
    ("exposed communication", "Time a GPU waited for communication that no computation hid "
     "(by track: TP, pipeline, DP)."),
    ("pipeline wait", "Time a stage was blocked on a peer stage that had not arrived (pipeline "
     "fill, bubble, drain, the tied-embedding reduction's wait) plus its idle tail after its "
     "own end: the bubble in seconds."),
    ("all-reduce, reduce-scatter, all-gather", "NCCL collectives. Ring all-reduce = "
     "reduce-scatter then all-gather: 2(n−1) steps of S/n bytes "
     "(NVIDIA/nccl-tests doc/PERFORMANCE.md)."),
    ("calibration", "The achieved fractions of peak (GEMM efficiency, link efficiency) and "
     "latencies the cost model uses; reported with every result."),
    ("shortcuts", "Meta-mode speed-ups (one simulated rank per stage, closed-form collective "
     "time, replayed layer templates), each taken only where the layout's links keep it exact; "
     "the report says which were used and why."),
)


def glossary(categories: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """GLOSSARY, less the held-for-wgrad term where the report's memory `categories`
    (shown_categories.py) leave that category out."""
    held = "held_for_wgrad" in categories
    return tuple(entry for entry in GLOSSARY if held or entry[0] != HELD_FOR_WGRAD_TERM)
