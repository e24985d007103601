"""The training loop on its own: configuration, data, one step, the loop, loss scaling, progress."""
