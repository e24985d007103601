"""Starting ranks: preflight checks, this node's rank processes, the local multi-rank harness, the worker entry."""
