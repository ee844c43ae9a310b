"""Regression runs of fxmobile over torchvision's model zoo."""
