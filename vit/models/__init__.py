"""The model: the ViT, its preprocessing, attention rollout and its pictures, checkpoints, the Hub's layout."""
