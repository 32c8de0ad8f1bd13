"""normlab compare: models, data, training runner, analysis, report, run format, CLI."""
