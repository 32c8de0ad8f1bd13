"""Every code path of the C++ kernels, built and checked on this machine whatever its CPU.

A float32 or bfloat16 call of the ``"cpp"`` backend runs a fast path: the AVX-512 one where the
compiler targets AVX-512, the portable one elsewhere (an AVX2-only x86 CPU, ARM); every other
call runs the general kernels (``normlab_cpu.cpp``). The rest of the suite runs the ``native``
build, which holds only one of the two fast paths. Here the other build variants
(:data:`normlab.kernels.cpu.VARIANTS`) run the correctness checks of the suite:

- ``portable`` (compiled with ``-mno-avx512f``): the portable fast paths;
- ``general`` (no fast path): the general kernels on the calls the fast paths take elsewhere.

Each runs the float64-reference matrix of ``test_functional_matrix.py`` (every op, forward and
every gradient) over float32, bfloat16 and float16 (float64 always runs the general kernels) and
a set of D that covers the loop shapes: 1 and 3 (tail only), 64 (one AVX-512 block), 100 and
1000 (blocks and a masked tail; 1000 spans four 256-element chunks of the portable path), 300
over 260 rows (the four-row groups of the AVX-512 backward, lanes that cut sequences); then the
modulation layouts, ``out_dtype``, and the castings of ``test_exactness.py`` against the Hugging
Face formulas and torch.nn.RMSNorm. Every variant, ``native`` included, also runs the matrix with
the non-temporal stores that only tensors larger than the last-level cache get otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import test_exactness as exactness
import test_functional_matrix as matrix
from normlab.kernels import cpu
from normlab.kernels.cpu import _build

OTHER_VARIANTS = [v for v in cpu.VARIANTS if v != "native"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["float32", "bfloat16", "float16"]
SHAPES = [(4, 1), (2, 3, 1), (4, 3), (2, 3, 3), (4, 64), (2, 3, 64), (4, 100), (2, 3, 100)]
SHAPES += [(4, 1000), (2, 3, 1000), (4, 65, 3), (4, 65, 300)]
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")  # what NL_AVX512 requires


def _shape_id(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _skip_unless_built(variant: str) -> None:
    with cpu.use_variant(variant):
        reason = cpu.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the {variant} build of the C++ kernels is unavailable: {reason}")


@pytest.fixture(params=OTHER_VARIANTS, ids=[f"cpp-{v}" for v in OTHER_VARIANTS])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """``"cpp"``, running the build variant of the parameter (overrides the suite's fixture for
    the tests of this module, those imported from the other files included)."""
    _skip_unless_built(request.param)
    with cpu.use_variant(request.param):
        yield "cpp"


# --- the variants build what they say ----------------------------------------------------------


def test_each_variant_runs_its_own_path() -> None:
    """``portable`` holds the portable fast paths and ``general`` none, on any CPU; ``native``
    holds the AVX-512 ones exactly where this CPU has the instruction sets they need."""
    for variant in cpu.VARIANTS:
        _skip_unless_built(variant)
    flags = set(_build._cpu_signature().split())
    has_avx512 = all(flag in flags for flag in AVX512_FLAGS)
    assert cpu.fast_path("native") == ("avx512" if has_avx512 else "portable")
    assert cpu.fast_path("portable") == "portable"
    assert cpu.fast_path("general") == "general"
    with cpu.use_variant("general"):
        assert cpu.current_variant() == "general" and cpu.fast_path() == "general"
    assert cpu.current_variant() == "native"


def test_the_variants_are_separate_builds() -> None:
    """A variant's flags are part of the build cache key; the default build adds none."""
    sources = _build.source_files()
    flags = {v: ["-O3", *_build.variant_flags(v)] for v in cpu.VARIANTS}
    assert flags["native"] == ["-O3"]
    assert "-DNL_NO_FAST_PATHS" in flags["general"]
    keys = {v: _build.cache_key(sources, "g++", "g++ 12", f) for v, f in flags.items()}
    assert keys["general"] not in (keys["native"], keys["portable"])
    if _build.platform.machine().lower() in _build._X86:
        assert flags["portable"] == ["-O3", "-mno-avx512f"]
        assert keys["portable"] != keys["native"]


def test_the_variant_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_build, "_variant", None)
    monkeypatch.delenv("NORMLAB_CPU_VARIANT", raising=False)
    assert cpu.current_variant() == "native"
    monkeypatch.setenv("NORMLAB_CPU_VARIANT", "portable")
    assert cpu.current_variant() == "portable"
    with cpu.use_variant("general"):
        assert cpu.current_variant() == "general"
    assert cpu.current_variant() == "portable"
    monkeypatch.setenv("NORMLAB_CPU_VARIANT", "avx2")
    with pytest.raises(ValueError, match=r"NORMLAB_CPU_VARIANT: expected one of 'native'.*'avx2'"):
        cpu.current_variant()
    with pytest.raises(ValueError, match=r"^variant: expected one of .*got 'fast'"):
        cpu.set_variant("fast")


# --- the correctness checks, on each variant ----------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", matrix.CASES, ids=matrix.CASE_IDS)
def test_against_float64_reference(
    case: matrix.Case,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    backend: str,
    gen: torch.Generator,
) -> None:
    matrix.run_against_reference(case, backend, shape, dtype, gen)


@pytest.mark.parametrize("d", [1000, 1024], ids=["D1000", "D1024"])
@pytest.mark.parametrize("dtype", DTYPES[:2], ids=DTYPE_IDS[:2])
@pytest.mark.parametrize("case", matrix.CASES, ids=matrix.CASE_IDS)
@pytest.mark.parametrize("variant", cpu.VARIANTS)
def test_streamed_stores_against_float64_reference(
    variant: str,
    case: matrix.Case,
    dtype: torch.dtype,
    d: int,
    gen: torch.Generator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With non-temporal stores forced on: rows of D = 1000 start on alternating alignments
    (partial lines at both ends), rows of D = 1024 on whole lines."""
    _skip_unless_built(variant)
    monkeypatch.setattr(cpu, "_stream", lambda x: 1)
    with cpu.use_variant(variant):
        matrix.run_against_reference(case, "cpp", (2, 3, d), dtype, gen)


test_modulation_layouts = matrix.test_modulation_layouts
test_out_dtype = matrix.test_out_dtype
test_statistics_do_not_cross_tokens = matrix.test_statistics_do_not_cross_tokens
test_layer_norm_over_one_column_has_zero_input_gradient = (
    exactness.test_layer_norm_over_one_column_has_zero_input_gradient
)
test_llama_casting_against_hf_llama = exactness.test_llama_casting_against_hf_llama
test_gemma_casting_against_hf_gemma3 = exactness.test_gemma_casting_against_hf_gemma3
test_gemma_casting_against_hf_olmo2 = exactness.test_gemma_casting_against_hf_olmo2
test_rms_norm_module_against_torch_nn_rms_norm = (
    exactness.test_rms_norm_module_against_torch_nn_rms_norm
)


# --- the benchmark's peers of the variants ------------------------------------------------------


@pytest.mark.parametrize("variant", OTHER_VARIANTS)
def test_the_bench_peer_runs_both_directions_on_its_variant(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``normlab bench --peers normlab:cpp-<variant>``: the forward and the backward of a timed
    step both call the kernels of that variant, and the result is the op's."""
    from normlab.bench import peers

    _skip_unless_built(variant)
    seen: list[str] = []
    library = cpu.CppProvider._lib

    def spy(self: cpu.CppProvider):  # each kernel call, forward or backward, asks for the library
        seen.append(cpu.current_variant())
        return library(self)

    monkeypatch.setattr(cpu.CppProvider, "_lib", spy)
    name = f"normlab:cpp-{variant}"
    assert name in peers.known_peers() and name not in peers.default_peers(torch.device("cpu"))
    problem = peers.make_problem("rms", torch.bfloat16, torch.device("cpu"), 8, 100)
    runner = peers.run_peer_once(
        peers.peer_function(name, "rms", problem.device), problem, "fwd+bwd"
    )
    assert seen == [variant, variant]  # one forward, one backward
    assert cpu.current_variant() == "native"
    assert peers.max_error(runner) < 0.05
