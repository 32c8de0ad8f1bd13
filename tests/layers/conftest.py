"""The nn.Module layers: drop-in modules, the norm registry, casting conventions."""
