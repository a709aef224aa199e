"""The work estimate's constants (simsp/scenario/work.py): CPU seconds and bytes of simsp's own
code per counted unit, each measured by benchmarks/estimate_constants.py in one pass on one
machine (its speed probe, benchmarks/speed.py probe_ms, named below), and the limits.

Re-measure on another machine with `python benchmarks/estimate_constants.py` (docs/PERFORMANCE.md).
"""

from simsp.units import GiB

# Work limits (measured with benchmarks/work_estimate.py on this 2-core machine).
# Measured again on today's engine: 0.03-0.08 ms per layer-step for d = 1..64 at 175B width
# (0.18 ms on a 192-step run, where the start dominates) and 0.57 ms at d = 512; without
# shortcuts 1.7 ms per rank-step at t = 8 and 3.4 ms at t = 64; numeric 15 ms per rank-step at
# tiny shapes and about 3e9 FLOP/s at h = 256.
META_SECONDS_PER_LAYER_STEP = 0.1e-3  # meta mode, all shortcuts: one layer fwd+bwd, one stage
META_SECONDS_PER_LAYER_STEP_PER_REPLICA = 1e-6  # the growth with d measured above
FULL_SECONDS_PER_RANK_STEP = 2e-3  # --no-shortcuts: per simulated rank
NUMERIC_FLOPS_PER_SECOND = 2e9  # numpy float64 GEMMs on one core, with simsp's op overhead
NUMERIC_SECONDS_PER_LAYER_STEP = 15e-3  # numeric mode's per-op overhead per rank, tiny shapes
# Meta mode keeps its ledger and trace: the 1T scenario (65,536 layer-steps) peaks at 526 MB
# RSS, 476 MB above the interpreter with simsp imported: 7.3 KiB per layer-step.
META_BYTES_PER_LAYER_STEP = 10 * 1024
# Terms the per-layer-step cost misses, measured by benchmarks/work_estimate.py --terms:
# each simulated rank builds its plan from every layer's parameter names (training/pipeline/plan.py
# stage_param_names: L=p=1024, one micro-batch: 7 s, 1.5 GB); without shortcuts a rank-step
# costs more the more ranks its TP ring has (1.7 ms at t = 8, 3.4 ms at t = 64); one collective
# per data-parallel gradient bucket (--ddp-bucket-size with --overlap-grad-reduce).
PLAN_SECONDS_PER_RANK_LAYER = 8e-6
PLAN_BYTES_PER_RANK_LAYER = 1536
FULL_SECONDS_PER_RING_RANK = 3e-5  # --no-shortcuts: per rank-step, per rank of the TP ring
SECONDS_PER_BUCKET = 1e-4  # per simulated rank and bucket
# FSDP (docs/fsdp.md): its DP rings run step by step; measured on Llama 3 8B under FSDP2 at
# d = 16, 32, 64 (one micro-batch): 1.2e-4 to 1.3e-4 CPU s per collective per d².
FSDP_SECONDS_PER_COLLECTIVE_D2 = 1.3e-4
# Where the verdict is known its stepped FSDP rings' flows are counted instead
# (shortcuts/work_counts.py): measured by benchmarks/scale.py llama3.1-405b-fsdp (TP 8, PP 16,
# d 16 one DP member per node, the DP rings meeting the pipeline sends on the NICs) at 2,048
# GPUs, 64.6 CPU s for 1,461,696 flows (2026-11-29, loaded 2-core machine): 4.4e-5 s per flow,
# less than SECONDS_PER_FLOW's rings since one channel's flows start and end together.
FSDP_SECONDS_PER_FLOW = 4.4e-5
# An FSDP ring run as one node's piece (docs/shortcuts.md) starts m positions x (d - 1) flows
# per collective: measured by the same family once its rings of one member per node ran as
# pieces, 14.0 / 22.0 / 38.3 / 75.7 CPU s for 93,246 / 190,558 / 385,182 / 774,430 flows at
# 2,048 / 4,096 / 8,192 / 16,384 GPUs (2026-11-29, loaded 2-core machine): 1e-4 to 1.5e-4 s
# per flow with the check's per-unit pieces. Since each piece and its ring's closed-form stats
# are worked out once per collective, group and size (engine/communicator.py _segment): 5.92 /
# 28.70 CPU s for 93,246 / 774,430 flows at 2,048 / 16,384 GPUs (2026-11-29, loaded machine),
# 3.6e-5 to 6.1e-5 s per flow beside the other terms.
PIECE_SECONDS_PER_FLOW = 4.5e-5
# A piece of one member per node runs its steps in arithmetic while only pieces use its NIC
# (engine/collectives/step_trains.py): measured by the same family, 1.87 and 5.70 CPU s at
# 2,048 and 16,384 GPUs for 6,048 such collectives of 90,720 and 768,096 steps (2026-11-29,
# loaded 2-core machine), 1.47 and 5.10 s beside the other terms: 5.4e-6 s per step (the
# check's routes over the world, which grow alike, included) and 1.6e-4 s per collective.
TRAIN_SECONDS_PER_STEP = 5.4e-6
TRAIN_SECONDS_PER_COLLECTIVE = 1.6e-4
# A DP ring that meets only its own collectives runs as one node's piece of one channel
# (docs/shortcuts.md): G positions x 2(d - 1) steps; measured on the same runs at d = 64 and
# 256 (0.95 and 3.4 CPU s in all), and again by benchmarks/scale.py fsdp2-d64 (8 layers, d 16
# to 64: 0.17 to 0.76 CPU s, 2026-11-28, loaded machine): about 4e-5 s per collective per d·G.
FSDP_SECONDS_PER_COLLECTIVE_PIECE = 4e-5
# Context parallelism's ring (p2p) and Ulysses all-to-all (a2a) pass a block between every pair
# of a CP group's ranks per layer-step, each a transfer on the links: measured (a 2-layer model,
# s 4096, cp 32 to 128, t 1-2, d 1-2, benchmarks/work_estimate.py --terms) 0.8e-4 to 1.2e-4 CPU s
# per layer-step per t·d·cp²; cp 128 alone took 4.4 s against the 0.5 s the linear terms gave.
CP_SECONDS_PER_RANK_PAIR = 1e-4
# p2p rings alone on their links (context_parallel/lone_ring.py) where TP rank 0's CP ranks run:
# scale.py cp-128k (320 layer-steps; 3.57 / 9.28 CPU s at cp 8 / 16 less the start, 2026-11-29,
# 2 shared cores) fit a·cp + b·cp², a = 8.8e-4 s a layer-step per CP rank (TP in closed form),
# b = 5.6e-5 to 6.8e-5 per CP pair (every send a flow: 9e-5).
CP_SECONDS_PER_RANK_STEP, CP_LONE_SECONDS_PER_RANK_PAIR = 8.8e-4, 7e-5
# Context parallelism's all-gather (--cp-comm-type allgather) is a ring collective: timed alone
# where nothing meets it, within a leaf or across leaf switches (engine/collectives/ring_alone.py
# channel_segment runs one channel's piece per node), so in the linear terms (benchmarks/scale.py
# cp-allgather, cp 64 to 512: 0.20 / 0.42 / 1.03 / 2.62 CPU s against 0.41 / 0.67 / 1.19 / 2.24
# estimated, 2026-11-29, 2-core machine); where the verdict steps it, its flows are counted
# (shortcuts/work_counts.py cp_gather_flows).
# Transformer Engine's ring exchanges (--tp-comm-overlap) start t(t − 1) flows a step, all but
# one per sender of zero bytes (latency only, no fair-share solve), each step beside a GEMM piece:
# measured by benchmarks/work_estimate.py --exchanges (GPT-3 175B on H100 at 128 GPUs with and
# without the overlap, best of 3: 3.27 against 6.71 and 3.63 against 7.67 CPU s for 221,184
# exchange flows and 9,216 more ring flows at SECONDS_PER_FLOW; 2026-11-29, loaded 2-core
# machine): 1.14e-5 and 1.41e-5 s per exchange flow.
EXCHANGE_SECONDS_PER_FLOW = 1.2e-5
# Expert parallelism's dispatch and combine move tokens between every pair of EP ranks per MoE
# layer-step: measured (2 layers, EP 16 to 64, one or two EP groups) 3.5e-5 to 4.7e-5 CPU s per
# MoE layer-step per ep² with the alltoall dispatcher, 1.4e-5 with allgather.
EP_SECONDS_PER_RANK_PAIR = {"alltoall": 4e-5, "allgather": 1.5e-5}
# Above ~128 EP ranks the all-to-all's ep² flows stop finishing together: the links' max-min
# fair rates (engine/fair_share.py) are solved again at each finish over the flows still
# active, up to ep⁴ flow visits per MoE layer-step. Measured: ep 256, 2 MoE layer-steps, 41.5
# CPU s where the ep² term gives 5.2 (ep 128: 1.96 s, ep 64: 0.41 s).
EP_SECONDS_PER_RANK_PAIR_SQUARED = 4.2e-9
# Under the quotient by rail symmetry with stepwise EP groups every flow of a stage shares its
# one simulated GPU's links, so each fair-share solve (engine/network.py _reschedule: linked
# flows, memo, retimes) takes up every all-to-all flow in flight there; the solves' flows are
# counted (shortcuts/work_counts.py ep_visits) and priced per flow taken up: measured by
# benchmarks/work_estimate.py --visits (time.process_time inside _reschedule, a DeepSeek-V3
# shape scaled down: 13 layers, p 4, d = EP 64, DualPipe, m 8 and 16): 0.84-0.92 / 2.99-3.14
# CPU s for 2.29 / 8.69 million visits, 3.4e-7 to 4.0e-7 s per visit (2026-11-29, loaded 2-core
# machine; 6.1e-7 to 6.4e-7 before linked_flows stopped its walk once it holds every flow).
SECONDS_PER_FLOW_VISIT = 3.7e-7
# Its token-count all-gathers' ring pieces (shortcuts/work_counts.py gather_flows), each flow's
# events outside the solves: the same runs, m 8 to 16, 1.96 more CPU s outside _reschedule for
# 144,192 more flows (2026-11-29, loaded machine): 1.4e-5 s per flow.
SECONDS_PER_GATHER_FLOW = 1.4e-5
# Where the shortcut verdict is known (shortcuts/work_counts.py), an all-to-all timed alone
# (TEMPLATE) is priced by the flows of its private simulations, run once per placement
# (engine/communicator.py), and the check by the all-to-all pairs it routes: measured by
# benchmarks/scale.py a2a-dispatch (EP 32 / 64 / 128: 992 / 4,032 / 16,256 flows in 0.047 /
# 0.19 / 0.93 CPU s, the check 0.04 / 0.08 / 0.42 s) and deepseek-v3 at 1,024 GPUs (4,032
# flows in 0.20 s, the check of 64,512 pairs 1.57 s; 2026-11-29, loaded 2-core machine):
# 4.8e-5 to 5.7e-5 s per flow, 2e-5 to 2.6e-5 s per checked pair.
A2A_ALONE_SECONDS_PER_FLOW = 5e-5
CHECK_SECONDS_PER_PAIR = 2.4e-5
# Multi-token prediction's depths run on the last stage for every micro-batch, each a layer plus
# its own embedding norm, projection and vocabulary head, untemplated: measured with
# benchmarks/scale.py's mtp-deep family (Llama 3 8B shape, 2 layers, one micro-batch, 8 GPUs;
# 2026-11-28, loaded 2-core machine): 0.84 / 3.80 / 14.02 CPU s at 256 / 1,024 / 4,096 depths,
# 3.3e-3 to 3.7e-3 s per depth-step, linear since each depth's weights are looked up in a table
# built once (training/pipeline/steps.py RankState.layer_tables; the scan it replaced was D²).
MTP_SECONDS_PER_DEPTH_STEP = 3.4e-3
# A ring that shares links with other traffic runs step by step, every step's hops as flows on
# the shared links (the DP and TP rings of the H100 layouts, shortcuts/work_counts.py counts
# them): measured 2.32 CPU s for 21,840 flows (GPT-3 width, 16 layers, t 4 SP p 8 interleaved,
# d 4 on DGX H100, 32 micro-batches, 128 layer-steps), about 1e-4 s per flow with its events
# and fair-share solves.
SECONDS_PER_FLOW = 1e-4
# Every run's start: the world (topology, links, ranks), the plans, the metrics; measured on the
# smallest runs of benchmarks/scale.py (2 to 8 layers, 8 to 128 GPUs: 0.22 to 0.43 CPU s where
# the terms above gave 0.05 to 0.26, 2026-11-28, loaded 2-core machine).
RUN_START_SECONDS = 0.15
# CPU seconds per rank of the world that rail symmetry's check costs (shortcuts/rail_symmetry.py
# symmetric_steps: every owner's hops and their images' routes, per shift tried), measured with
# benchmarks/scale.py gpt3-175b-h100 on this 2-core machine: the check alone 6.0 s at 8,192
# GPUs and 17.1 s at 16,384, about half of it the symmetry's (cProfile at 4,096)
SYMMETRY_SECONDS_PER_RANK = 5e-4
TIME_LIMIT_S = 600.0  # ten minutes of estimated CPU time; --force lifts it
MEMORY_LIMIT_BYTES = 8 * GiB  # a third of this machine's 24 GiB; --force does not lift it
