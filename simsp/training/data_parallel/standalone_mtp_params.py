"""Which parameters each model chunk holds, in module order, under Megatron's standalone MTP
(the depths in a virtual stage of their own before the loss's; docs/pipeline-layout.md).

Megatron-LM gpt_model.py builds the embedding where `pre_process or mtp_process`, the depths
where `mtp_process`, the output layer where `post_process`; with MTP the decoder's final norm
sits with the last decoder layer (transformer_block.py has_final_layernorm_in_this_stage)."""

from simsp.model.params import layer_param_names

EMBEDDING = ("embedding.word", "embedding.position")
FINAL_NORM = ("final_ln.gamma", "final_ln.beta")


def chunk_modules(plan, chunk: int) -> list:
    """The chunk's modules in forward order: the embedding, its layers, then the final norm,
    the depths and the output layer where each is built."""
    modules = (["embedding"] if plan.is_first(chunk) else []) + list(plan.layers(chunk))
    return modules + [name for name, here in (("final_norm", plan.is_norm(chunk)),
                                             ("mtp", plan.is_mtp(chunk)),
                                             ("head", plan.is_last(chunk))) if here]


def module_names(module, grads: dict) -> list[str]:
    """A module's parameter names: the final norm's; the depths' then their copy of the word
    embedding (its own table, kept in step by the embedding group's all-reduce); the output
    layer (the tied word table's copy); the embedding's; a layer's."""
    if module == "final_norm":
        return list(FINAL_NORM)
    if module == "mtp":
        return [n for n in grads if n.startswith("mtp.")] + ["embedding.word"]
    if module == "head":
        return ["output.weight"] if "output.weight" in grads else ["embedding.word"]
    if module == "embedding":
        return list(EMBEDDING)
    return layer_param_names(module)


def chunk_params(plan, chunk: int, grads: dict) -> list[str]:
    """The chunk's parameters in module order, those this rank holds."""
    names = [n for module in chunk_modules(plan, chunk) for n in module_names(module, grads)]
    return [n for n in names if n in grads]
