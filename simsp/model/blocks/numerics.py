"""Every block's numpy forward/backward pairs under one name, as the single-device reference
(simsp/model/reference.py) calls them (`K.layernorm_forward`, ...). The math itself lives in
its block; this module only gathers it for the reference.
"""

# ruff: noqa: F401  (re-exported for the reference)
from simsp.model.base.kernels import (dropout_backward, dropout_forward, linear_backward,
                                      linear_forward)
from simsp.model.blocks.attention.core import (attention_context_backward,
                                               attention_context_forward,
                                               attention_scores_backward,
                                               attention_scores_forward, causal_softmax_forward,
                                               softmax_backward)
from simsp.model.blocks.attention.heads import (expand_kv, merge_heads, merge_qkv_grads,
                                                reduce_kv, split_heads, split_qkv)
from simsp.model.blocks.attention.rope import rope_angles, rope_backward, rope_forward
from simsp.model.blocks.embedding import token_embedding_backward as embedding_backward
from simsp.model.blocks.embedding import token_embedding_forward as embedding_forward
from simsp.model.blocks.head import cross_entropy_backward, cross_entropy_forward
from simsp.model.blocks.mlp.activation import (gelu_backward, gelu_forward, swiglu_backward,
                                               swiglu_forward)
from simsp.model.blocks.norm import (layernorm_backward, layernorm_forward, rmsnorm_backward,
                                     rmsnorm_forward)
