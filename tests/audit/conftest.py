"""normlab audit: the black-box norm audit, its options and the model zoo."""
