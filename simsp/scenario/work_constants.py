"""The work estimate's constants (simsp/scenario/work.py, shortcuts/work_counts.py): CPU seconds
and bytes of simsp's own code per counted unit, and the limits.

Every constant is measured by benchmarks/estimate_constants.py in one pass on one machine, by
runs that isolate its term (the group named beside it: `--only GROUP` re-measures it), each the
best of three by process time; the tag gives the date and the machine's speed probe
(benchmarks/speed.py probe_ms, sum(range(10**7)) in ms) before and after the pass. A machine
twice as fast halves them all: re-measure there with `python benchmarks/estimate_constants.py`
(docs/PERFORMANCE.md "The work estimate's constants").
"""

from simsp.units import GiB

# estimate_constants.py --only start (2026-11-29, probe 142-174 ms): Every run's start: the world
# (topology, links, ranks) and the check; the smallest meta runs (tiny and Llama 3 8B, 2 layers,
# 8 GPUs).
RUN_START_SECONDS = 0.0057
# estimate_constants.py --only layer-step (2026-11-29, q46f, probe 282-328 ms): Meta mode with every
# shortcut, one layer forward and backward on one stage, its growth with the replicas d, and each
# schedule step of a simulated rank (one model chunk's forward or backward of one micro-batch: the
# step's bookkeeping and its pipeline send and receive): GPT-3 175B width (t 8, SP, selective), L 32
# to 96, p 1 to 8, m 4 to 128, d 1 to 64, chunks of 1 to 48 layers. Without the chunk term the
# layer-step absorbed the steps of 12-layer chunks, and paper-530b (chunks of one layer) ran 4.9
# times its estimate.
META_SECONDS_PER_LAYER_STEP = 2.5e-5
META_SECONDS_PER_LAYER_STEP_PER_REPLICA = 1.9e-7
META_SECONDS_PER_CHUNK_STEP = 6.6e-5
# estimate_constants.py --only full (2026-11-29, probe 142-174 ms): --no-shortcuts: per simulated
# rank-step, and per rank of its TP ring (tiny shape, 2 layers, t 8 / 16 / 64), priced by the rule
# alone (run_seconds under Shortcuts() adds the stepped rings' flows to it).
FULL_SECONDS_PER_RANK_STEP = 0.0013
FULL_SECONDS_PER_RING_RANK = 4.3e-5
# estimate_constants.py --only numeric (2026-11-29, probe 142-174 ms): Numeric mode: numpy float64
# GEMMs on one core with simsp's op overhead, and the per-op overhead per rank-step
# (scenarios/tiny.toml at h 64, 128, 256).
NUMERIC_FLOPS_PER_SECOND = 3.3e9
NUMERIC_SECONDS_PER_LAYER_STEP = 0.00073
# estimate_constants.py --only bytes (2026-11-29, probe 142-174 ms): Meta mode keeps its ledger and
# trace (run's default, steps) per layer-step, and every simulated rank its plan of every layer's
# parameter names (training/pipeline/plan.py stage_param_names): peak RSS above the loaded
# scenario, paper-1t (65,536 layer-steps) and a tiny model at L = p = 512.
META_BYTES_PER_LAYER_STEP = 2750
PLAN_BYTES_PER_RANK_LAYER = 180
# estimate_constants.py --only full-bytes (2026-11-29, q47b refit with the DP ring records
# counted apart, probe 118-146 ms; q46g's: 42100, 1790, 73400, 84400): a rank that runs
# without layer templates (every rank under --no-shortcuts, Shortcuts(); the representative where
# the verdict keeps no templates) keeps per rank-step its ledger's records (about
# 145 a layer-step of 175B width) and the trace's spans; per rank-step and ring rank (t − 1) the
# transfer records of its TP ring steps (engine/network.py keeps every delivered transfer, trace
# or not); per rank and layer of its stage its parameters', gradients' and optimizer's state; per
# rank its own: peak RSS above the loaded scenario, run's default trace (steps), 175B width (SP,
# selective) at L 8 to 32, t 2 to 8, p 1 to 8, d 1 to 8, m 4 and 8 (6 runs, each within 1.2%),
# the data-parallel rings' records (BYTES_PER_TRANSFER_RECORD each) subtracted.
FULL_BYTES_PER_RANK_STEP = 41700
FULL_BYTES_PER_RING_STEP = 1810
FULL_BYTES_PER_RANK_LAYER = 78800
FULL_BYTES_PER_RANK = 76200
# estimate_constants.py --only span-bytes merged-span-bytes (2026-11-29, q47b, tracemalloc):
# bytes one span of `--trace full`'s detail tracks holds (engine/trace.py Span: the tuple, its
# two float times, its name, its own args dict, its list slot), freed by dropping them from the
# trace of a full run (tiny L8; llama3-8b L2 t2: 7,700 and 930 spans, 353 and 354 bytes
# each); a template's merged span (model/replay.py) shares its template's args dict
# (paper-175b m16 templated: 6,200 spans).
BYTES_PER_SPAN = 354
BYTES_PER_MERGED_SPAN = 185
# estimate_constants.py --only record-bytes (2026-11-29, q47b, tracemalloc): bytes one delivered
# transfer record holds (engine/trace.py TransferRecord: the tuple, its end time, its label, its
# list slot), freed by dropping a full run's data-parallel ring records: tiny t1 p2 d8 on 2
# nodes (224 records, 187 bytes each) and t1 d32 on 4 nodes with the distributed optimizer
# (15,872, 175 each). Large rings keep less (q47d, the records' objects counted): every record
# its 6-tuple (88 bytes, sys.getsizeof), list slot and two float times of its own (24 each);
# its size a float of its own (24) where NCCL runs LL or LL128 (collectives/nccl_group.py
# wire_bytes divides by the protocol's fraction: the fit's small buckets), else an int shared
# from the ring's chunk sizes; its label one string per ring channel and step (ring.py
# step_labels), shared by the ring's n records: Llama 3 8B t1 d32 L4 (Simple, n 32) 159 each,
# FSDP2 t1 d16 L4 156 (not priced apart: the count would need each collective's protocol).
BYTES_PER_TRANSFER_RECORD = 181
# estimate_constants.py --only plan (2026-11-29, probe 142-174 ms): Each simulated rank builds its
# plan from every layer's parameter names: a tiny model at L = p = 256 and 512, one micro-batch
# (ranks x L grows as p²).
PLAN_SECONDS_PER_RANK_LAYER = 1.2e-5
# estimate_constants.py --only buckets (2026-11-29, probe 142-174 ms): One collective per
# data-parallel gradient bucket and simulated rank: 22B at d 4 and 16 with one-tensor buckets
# (--ddp-bucket-size 1, --overlap-grad-reduce).
SECONDS_PER_BUCKET = 8.1e-5
# estimate_constants.py --only fsdp-rule (2026-11-29, probe 142-174 ms): FSDP (docs/fsdp.md) before
# the verdict is known: rings stepped whole, per collective per d² (Llama 3 8B, 8 layers, FSDP2 at
# t 2, d 16 and 32), or as one node's pieces where every unit splits so, per collective per d·G
# (the same at t 1, d 16 to 64).
FSDP_SECONDS_PER_COLLECTIVE_D2 = 0.00012
FSDP_SECONDS_PER_COLLECTIVE_PIECE = 2.3e-5
# estimate_constants.py --only fsdp-flows (2026-11-29, probe 142-174 ms): Where the verdict is
# known (shortcuts/work_counts.py): the flows of FSDP rings stepped whole and run as one node's
# pieces, and the steps and collectives of the pieces of one member per node run in arithmetic
# while only pieces use its NIC
# (engine/collectives/step_trains.py): FSDP2 d 16 to 64 at t 1 and 2, and benchmarks/scale.py
# llama3.1-405b-fsdp (TP 8, PP 16, the DP rings meeting the pipeline sends) at 2,048 and 4,096.
FSDP_SECONDS_PER_FLOW = 1.5e-5
PIECE_SECONDS_PER_FLOW = 2.5e-5
TRAIN_SECONDS_PER_STEP = 3.6e-6
TRAIN_SECONDS_PER_COLLECTIVE = 0.00034
# estimate_constants.py --only cp-pairs (2026-11-29, probe 142-174 ms): Context parallelism's ring
# (p2p) and Ulysses all-to-all (a2a) pass a block between every pair of a CP group's ranks per
# layer-step, each a transfer on the links, where every rank runs: a 2-layer Llama 3 8B shape, s
# 4096, p2p at cp 32 and 64 with d 2, a2a at cp 8 with d 4.
CP_SECONDS_PER_RANK_PAIR = 4.6e-5
# estimate_constants.py --only cp-lone cp-lone-shared (2026-11-29, after round 11's merge, probe
# 193 ms after the pass): p2p rings alone on their links (context_parallel/lone_ring.py) where
# TP rank 0's CP ranks run: per layer-step per CP rank, and per CP pair, each call worked out in
# arithmetic once the group has entered (context_parallel/ring_pass.py; the steps' charges,
# sends' records and receive buffers still cost per pair): the same shape at cp 16 and 64, d 1,
# and benchmarks/scale.py cp-128k at 256 GPUs; where SMs are shared (--sm-contention or TP comm
# overlap) the pass is off and every send is a step of its own: cp 16 and 64 with --sm-contention.
CP_SECONDS_PER_RANK_STEP = 0.0014
CP_PASS_SECONDS_PER_RANK_PAIR = 1.68e-5  # q46b, below
CP_LONE_SECONDS_PER_RANK_PAIR = 1.6e-4
# estimate_constants.py --only start cp-lone (2026-11-29, q46b, probe 232 ms after the pass;
# RUN_START_SECONDS measured in the same pass at ratio 1.00, so no rescaling): where the verdict
# uses layer templates with context parallelism (model/replay.py SplitTemplate) a CP rank's
# layer-step is its CP calls (TE's prologue and epilogue kernels, its side of the ring pass) and a
# few replayed segments, per layer-step per CP rank; fitted with CP_PASS_SECONDS_PER_RANK_PAIR on
# cp-lone's runs (cp 16 and 64 of the 2-layer Llama 3 8B shape, cp-128k at 256, 512 and 1,024
# GPUs). The pass's pairs now cost less (one charge per call, the group's arithmetic as vectors,
# receive buffers entered at once: context_parallel/ring_pass.py) and the per-rank part more of
# the whole: 2.1e-4 per rank-step and 1.68e-5 per pair (was 1.0e-4 and 3.3e-5).
CP_TEMPLATE_SECONDS_PER_RANK_STEP = 2.1e-4
# estimate_constants.py --only cp-shadows (2026-11-29, q47a, probe about 131 ms): a CP group run
# as one program (training/context_parallel/shadows.py, d >= 1): per layer-step the leader's
# program (its replayed segments and calls) and, per CP rank, the group's vectors (the ring
# pass's steps, each shadow's bookkeeping column); once per run, per CP pair, each CP index's
# charges of its c steps; and the shortcut check's cost per member of the CP groups it lists as
# all-to-alls (shortcuts/cp_traffic.py; every rank of the world once: CHECK_SECONDS_PER_MEMBER,
# fitted on expert all-to-alls, priced them about four times over). Runs: the cp 16 and 64 runs
# of cp-lone's shape, benchmarks/scale.py cp-128k at 256, 512 and 1,024 GPUs and cp-128k-dp at
# 2,048, 8,192 and 16,384 (within 5% of each but the 2-layer cp 16, whose fixed costs are
# most of it: measured 3x). Refitted (2026-11-29, q47e, probe 129-139 ms) after the ring pass's
# steps got cheaper (sends found once per kind of call, one landing proof per call, kernels added
# in place: context_parallel/ring_pass.py): per rank-step 1.93e-5 -> 7.97e-6, per leader-step
# 3.51e-4 -> 3.85e-4, per pair 2.34e-5 -> 2.36e-5; est. / measured 0.97-1.10 on these runs but
# the 2-layer cp 16 (0.33, as before). The check's binding links named without routes (q47f,
# shortcuts/route_ends.py): refitted 7.07e-5 per member beside 1e609d2's 8.18e-5 in the same
# minutes (probe 173-185 ms), scaled to like conditions: 8.26e-5 -> 7.14e-5.
CP_SHADOW_SECONDS_PER_LEADER_STEP = 3.85e-4
CP_SHADOW_SECONDS_PER_RANK_STEP = 7.97e-6
CP_SHADOW_SECONDS_PER_RANK_PAIR = 2.36e-5
CP_CHECK_SECONDS_PER_MEMBER = 7.14e-5
# Context parallelism's all-gather (--cp-comm-type allgather) is a ring collective: timed alone
# where nothing meets it (engine/collectives/ring_alone.py channel_segment runs one channel's piece
# per node), so it is in the linear terms; where the verdict steps it, its flows are counted
# (shortcuts/work_counts.py cp_gather_flows) at SECONDS_PER_FLOW. estimate_constants.py --only
# flows (2026-11-29, probe 142-174 ms): A ring that shares links with other traffic runs step by
# step, every step's hops as flows on the shared links, with their events and fair-share solves
# (the DP and TP rings of the H100 layouts, shortcuts/work_counts.py): benchmarks/scale.py
# gpt3-175b-h100 at 128 and 256.
SECONDS_PER_FLOW = 5e-5
# estimate_constants.py --only exchange (2026-11-29, probe 142-174 ms): Transformer Engine's ring
# exchanges (--tp-comm-overlap) start t(t − 1) flows a step, all but one per sender of zero bytes
# (no fair-share solve): benchmarks/scale.py gpt3-175b-h100-tpo at 128 GPUs, beside the ring flows
# it steps at SECONDS_PER_FLOW.
EXCHANGE_SECONDS_PER_FLOW = 1.3e-5
# estimate_constants.py --only ep-pairs ep-allgather (2026-11-29, probe 142-174 ms): Expert
# parallelism's dispatch and combine move tokens between every pair of EP ranks per MoE layer-step,
# priced by the rule before the verdict is known (after it, the stepped all-to-alls' flows are
# counted at SECONDS_PER_FLOW): a 2-layer MoE with routing imbalance 0.5 (every all-to-all runs),
# EP = d 32 to 128 with alltoall, 32 and 64 with allgather. Above ~128 EP ranks the all-to-all's
# ep² flows stop finishing together and the links' fair rates are solved again at each finish
# (engine/fair_share.py): up to ep⁴ visits.
EP_SECONDS_PER_RANK_PAIR = {"alltoall": 1.1e-4, "allgather": 4.7e-5}
EP_SECONDS_PER_RANK_PAIR_SQUARED = 0.0  # ep 256 (13.4 CPU s) on the ep² term alone: no ep⁴ seen
# estimate_constants.py --only visits (2026-11-29, probe 297-409 ms; main's code beside it, the
# same minutes: 3.48e-7 per visit before flow classes): Under the quotient by rail symmetry with
# stepwise EP groups each fair-share solve (engine/network.py _reschedule) takes up every
# all-to-all flow class in flight on the simulated GPU's links (like flows starting together
# drain as one class); the solves' classes are counted (shortcuts/work_counts.py ep_visits) and
# priced per class taken up: the CPU inside _reschedule, DeepSeek-V3 scaled down (13 layers,
# p 4, d = EP 64, DualPipe, m 8 and 16; benchmarks/work_estimate.py --visits). Dearer per
# visit than per flow (a solve's fixed work over 6x fewer visits), 2.7-3.3x less in all.
SECONDS_PER_FLOW_VISIT = 7.3e-7
# estimate_constants.py --only gather (2026-11-29, probe 233 ms after): Its token-count
# all-gathers' ring pieces (shortcuts/work_counts.py gather_flows), each flow's events outside
# the solves: the same runs, beside the other terms (0 while the visits were counted per flow,
# 1.3-2.6x the solves': that count held their price).
SECONDS_PER_GATHER_FLOW = 8.0e-6
# estimate_constants.py --only a2a-alone (2026-11-29, after round 11's merge, probe 193 ms after): Where the verdict is
# known, an all-to-all timed alone (TEMPLATE) is priced by the flows of its private simulations,
# run once per placement (engine/exchanges.py), and the check by the members of the all-to-all
# owners it lists (each member's links counted per kind of peer, shortcuts/a2a_links.py; the
# check's other routes over the world, which grow alike, included): benchmarks/scale.py
# a2a-dispatch at EP 64 and 128 and deepseek-v3 at 1,024 GPUs. Refitted (2026-11-29, round 14,
# probe 131 / 128 ms, best of two) after the check named its binding links without routes
# (shortcuts/route_ends.py), deepseek-v3 at 4,096 GPUs added (measured / estimated 0.52 there
# with the old constants): 3.5e-5 -> 2.45e-5 per flow, 3.3e-4 -> 1.72e-4 per member; est. /
# measured 0.83-1.07 on the four runs.
A2A_ALONE_SECONDS_PER_FLOW = 2.45e-5
CHECK_SECONDS_PER_MEMBER = 1.72e-4
# estimate_constants.py --only mtp (2026-11-29, probe 142-174 ms): Multi-token prediction's depths
# run on the last stage for every micro-batch, each a layer plus its own embedding norm, projection
# and vocabulary head, untemplated, linear in D since each depth's weights are looked up in a table
# built once (training/pipeline/steps.py RankState.layer_tables): benchmarks/scale.py mtp-deep at
# 256 and 1,024 depths.
MTP_SECONDS_PER_DEPTH_STEP = 0.0017
# estimate_constants.py --only symmetry (2026-11-29, q45a, probe 305-346 ms; a74fa45 refitted in
# the same minutes gives 0.000524, its 0.0005 of probe 193 ms): Rail symmetry's check per rank of
# the world (shortcuts/rail_symmetry.py symmetric_steps: every owner's hops and their images'
# routes, per shift tried; shortcuts/quotient.py: the executed rings' pieces): the shortcut
# check alone on benchmarks/scale.py gpt3-175b-h100 at 4,096 and 16,384 GPUs, 1.07 and 5.50
# CPU s (a74fa45: 1.78 and 18.69). The channels x d² term of the quotient's channel maps is
# gone (composed from per-axis steps, quotient.py ChannelMaps) and so is the d per hop of
# comparing channel keys (rail_symmetry.py RouteSignatures numbers them); what grows faster
# than the ranks is left to hashing and scanning d-member groups per link and clash (py-spy).
# estimate_constants.py --only symmetry a2a-alone (2026-11-29, q46d, probe 241-358 ms; 39d160a
# refitted in the same minutes gives 0.000272, its 0.00029): the check's large groups hashed once
# (shortcuts/ranks.py), route signatures read per link, link representatives per GPU
# (docs/shortcuts.md, "Cost of the check") take 1.00 / 5.24 -> 0.71 / 3.14 CPU s at 4,096 /
# 16,384 GPUs; refitted 0.000181, x 0.00029 / 0.000272 for like conditions.
SYMMETRY_SECONDS_PER_RANK = 0.00019
TIME_LIMIT_S = 600.0  # ten minutes of estimated CPU time; --force lifts it
MEMORY_LIMIT_BYTES = 8 * GiB  # a third of this machine's 24 GiB; --force does not lift it
