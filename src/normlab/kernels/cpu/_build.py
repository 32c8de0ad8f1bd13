"""Build the C++ kernels on first use, cache the shared library, load it with ctypes.

Nothing is compiled at import. The first call of :func:`load_library` compiles the C++ sources
shipped in this package (``normlab_cpu.cpp``, which includes ``common.h``, ``avx512.h``,
``forward.h`` and ``backward.h``; :data:`MAIN_SOURCE`, :func:`source_files`) with the system C++
compiler (it includes no PyTorch header), writes the library atomically into a cache folder keyed
by a hash of every source file, the compiler, its flags (a build variant's among them) and this
CPU's instruction-set flags, and loads it. Later calls and later processes reuse it. The sources
are compiled from where the package is installed, so a compiler error names the real file and line
(``.../normlab/kernels/cpu/forward.h:123:5: error: ...``); a package that is not on disk (a zip)
has them copied to a temporary folder first. When no compiler is found or every flag set fails,
the reason is kept (:func:`build_error`, compiler output from its first error on) and the backend
reports itself unavailable, so ``"auto"`` falls back.

Build variants (:data:`VARIANTS`), so that every code path of the kernels is built and tested on
one machine; each is its own library, built only when first asked for:

- ``"native"`` (the default): ``-march=native``. float32 and bfloat16 calls run the AVX-512 fast
  paths where the CPU has AVX-512, the portable fast paths elsewhere.
- ``"portable"``: ``-march=native -mno-avx512f`` on x86 (the native flags elsewhere): the
  portable fast paths, compiled for the CPU without AVX-512, as an AVX2-only CPU runs them.
- ``"general"``: ``-DNL_NO_FAST_PATHS``: every call runs the general kernels (those that serve
  float16, float64 and mixed dtypes in the other variants).

:func:`fast_path` says which path a loaded library runs (``normlab_fast_path()`` of the library).

A compilation takes tens of seconds on a small machine, so it announces itself once, before it
starts, with a WARNING on the logger ``normlab.kernels.cpu._build`` (``logging``; silence it with
``logging.getLogger("normlab.kernels.cpu").setLevel(logging.ERROR)``). Loading a cached
library says nothing.

Environment:
    ``NORMLAB_CPU_KERNELS=0``  never build or load the kernels (the backend is unavailable).
    ``NORMLAB_CXX``            the compiler to use (default: ``$CXX``, then g++, c++, clang++).
    ``NORMLAB_CACHE_DIR``      cache root (default: ``$XDG_CACHE_HOME/normlab`` or ``~/.cache``).
    ``NORMLAB_CPU_VARIANT``    the build variant the ``"cpp"`` backend loads (default ``native``;
                               :func:`set_variant` changes it in a running process).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.resources
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator
from importlib.resources.abc import Traversable
from pathlib import Path

_COMMON_FLAGS = (
    "-O3",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-ffp-contract=off",  # no fused multiply-add: every product is rounded like PyTorch's
    "-fno-math-errno",
    "-fvisibility=hidden",
)
_ARCH_FLAGS = (("-march=native",), ("-mcpu=native",), ())
_OPENMP_FLAGS = (("-fopenmp",), ("-fopenmp-simd", "-DNL_OMP_SIMD"), ())

ABI_VERSION = 2  # normlab_abi_version() of the library this module's structs describe

VARIANTS: tuple[str, ...] = ("native", "portable", "general")
"""The build variants of the kernels (module docstring); ``"native"`` is the default."""
FAST_PATHS: tuple[str, ...] = ("general", "portable", "avx512")
"""The path of float32 and bfloat16 calls, by the library's ``normlab_fast_path()`` code."""
_X86 = ("x86_64", "amd64", "i386", "i686")

MAIN_SOURCE = "normlab_cpu.cpp"  # the file compiled; it includes the other sources
_SOURCE_SUFFIXES = (".cpp", ".h")
_ERROR_CHARS = 4000  # compiler output kept per failed flag set, from its start (the first error)

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL | None] = {}  # by variant, once tried (None: unavailable)
_errors: dict[str, str] = {}  # by variant: why it is unavailable
_variant: str | None = None  # set_variant's choice; None: NORMLAB_CPU_VARIANT or "native"


def check_variant(variant: object, where: str = "variant") -> str:
    """``variant`` when it is one of :data:`VARIANTS`, else ``ValueError`` naming ``where`` (the
    argument or environment variable it came from)."""
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ValueError(
            f"{where}: expected one of {', '.join(map(repr, VARIANTS))}, got {variant!r}"
        )
    return variant


def current_variant() -> str:
    """The build variant the ``"cpp"`` backend uses now: the one :func:`set_variant` chose, else
    ``NORMLAB_CPU_VARIANT``, else ``"native"``."""
    if _variant is not None:
        return _variant
    chosen = os.environ.get("NORMLAB_CPU_VARIANT", "").strip() or "native"
    return check_variant(chosen, "NORMLAB_CPU_VARIANT")


def set_variant(variant: str | None) -> None:
    """Make the ``"cpp"`` backend use build variant ``variant`` in this process (None: back to
    ``NORMLAB_CPU_VARIANT`` or ``"native"``). Process-wide, for tests and benchmarks that run
    the variants side by side; a library is built the first time its variant is used."""
    global _variant
    _variant = None if variant is None else check_variant(variant)


@contextlib.contextmanager
def use_variant(variant: str) -> Iterator[None]:
    """Inside the ``with`` block the ``"cpp"`` backend uses build variant ``variant`` (see
    :func:`set_variant`); the earlier choice comes back after it."""
    previous = _variant
    set_variant(variant)
    try:
        yield
    finally:
        set_variant(previous)


def variant_flags(variant: str) -> tuple[str, ...]:
    """The compiler flags a build variant adds to every flag set (module docstring)."""
    check_variant(variant)
    if variant == "portable":
        return ("-mno-avx512f",) if platform.machine().lower() in _X86 else ()
    if variant == "general":
        return ("-DNL_NO_FAST_PATHS",)
    return ()


def compiler() -> str | None:
    """The C++ compiler that would be used, or None when none is on PATH."""
    for candidate in (
        os.environ.get("NORMLAB_CXX"),
        os.environ.get("CXX"),
        "g++",
        "c++",
        "clang++",
    ):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def cache_dir() -> Path:
    """Folder holding the built libraries."""
    if os.environ.get("NORMLAB_CACHE_DIR"):
        return Path(os.environ["NORMLAB_CACHE_DIR"]) / "cpu-kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "normlab" / "cpu-kernels"


def source_root() -> Traversable:
    """The folder of the C++ sources: this package's own (package data)."""
    return importlib.resources.files(__package__)


def source_files(root: Traversable | None = None) -> dict[str, str]:
    """The C++ sources (``*.cpp``, ``*.h``) of ``root`` (default :func:`source_root`), by name."""
    root = source_root() if root is None else root
    found = {
        item.name: item.read_text(encoding="utf-8")
        for item in root.iterdir()
        if item.is_file() and item.name.endswith(_SOURCE_SUFFIXES)
    }
    if MAIN_SOURCE not in found:
        raise RuntimeError(f"the C++ kernel source {MAIN_SOURCE} is missing from {root}")
    return dict(sorted(found.items()))


def _cpu_signature() -> str:
    """The instruction-set flags of this CPU (``-march=native`` depends on them)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(sources: dict[str, str], cxx: str, version: str, flags: list[str]) -> str:
    """The build cache folder's name: a hash of every source file (name and text), the compiler
    and its version, the flags and this CPU's instruction-set flags."""
    digest = hashlib.sha256()
    for name, text in sorted(sources.items()):
        digest.update(f"{name}\0{text}\0".encode())
    digest.update("\n".join([cxx, version, " ".join(flags), _cpu_signature()]).encode())
    return digest.hexdigest()[:20]


def _compiler_version(cxx: str) -> str:
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.splitlines()[0] if done.stdout else ""


def _compile(cxx: str, flags: list[str], target: Path) -> str | None:
    """Compile the sources of :func:`source_root` to ``target`` atomically; None on success, else
    the compiler's output from its start (which holds the first error), at most _ERROR_CHARS."""
    root = source_root()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="normlab-build-") as tmp:
        if isinstance(root, Path):  # on disk: compiled in place, so errors name the real files
            folder = root
        else:
            folder = Path(tmp) / "src"
            folder.mkdir()
            for name, text in source_files(root).items():
                (folder / name).write_text(text, encoding="utf-8")
        out = Path(tmp) / "libnormlab_cpu.so"
        try:
            done = subprocess.run(
                [cxx, *flags, str(folder / MAIN_SOURCE), "-o", str(out)],
                capture_output=True,
                text=True,
                timeout=600,
            )
        except (OSError, subprocess.SubprocessError) as err:
            return f"{cxx} could not run: {err}"
        if done.returncode != 0:
            text = (done.stderr or done.stdout).strip()
            return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + "\n[...]"
        fd, staged = tempfile.mkstemp(prefix=".libnormlab_cpu.", suffix=".so", dir=target.parent)
        os.close(fd)
        shutil.copyfile(out, staged)
        os.replace(staged, target)
    return None


def _no_compiler_message() -> str:
    """Why :func:`compiler` found nothing, naming the variables that were set but not found."""
    tried = [
        f"{var}={os.environ[var]!r} is not an executable on PATH"
        for var in ("NORMLAB_CXX", "CXX")
        if os.environ.get(var)
    ]
    found = "; ".join([*tried, "no g++, c++ or clang++ on PATH"])
    return f"no C++ compiler found ({found}); set NORMLAB_CXX to one, or install g++"


def _build_and_load(variant: str) -> ctypes.CDLL:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(_no_compiler_message())
    version = _compiler_version(cxx)
    sources = source_files()
    errors = []
    announced = False
    for arch in _ARCH_FLAGS:
        for openmp in _OPENMP_FLAGS:
            flags = [*_COMMON_FLAGS, *arch, *openmp, *variant_flags(variant)]
            target = cache_dir() / cache_key(sources, cxx, version, flags) / "libnormlab_cpu.so"
            if not target.exists():
                if not announced:
                    _log.warning(
                        "compiling normlab's C++ CPU kernels%s with %s (once; cached in %s); "
                        "this takes a few tens of seconds...",
                        "" if variant == "native" else f" ({variant} variant)",
                        cxx,
                        cache_dir(),
                    )
                    announced = True
                err = _compile(cxx, flags, target)
                if err is not None:
                    errors.append(f"{' '.join(flags)}: {err}")
                    continue
            lib = ctypes.CDLL(str(target))
            try:
                lib.normlab_abi_version.restype = ctypes.c_int
                lib.normlab_fast_path.restype = ctypes.c_int
                lib.normlab_forward.restype = None
                lib.normlab_backward.restype = None
            except AttributeError as err:
                errors.append(f"{target}: {err}")
                continue
            if lib.normlab_abi_version() != ABI_VERSION:
                errors.append(f"{target}: unexpected ABI version")
                continue
            if errors:  # the preferred flags failed: the kernels work, but slower
                warnings.warn(
                    "normlab C++ kernels built with fallback flags "
                    f"{' '.join(flags)!r}; the preferred ones failed:\n" + "\n".join(errors),
                    RuntimeWarning,
                    stacklevel=3,
                )
            return lib
    raise RuntimeError("the C++ kernels did not compile:\n" + "\n".join(errors))


def load_library(variant: str | None = None) -> ctypes.CDLL | None:
    """The loaded kernel library of build variant ``variant`` (default :func:`current_variant`),
    building it on the first call; None when unavailable."""
    variant = current_variant() if variant is None else check_variant(variant)
    if variant in _libraries:
        return _libraries[variant]
    with _lock:
        if variant in _libraries:
            return _libraries[variant]
        library = None
        if os.environ.get("NORMLAB_CPU_KERNELS", "1").strip().lower() in ("0", "false", "no"):
            _errors[variant] = "disabled by NORMLAB_CPU_KERNELS=0"
        else:
            try:
                library = _build_and_load(variant)
            except (RuntimeError, OSError) as err:
                _errors[variant] = str(err)
        _libraries[variant] = library
    return library


def build_error(variant: str | None = None) -> str | None:
    """Why the kernels of build variant ``variant`` (default :func:`current_variant`) are
    unavailable (None when they loaded or were not tried yet)."""
    return _errors.get(current_variant() if variant is None else check_variant(variant))


def fast_path(variant: str | None = None) -> str | None:
    """The path that float32 and bfloat16 calls run in build variant ``variant`` (default
    :func:`current_variant`): one of :data:`FAST_PATHS`, ``"avx512"`` where the native build
    targets AVX-512; None when that library is unavailable. Builds it on the first call."""
    library = load_library(variant)
    return None if library is None else FAST_PATHS[library.normlab_fast_path()]
