"""Sharded, reshardable checkpoints on torch.distributed.checkpoint: the store, its state dict, its files, DCP
planners."""
