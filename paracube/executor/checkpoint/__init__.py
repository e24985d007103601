"""Sharded, reshardable checkpoints on torch.distributed.checkpoint: the store, its files, DCP planners."""
