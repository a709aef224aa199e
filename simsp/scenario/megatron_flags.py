"""Megatron-LM's command-line flags, for reading a pasted launch line (`--megatron-args`).

Source: megatron/training/arguments.py of NVIDIA/Megatron-LM at commit
93da800461fd4f6a8262c3bab227868b966aaa69 (2025-12-10), the last commit whose every flag is an
`add_argument('--flag', ...)` literal (later commits build some groups from dataclasses in
megatron/training/config.py). KNOWN is every '--flag' literal of that file (594 flags).
TRAINING_ONLY is the part that changes neither one iteration's time nor its memory: every flag
of these functions of that file
    _add_learning_rate_args (lines 2426-2488)
    _add_checkpointing_args (lines 2489-2622)
    _add_data_args (lines 2931-3047)
    _add_tokenizer_args (lines 2874-2930)
    _add_logging_args (lines 1885-1965)
    _add_validation_args (lines 2855-2873)
    _add_initialization_args (lines 2398-2425)
    _add_regularization_args (lines 1966-1997)
    _add_autoresume_args (lines 3048-3059)
    _add_one_logger_args (lines 1837-1865)
    _add_ft_package_args (lines 1866-1876)
    _add_config_logger_args (lines 1877-1884)
    _add_straggler_detector_args (lines 1770-1781)
    _add_workload_inspector_server_args (lines 1782-1787)
    _add_inprocess_restart_args (lines 1788-1836)
    _add_rerun_machine_args (lines 2380-2397)
    _add_msc_args (lines 3472-3477)
and, from _add_training_args (lines 2064-2379) and _add_mixed_precision_args
(lines 2623-2665), the iteration counts, exits, logging, profiling, checks and loss-scale
settings listed in TRAINING_PICKED. A flag simsp models (simsp/scenario/table/) is used, never
ignored, whichever set holds it (--hidden-dropout, --seq-length).
"""

KNOWN = frozenset("""
--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
--accumulate-allreduce-grads-in-fp32 --activation-func-clamp-value --adam-beta1 --adam-beta2
--adam-eps --add-qkv-bias --adlr-autoresume --adlr-autoresume-interval
--allow-ambiguous-pad-tokens --app-tag-run-name --app-tag-run-version --apply-layernorm-1p
--apply-query-key-layer-scaling --apply-residual-connection-post-layernorm --async-save
--attention-backend --attention-dropout --attention-softmax-in-fp32 --auto-detect-ckpt-format
--batch-size --bert-embedder-type --bert-load --bert-no-binary-head --bf16
--biencoder-projection-dim --biencoder-shared-query-context-model --block-data-path
--cache-mla-latents --calc-ft-timeouts --calculate-per-token-loss --check-for-large-grads
--check-for-spiky-loss --check-weight-hash-across-dp-replicas-interval --checkpoint-activations
--ckpt-assume-constant-structure --ckpt-convert-format --ckpt-convert-save
--ckpt-convert-update-legacy-dist-opt-format --ckpt-format --ckpt-fully-parallel-load
--ckpt-fully-parallel-save --ckpt-step --classes-fraction --clip-grad --config-logger-dir
--context-parallel-size --cp-comm-type --cpu-offloading-num-layers --cross-entropy-fusion-impl
--cross-entropy-loss-fusion --cuda-graph-impl --cuda-graph-scope --data-args-path
--data-cache-path --data-parallel-random-init --data-parallel-sharding-strategy --data-path
--data-per-class-fraction --dataloader-type --ddp-average-in-collective --ddp-bucket-size
--ddp-num-buckets --ddp-pad-buckets-for-high-nccl-busbw
--ddp-reduce-scatter-with-fp32-accumulation --decode-only-cuda-graphs
--decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers --decoder-num-layers
--decoder-seq-length --decoupled-lr --decoupled-min-lr --decrease-batch-size-if-needed
--defer-embedding-wgrad-compute --delay-wgrad-compute --deterministic-mode
--dino-bottleneck-size --dino-freeze-last-layer --dino-head-hidden-size
--dino-local-crops-number --dino-local-img-size --dino-norm-last-layer --dino-teacher-temp
--dino-warmup-teacher-temp --dino-warmup-teacher-temp-epochs
--disable-bf16-reduced-precision-matmul --disable-bias-linear --disable-chunked-prefill
--disable-gloo-process-groups --disable-mamba-mem-eff-path --disable-msc
--disable-straggler-on-startup --disable-symmetric-registration --disable-tp-comm-bulk-dgrad
--disable-tp-comm-bulk-wgrad --disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs
--disable-tp-comm-split-ag --disable-tp-comm-split-rs --dist-ckpt-format
--dist-ckpt-optim-fully-reshardable --dist-ckpt-save-pre-mcore-014 --dist-ckpt-strictness
--distrib-optim-fully-reshardable-mem-efficient --distribute-saved-activations
--distributed-backend --distributed-timeout-minutes --distributed-timeout-seconds-after-init
--dump-param-to-param-group-map --embedding-init-method-std --embedding-path
--empty-unused-memory-level --enable-cuda-graph --enable-experimental --enable-ft-package
--enable-full-sharding-in-hsdp --encoder-num-layers --encoder-seq-length --end-weight-decay
--eod-mask-loss --error-injection-rate --error-injection-type --eval-interval --eval-iters
--evidence-data-path --exit-duration-in-mins --exit-interval --exit-on-missing-checkpoint
--exit-signal --exit-signal-handler --exp-avg-dtype --exp-avg-sq-dtype
--expert-model-parallel-size --expert-tensor-parallel-size --external-cuda-graph
--fake-process-group --ffn-hidden-size --fim-data --fim-eod-token --fim-fragment-rate
--fim-middle-token --fim-no-prefix --fim-pad-token --fim-prefix-token --fim-rate
--fim-split-sample --fim-spm-rate --fim-suffix-token --finetune --first-last-layers-bf16
--flash-decode --fp16 --fp16-lm-cross-entropy --fp32-residual-connection --fp4-format
--fp4-param-gather --fp4-quantizer-factory --fp4-recipe --fp8-amax-compute-algo
--fp8-amax-history-len --fp8-format --fp8-interval --fp8-margin --fp8-param-gather
--fp8-quantizer-factory --fp8-recipe --fsdp-double-buffer --full-validation --global-batch-size
--glu-linear-offset --grad-reduce-in-bf16 --group-query-attention --grpo-clamp-eps-lower
--grpo-clamp-eps-upper --grpo-default-temperature --grpo-default-top-p
--grpo-entropy-term-weight --grpo-filter-groups-with-same-reward --grpo-group-size
--grpo-iterations --grpo-kl-beta --grpo-prompts-per-step --head-lr-mult
--heterogeneous-layers-config-encoded-json --heterogeneous-layers-config-path --hidden-dropout
--hidden-size --hierarchical-context-parallel-sizes --high-priority-stream-groups
--hybrid-attention-ratio --hybrid-mlp-ratio --hybrid-override-pattern --hysteresis
--ict-head-size --ict-load --img-h --img-w --indexer-batch-size --indexer-log-interval
--inference-batch-times-seqlen-threshold --inference-dynamic-batching
--inference-dynamic-batching-block-size --inference-dynamic-batching-buffer-size-gb
--inference-dynamic-batching-cuda-graph-max-tokens
--inference-dynamic-batching-cuda-graph-mixed-prefill-count
--inference-dynamic-batching-max-tokens --inference-dynamic-batching-num-cuda-graphs
--inference-dynamic-batching-track-paused-request-events
--inference-dynamic-batching-unified-memory-level --inference-max-batch-size
--inference-max-requests --inference-max-seq-length --inference-rng-tracker
--inference-wandb-logging-step-interval --init-method-std --init-method-xavier-uniform
--init-model-with-meta-device --initial-loss-scale --inprocess-active-world-size
--inprocess-barrier-timeout --inprocess-completion-timeout --inprocess-empty-cuda-cache
--inprocess-granularity --inprocess-hard-timeout --inprocess-heartbeat-interval
--inprocess-heartbeat-timeout --inprocess-last-call-wait --inprocess-max-iterations
--inprocess-monitor-process-interval --inprocess-monitor-thread-interval
--inprocess-progress-watchdog-interval --inprocess-restart --inprocess-soft-timeout
--inprocess-termination-grace-time --is-hybrid-model --iter-per-epoch --iterations-to-skip
--keep-fp8-transpose-cache --kitchen-config-file --kitchen-recipe-number --kv-channels
--kv-lora-rank --langrl-env-config --langrl-external-server
--langrl-inference-server-conversation-template --langrl-inference-server-type --lazy-mpu-init
--legacy-tokenizer --load --load-main-params-from-ckpt --local-rank --log-energy --log-interval
--log-max-attention-logit --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm
--log-progress --log-straggler --log-throughput --log-timers-to-tensorboard
--log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard --logging-level --loss-scale
--loss-scale-window --lr --lr-decay-iters --lr-decay-samples --lr-decay-style
--lr-warmup-fraction --lr-warmup-init --lr-warmup-iters --lr-warmup-samples --lr-wsd-decay-iters
--lr-wsd-decay-samples --lr-wsd-decay-style --main-grads-dtype --main-params-dtype
--make-vocab-size-divisible-by --mamba-head-dim --mamba-num-groups --mamba-num-heads
--mamba-state-dim --manual-gc --manual-gc-interval --mask-factor --mask-prob --mask-type
--max-position-embeddings --max-tokens-to-oom --memory-snapshot-path --merge-file
--micro-batch-size --microbatch-group-size-per-virtual-pipeline-stage
--mid-level-dataset-surplus --min-loss-scale --min-lr --mlp-chunks-for-prefill --mock-data
--model-parallel-size --moe-apply-probs-on-input --moe-aux-loss-coeff --moe-deepep-num-sms
--moe-enable-deepep --moe-expert-capacity-factor --moe-extended-tp --moe-ffn-hidden-size
--moe-flex-dispatcher-backend --moe-grouped-gemm --moe-hybridep-num-sms --moe-input-jitter-eps
--moe-latent-size --moe-layer-freq --moe-layer-recompute --moe-pad-expert-input-to-capacity
--moe-pad-experts-for-cuda-graph-inference --moe-per-layer-logging --moe-permute-fusion
--moe-router-bias-update-rate --moe-router-dtype --moe-router-enable-expert-bias
--moe-router-force-load-balancing --moe-router-fusion --moe-router-group-topk
--moe-router-load-balancing-type --moe-router-num-groups --moe-router-padding-for-fp8
--moe-router-padding-for-quantization --moe-router-pre-softmax --moe-router-score-function
--moe-router-topk --moe-router-topk-scaling-factor --moe-shared-expert-intermediate-size
--moe-shared-expert-overlap --moe-token-dispatcher-type --moe-token-drop-policy
--moe-upcycling-granularity --moe-use-legacy-grouped-gemm --moe-use-upcycling --moe-z-loss-coeff
--mrope-section --mscale --mscale-all-dim --mtp-loss-scaling-factor --mtp-num-layers
--multi-latent-attention --multiple-validation-sets --nccl-all-reduce-for-prefill
--nccl-communicator-config-path --no-align-grad-reduce --no-align-param-gather
--no-async-tensor-model-parallel-allreduce --no-barrier-with-level-1-timing
--no-bias-dropout-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion
--no-check-for-nan-in-loss-and-grad --no-ckpt-fully-parallel-save
--no-clone-scatter-output-in-embedding --no-create-attention-mask-in-dataloader
--no-data-sharding --no-fp8-wgrad --no-gradient-accumulation-fusion
--no-gradient-reduce-div-fusion --no-initialization --no-load-optim --no-load-rng
--no-log-loss-scale-to-tensorboard --no-manual-gc-eval --no-masked-softmax-fusion
--no-mmap-bin-files --no-one-logger --no-overlap-p2p-communication --no-persist-layer-norm
--no-pin-cpu-grads --no-pin-cpu-params --no-position-embedding --no-rope-freq --no-rope-fusion
--no-save-optim --no-save-rng --no-scatter-gather-tensors-in-pipeline
--no-strict-fsdp-dtensor-load --no-use-tokenizer-model-from-checkpoint-args
--non-persistent-ckpt-type --non-persistent-global-ckpt-dir --non-persistent-local-ckpt-algo
--non-persistent-local-ckpt-dir --non-persistent-save-interval --norm-epsilon --normalization
--num-attention-heads --num-channels --num-classes --num-dataset-builder-threads
--num-distributed-optimizer-instances --num-experts --num-layers --num-layers-at-end-in-bf16
--num-layers-at-start-in-bf16 --num-layers-per-virtual-pipeline-stage --num-query-groups
--num-virtual-stages-per-pipeline-rank --num-workers --object-storage-cache-path
--one-logger-async --one-logger-project --one-logger-run-name --onnx-safe --openai-gelu
--optimizer --optimizer-cpu-offload --optimizer-offload-fraction --output-bert-embeddings
--overlap-cpu-optimizer-d2h-h2d --overlap-grad-reduce --overlap-moe-expert-parallel-comm
--overlap-p2p-communication-warmup-flush --overlap-param-gather
--overlap-param-gather-with-optimizer-step --override-opt-param-scheduler
--override-opt_param-scheduler --padded-vocab-size --patch-dim --per-split-data-args-path
--perform-rl-step --persistent-save-interval --pipeline-model-parallel-comm-backend
--pipeline-model-parallel-layout --pipeline-model-parallel-size --position-embedding-type
--pretrained-checkpoint --profile --profile-ranks --profile-step-end --profile-step-start
--q-lora-rank --qk-clip --qk-clip-alpha --qk-clip-threshold --qk-head-dim --qk-l2-norm
--qk-layernorm --qk-pos-emb-head-dim --query-in-block-prob --quick-geglu --rampup-batch-size
--recompute-activations --recompute-granularity --recompute-method --recompute-modules
--recompute-num-layers --record-memory-history --relative-attention-max-distance
--relative-attention-num-buckets --replication --replication-factor --replication-jump
--rerun-mode --reset-attention-mask --reset-position-ids --result-rejected-tracker-filename
--retriever-report-topk-accuracies --retriever-score-scaling --retriever-seq-length
--retro-add-retriever --retro-cyclic-train-iters --retro-encoder-attention-dropout
--retro-encoder-hidden-dropout --retro-encoder-layers --retro-project-dir
--reuse-grad-buf-for-mxfp8-param-ag --rl-calculate-intra-group-similarity
--rl-importance-sampling-truncation-coef --rl-inference-logprobs-is-correction
--rl-offload-kv-cache-during-training --rl-offload-optimizer-during-inference
--rl-partial-rollouts --rl-prompts-per-eval --rl-remove-kv-cache-during-training
--rl-reset-cuda-graphs --rl-sequence-packing-algo --rl-sequence-packing-bin-size
--rl-use-sequence-packing --rope-scaling-factor --rope-type --rotary-base --rotary-interleaved
--rotary-percent --rotary-scaling-factor --rotary-seq-len-interpolation-factor
--run-workload-inspector-server --sample-rate --save --save-interval --save-retain-interval
--seed --seq-length --sequence-parallel --sft --sft-tokenizer-prompt-format --sgd-momentum
--sharp-enabled-group --short-seq-prob --skip-train --softmax-type --spec --split --squared-relu
--start-weight-decay --straggler-ctrlr-port --straggler-minmax-count
--suggested-communication-unit-size --swiglu --swin-backbone-type --symmetric-ar-type
--te-precision-config-file --te-rng-tracker --tensor-model-parallel-size --tensorboard-dir
--tensorboard-log-interval --tensorboard-queue-size --test-data-path
--tiktoken-num-special-tokens --tiktoken-pattern --tiktoken-special-tokens --timing-log-level
--timing-log-option --titles-data-path --tokenizer-hf-include-special-tokens
--tokenizer-hf-use-fast --tokenizer-metadata --tokenizer-model --tokenizer-sentencepiece-legacy
--tokenizer-special-tokens --tokenizer-type --torch-fsdp2-no-reshard-after-forward
--tp-comm-bootstrap-backend --tp-comm-overlap --tp-comm-overlap-cfg --tp-comm-overlap-rs-dgrad
--train-data-path --train-iters --train-samples --train-sync-interval --transformer-impl
--untie-embeddings-and-output-weights --use-checkpoint-args --use-checkpoint-opt-param-scheduler
--use-checkpoint-opt_param-scheduler --use-cpu-initialization --use-dist-ckpt
--use-distributed-optimizer --use-flash-attn --use-fused-weighted-squared-relu
--use-legacy-models --use-legacy-static-engine --use-mcore-models --use-megatron-fsdp
--use-mp-args-from-checkpoint-args --use-nccl-ub --use-one-sent-docs
--use-persistent-ckpt-worker --use-precision-aware-optimizer --use-pytorch-profiler
--use-ring-exchange-p2p --use-rope-scaling --use-rotary-position-embeddings --use-sharp
--use-te-activation-func --use-torch-fsdp2 --use-torch-optimizer-for-cpu-offload
--use-tp-pp-dp-mapping --v-head-dim --valid-data-path --vision-backbone-type
--vision-pretraining --vision-pretraining-type --vocab-extra-ids --vocab-file --vocab-size
--wandb-entity --wandb-exp-name --wandb-project --wandb-save-dir --warmup --weight-decay
--weight-decay-incr-style --wgrad-deferral-limit --window-attn-skip-freq --window-size
--yaml-cfg
""".split())

TRAINING_PICKED = frozenset("""
--check-for-large-grads --check-for-spiky-loss --check-weight-hash-across-dp-replicas-interval
--dataloader-type --exit-duration-in-mins --exit-interval --exit-signal --exit-signal-handler
--hysteresis --initial-loss-scale --iterations-to-skip --log-interval --loss-scale
--loss-scale-window --memory-snapshot-path --min-loss-scale --no-check-for-nan-in-loss-and-grad
--profile --profile-ranks --profile-step-end --profile-step-start --record-memory-history
--result-rejected-tracker-filename --tensorboard-dir --train-iters --train-samples
--use-cpu-initialization --use-mcore-models --use-pytorch-profiler
""".split())

TRAINING_ONLY = frozenset("""
--adam-beta1 --adam-beta2 --adam-eps --adlr-autoresume --adlr-autoresume-interval
--allow-ambiguous-pad-tokens --app-tag-run-name --app-tag-run-version --async-save
--attention-dropout --auto-detect-ckpt-format --calc-ft-timeouts --check-for-large-grads
--check-for-spiky-loss --check-weight-hash-across-dp-replicas-interval
--ckpt-assume-constant-structure --ckpt-convert-format --ckpt-convert-save
--ckpt-convert-update-legacy-dist-opt-format --ckpt-format --ckpt-fully-parallel-load
--ckpt-fully-parallel-save --ckpt-step --clip-grad --config-logger-dir --data-args-path
--data-cache-path --data-parallel-random-init --data-path --dataloader-type --decoder-seq-length
--decoupled-lr --decoupled-min-lr --disable-msc --disable-straggler-on-startup
--dist-ckpt-format --dist-ckpt-optim-fully-reshardable --dist-ckpt-save-pre-mcore-014
--dist-ckpt-strictness --distrib-optim-fully-reshardable-mem-efficient
--embedding-init-method-std --enable-ft-package --encoder-seq-length --end-weight-decay
--eod-mask-loss --error-injection-rate --error-injection-type --eval-interval --eval-iters
--exit-duration-in-mins --exit-interval --exit-on-missing-checkpoint --exit-signal
--exit-signal-handler --fim-data --fim-eod-token --fim-fragment-rate --fim-middle-token
--fim-no-prefix --fim-pad-token --fim-prefix-token --fim-rate --fim-split-sample --fim-spm-rate
--fim-suffix-token --finetune --full-validation --hidden-dropout --hysteresis --init-method-std
--init-method-xavier-uniform --initial-loss-scale --inprocess-active-world-size
--inprocess-barrier-timeout --inprocess-completion-timeout --inprocess-empty-cuda-cache
--inprocess-granularity --inprocess-hard-timeout --inprocess-heartbeat-interval
--inprocess-heartbeat-timeout --inprocess-last-call-wait --inprocess-max-iterations
--inprocess-monitor-process-interval --inprocess-monitor-thread-interval
--inprocess-progress-watchdog-interval --inprocess-restart --inprocess-soft-timeout
--inprocess-termination-grace-time --iterations-to-skip --legacy-tokenizer --load
--load-main-params-from-ckpt --log-energy --log-interval --log-max-attention-logit
--log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-progress
--log-straggler --log-throughput --log-timers-to-tensorboard --log-validation-ppl-to-tensorboard
--log-world-size-to-tensorboard --logging-level --loss-scale --loss-scale-window --lr
--lr-decay-iters --lr-decay-samples --lr-decay-style --lr-warmup-fraction --lr-warmup-init
--lr-warmup-iters --lr-warmup-samples --lr-wsd-decay-iters --lr-wsd-decay-samples
--lr-wsd-decay-style --mask-prob --memory-snapshot-path --merge-file --mid-level-dataset-surplus
--min-loss-scale --min-lr --mock-data --multiple-validation-sets
--no-barrier-with-level-1-timing --no-check-for-nan-in-loss-and-grad
--no-ckpt-fully-parallel-save --no-create-attention-mask-in-dataloader --no-initialization
--no-load-optim --no-load-rng --no-log-loss-scale-to-tensorboard --no-mmap-bin-files
--no-one-logger --no-save-optim --no-save-rng --no-strict-fsdp-dtensor-load
--no-use-tokenizer-model-from-checkpoint-args --non-persistent-ckpt-type
--non-persistent-global-ckpt-dir --non-persistent-local-ckpt-algo
--non-persistent-local-ckpt-dir --non-persistent-save-interval --num-dataset-builder-threads
--num-workers --object-storage-cache-path --one-logger-async --one-logger-project
--one-logger-run-name --override-opt-param-scheduler --override-opt_param-scheduler
--padded-vocab-size --per-split-data-args-path --persistent-save-interval
--pretrained-checkpoint --profile --profile-ranks --profile-step-end --profile-step-start
--record-memory-history --rerun-mode --reset-attention-mask --reset-position-ids
--result-rejected-tracker-filename --retriever-seq-length --run-workload-inspector-server
--sample-rate --save --save-interval --save-retain-interval --seed --seq-length --sgd-momentum
--short-seq-prob --skip-train --split --start-weight-decay --straggler-ctrlr-port
--straggler-minmax-count --tensorboard-dir --tensorboard-log-interval --tensorboard-queue-size
--test-data-path --tiktoken-num-special-tokens --tiktoken-pattern --tiktoken-special-tokens
--timing-log-level --timing-log-option --tokenizer-hf-include-special-tokens
--tokenizer-hf-use-fast --tokenizer-metadata --tokenizer-model --tokenizer-sentencepiece-legacy
--tokenizer-special-tokens --tokenizer-type --train-data-path --train-iters --train-samples
--use-checkpoint-args --use-checkpoint-opt-param-scheduler --use-checkpoint-opt_param-scheduler
--use-cpu-initialization --use-dist-ckpt --use-mcore-models --use-mp-args-from-checkpoint-args
--use-persistent-ckpt-worker --use-pytorch-profiler --valid-data-path --vocab-extra-ids
--vocab-file --vocab-size --wandb-entity --wandb-exp-name --wandb-project --wandb-save-dir
--warmup --weight-decay --weight-decay-incr-style
""".split())

# torchrun's flags (torch/distributed/run.py); --nnodes and --nproc-per-node give the world
LAUNCHER_WORLD = {"--nnodes": "nodes", "--nproc-per-node": "gpus_per_node",
                  "--nproc_per_node": "gpus_per_node"}

# the tokenizer flags from which Megatron's training sets the vocabulary (_add_tokenizer_args)
TOKENIZER_FLAGS = ("--vocab-file", "--tokenizer-model", "--tokenizer-type")
