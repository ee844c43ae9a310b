"""The TorchScript stage: scripting, freezing and the rewrites every backend shares."""
