"""normlab's version, read once from the package metadata (pyproject.toml is where it is
written)."""

from __future__ import annotations


def _read_version() -> str:
    """normlab's version: the installed distribution's metadata (``importlib.metadata``), so
    that pyproject.toml is the only place it is written. Without metadata (a source tree on
    ``sys.path``, not installed), the version in that tree's pyproject.toml; failing both,
    ``"0+unknown"``."""
    from importlib import metadata

    try:
        return metadata.version("normlab")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "0+unknown"
    version = project.get("version")
    return version if project.get("name") == "normlab" and isinstance(version, str) else "0+unknown"


__version__ = _read_version()


def source_commit() -> str:
    """The git commit of the source tree this normlab is imported from (an editable install or
    a checkout on ``sys.path``): the short hash of ``HEAD``, with ``-dirty`` when a tracked file
    has uncommitted changes; ``"unknown"`` outside a git checkout or without git. What a study
    document records as the code that produced its numbers."""
    import subprocess
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])

    def git(*args: str) -> str:
        command = ["git", "-C", root, *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head
