"""The C++ kernel sources as files: shipped as package data, hashed for the build cache, compiled
from where they lie (so a compiler error names the real file and line), formatted by the repo's
``.clang-format``."""

from __future__ import annotations

import fnmatch
import logging
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from normlab.kernels import cpu
from normlab.kernels.cpu import _build

REPO = Path(__file__).resolve().parents[2]
CLANG_FORMAT_MAJOR = 21  # the version scripts/setup.sh installs (pip's clang-format wheel)


def _source_dir() -> Path:
    root = _build.source_root()
    assert isinstance(root, Path), "the package is expected on disk in the test environment"
    return root


def test_the_sources_are_files_with_one_main_file() -> None:
    sources = _build.source_files()
    assert _build.MAIN_SOURCE in sources
    assert {"common.h", "avx512.h", "forward.h", "backward.h"} <= set(sources)
    main = sources[_build.MAIN_SOURCE]
    for header in sources:
        if header.endswith(".h"):
            assert f'#include "{header}"' in "".join(sources.values()), f"{header} is not used"
    assert 'extern "C"' in main and "normlab_forward" in main and "normlab_backward" in main
    assert not (_source_dir() / "_source.py").exists()


def test_package_data_ships_every_source() -> None:
    """pyproject's package-data patterns match each C++ source, so wheels and sdists carry them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["normlab"]
    package = REPO / "src" / "normlab"
    for name in _build.source_files():
        relative = (_source_dir() / name).relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} not shipped"


def test_the_cache_key_covers_every_source_file() -> None:
    sources = _build.source_files()
    key = _build.cache_key(sources, "g++", "g++ 12", ["-O3"])
    assert key == _build.cache_key(dict(reversed(sources.items())), "g++", "g++ 12", ["-O3"])
    for name in sources:
        edited = {**sources, name: sources[name] + "\n// edited\n"}
        assert _build.cache_key(edited, "g++", "g++ 12", ["-O3"]) != key, name
    assert _build.cache_key(sources, "g++", "g++ 13", ["-O3"]) != key
    assert _build.cache_key(sources, "g++", "g++ 12", ["-O2"]) != key
    assert _build.cache_key(sources, "clang++", "g++ 12", ["-O3"]) != key


@pytest.mark.skipif(_build.compiler() is None, reason="no C++ compiler")
def test_a_compiler_error_names_the_real_file_and_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A syntax error injected into a copy of the sources: build_error() and the backend's
    unavailable reason carry g++'s first error line, which names that copy's header and line."""
    copy = tmp_path / "src"
    shutil.copytree(_source_dir(), copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    lines = (copy / "forward.h").read_text(encoding="utf-8").splitlines()
    after = lines.index("namespace {") + 1  # a declaration context: "expected unqualified-id"
    lines.insert(after, "this is not C++;")
    (copy / "forward.h").write_text("\n".join(lines) + "\n", encoding="utf-8")
    bad_line = after + 1  # 1-based number of the inserted line

    monkeypatch.setattr(_build, "source_root", lambda: copy)
    monkeypatch.setattr(_build, "_ARCH_FLAGS", ((),))  # one flag set: one compile of ~2 s
    monkeypatch.setattr(_build, "_OPENMP_FLAGS", ((),))
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_build, "_libraries", {})
    monkeypatch.setattr(_build, "_errors", {})
    with caplog.at_level(logging.ERROR, logger="normlab"):
        assert _build.load_library() is None
    where = f"{copy / 'forward.h'}:{bad_line}:"
    first_error = next(line for line in _build.build_error().splitlines() if "error:" in line)
    assert first_error.strip().startswith(where), first_error
    reason = cpu.unavailable_reason()
    assert reason is not None and where in reason and "error:" in reason, reason
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.so"))


def _clang_format() -> tuple[str | None, str]:
    """The clang-format to use (next to this Python first, as a venv installs it; then PATH) and
    why none fits."""
    beside = Path(sys.executable).parent / "clang-format"
    candidates = [str(beside)] if beside.exists() else []
    on_path = shutil.which("clang-format")
    if on_path:
        candidates.append(on_path)
    if not candidates:
        return None, "clang-format is not installed (scripts/setup.sh installs it with pip)"
    found = []
    for exe in candidates:
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        m = re.search(r"clang-format version (\d+)\.", out.stdout)
        if m and int(m.group(1)) == CLANG_FORMAT_MAJOR:
            return exe, ""
        found.append(f"{exe}: {out.stdout.strip() or out.stderr.strip()}")
    return None, (
        f"the style is checked with clang-format {CLANG_FORMAT_MAJOR} (scripts/setup.sh installs "
        f"it); other versions format differently. Found: {'; '.join(found)}"
    )


def test_the_sources_are_formatted() -> None:
    """``clang-format --dry-run --Werror`` with the repo's .clang-format finds nothing to change."""
    exe, why = _clang_format()
    if exe is None:
        pytest.skip(why)
    files = [str(_source_dir() / name) for name in _build.source_files()]
    done = subprocess.run(
        [exe, f"--style=file:{REPO / '.clang-format'}", "--dry-run", "--Werror", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (
        "C++ sources not formatted; run clang-format -i src/normlab/kernels/cpu/*.cpp "
        f"src/normlab/kernels/cpu/*.h\n{done.stderr[:3000]}"
    )
