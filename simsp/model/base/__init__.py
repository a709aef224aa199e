"""What every block is built from: the shared numpy math, the ops on a rank, the
tensor-parallel linear layers, the dropout sites and the stash of tensors kept for backward."""
