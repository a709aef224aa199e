"""Total and active parameters and Megatron's model FLOPs per token of the published MoE
architectures (docs/moe.md has the table; tests/test_moe_params.py and test_moe_flops.py check
them against the model cards and an independent count).

    python benchmarks/moe_published.py [--seq-length 4096]
"""

import argparse

from simsp.model.blocks.moe.flops import moe_model_flops
from simsp.model.blocks.moe.params import MoeArch, parameter_counts

PUBLISHED = {  # Megatron-LM flags of each model card's architecture
    "Mixtral 8x7B": MoeArch(32, 4096, 32, 8, 128, 8, 2, 14336, 32000),
    "Qwen3-30B-A3B": MoeArch(48, 2048, 32, 4, 128, 128, 8, 768, 151936),
    "DeepSeek-V3": MoeArch(61, 7168, 128, 128, 128, 256, 8, 2048, 129280,
                           shared_expert_intermediate_size=2048, ffn_hidden_size=18432,
                           dense_layers=3, q_lora_rank=1536, kv_lora_rank=512,
                           qk_pos_emb_head_dim=64, v_head_dim=128),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-length", type=int, default=4096)
    s = parser.parse_args().seq_length
    print(f"{'model':<16} {'total':>10} {'active':>10} {'GFLOP/token (s=' + str(s) + ')':>22}")
    for name, arch in PUBLISHED.items():
        total, active = parameter_counts(arch)
        per_token = moe_model_flops(arch, 1, s, arch.vocab_size) / s
        print(f"{name:<16} {total / 1e9:>9.2f}B {active / 1e9:>9.2f}B {per_token / 1e9:>22.2f}")


if __name__ == "__main__":
    main()
