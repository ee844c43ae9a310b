"""Backend-agnostic torch.fx passes, one module each; ``pipeline`` holds their order."""
