"""normlab bench: timing the backends and its options."""
