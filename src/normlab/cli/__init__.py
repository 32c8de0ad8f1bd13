"""Command-line interface: ``normlab explain | compare | report | bench | audit | coord-check``."""

import normlab.cli.audit_cmd as _audit_cmd  # noqa: F401  (registers the command)
import normlab.cli.bench_cmd as _bench_cmd  # noqa: F401  (registers the command)
import normlab.cli.compare_cmd as _compare_cmd  # noqa: F401  (registers the command)
import normlab.cli.coord_check_cmd as _coord_check_cmd  # noqa: F401  (registers the command)
import normlab.cli.report_cmd as _report_cmd  # noqa: F401  (registers the command)
from normlab.cli import explain_cmd  # noqa: F401  (registers the command)
from normlab.cli.app import app
from normlab.cli.errors import main_guard


def main() -> None:
    """Entry point of the ``normlab`` console script (errors: :func:`main_guard`)."""
    main_guard(app)


__all__ = ["app", "main"]
