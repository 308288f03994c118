"""The GPU stack lifecycle: stack.yaml model, compatibility matrix, upgrade planning, git commits."""
