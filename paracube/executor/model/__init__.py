"""The GPT (and llama) assembled from one tensor mode's layers: blocks, the stage's model, initialization."""
