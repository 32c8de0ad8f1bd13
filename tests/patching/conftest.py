"""replace_norms: swapping a model's norms in place."""
