"""`simsp search`: every Megatron-LM layout of a model on N GPUs (layouts), lower bounds proven
for each (bounds), the survivors simulated until the top K are certain (branch_and_bound), what
it ranks by (objectives) and the words for its results (explain). docs/exploration.md."""
