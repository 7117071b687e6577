"""Every kernel launch the ops make, compiled for NVIDIA targets on a machine without a GPU (Triton's
compiler and bundled ptxas): it compiles, fits the target's shared memory, and the configs that run
untuned do not spill. The launches are recorded from the ops layer (tests/gpu_compile.py), so a new
launch path is compiled here without editing this file. Results are cached on disk by kernel source
hash (~/.cache/fastbert/gpu-compile), so only changed kernels recompile."""
import collections
import importlib
import pkgutil

import pytest
from gpu_compile import HEAD_DIMS, HIDDENS, TARGETS, problems, run_in_compiler, run_sweep

import fastbert.kernels as kernels_pkg

# The default run: fp16 and fp32 (16-bit and 32-bit tiles), head dims 64 and 128 (the BLOCK_D sizes the
# models use most), the smallest and largest hidden size, the variants with the most flags, the configs
# that run untuned, on sm_90 (Hopper's own code path). The slow tests add bf16, head dims 32/80/96, every
# hidden size, sm_80 and sm_89 (99 KB of shared memory) and every config the autotuner may choose.
FAST = dict(dtypes=("float16", "float32"), head_dims=(64, 128), hiddens=(768, 8192), targets=(90,), quick=True)

# Spills still measured in a default config: open defects, capped at what the full sweep measured
# (bf16/fp16/fp32, head dims 32-128, every hidden size, sm_80/89/90), so that any new spill, or a larger
# one, fails. None is left: the relative-attention backward and the attention dk/dv pass take fp32 head
# dims past 64 in two column chunks.
# (kernel, dtype, target) -> the most stack bytes allowed.
KNOWN_SPILLS = {}


def _unexpected(rows):
    def known(r):
        cap = KNOWN_SPILLS.get((r["kernel"], r["dtype"], r["target"]))
        return cap is not None and r["spills"] and r["spills"] <= cap and not r["error"]
    return problems([r for r in rows if not known(r)])


def _kernels():
    """Every @triton.jit kernel (name ending in _kernel) of fastbert.kernels."""
    names = set()
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        module = importlib.import_module(f"fastbert.kernels.{info.name}")
        names |= {f"{info.name}.{n}" for n, obj in vars(module).items() if n.startswith("_") and n.endswith("_kernel")
                  and obj.fn.__module__ == module.__name__}                  # defined there, not imported
    return names


@pytest.fixture(scope="module")
def fast_rows():
    return run_sweep(scope="default", **FAST)


def test_every_kernel_is_launched_by_the_ops(fast_rows):
    launched = {r["kernel"] for r in fast_rows}
    assert launched == _kernels(), f"kernels no op launches: {_kernels() - launched}"


def test_default_configs_compile_fit_and_do_not_spill(fast_rows):
    assert _unexpected(fast_rows) == []
    per_kernel = collections.Counter(r["kernel"] for r in fast_rows)
    assert min(per_kernel.values()) >= 2, per_kernel          # fp16 and fp32 at least


def test_fp32_attention_takes_tensor_cores(fast_rows):
    """fp32 products go through TF32 (or 3xTF32), never the unrolled FMAs of input_precision='ieee'."""
    fp32 = [r for r in fast_rows if r["dtype"] == "fp32" and "DOT_PRECISION" in r["variant"]]
    assert fp32 and all("DOT_PRECISION=ieee" not in r["variant"] for r in fp32)


def test_token_scaled_offsets_are_64_bit():
    """At 400k packed tokens DeBERTa's c2p / p2c head stride is tokens * 2k, so h * stride_ch passes 2^31
    for heads >= 11; the compiled IR must widen every such stride to 64 bits before any multiply (and
    LayerNorm's dropout counter must not multiply rows by N in 32 bits)."""
    found = run_in_compiler("token_offset_report", tokens=400_000)
    kernels = {"relative_attention._relative_attention_fwd_kernel", "relative_attention._relative_attention_bwd_kernel",
               "add_layer_norm._add_layer_norm_fwd_kernel", "add_layer_norm._add_layer_norm_bwd_kernel"}
    assert set(found) == kernels, found
    assert all(not narrow for narrow in found.values()), found


@pytest.mark.slow
def test_default_configs_every_dtype_head_dim_hidden_size_and_target():
    """The config each launch runs untuned, for every dtype, head dim and hidden size the ops take, on
    sm_80, sm_89 and sm_90: compiles, fits, does not spill."""
    rows = run_sweep(scope="default", dtypes=("float16", "bfloat16", "float32"), head_dims=HEAD_DIMS,
                     hiddens=HIDDENS, targets=TARGETS, quick=True, timeout=7200)
    assert _unexpected(rows) == []
    assert {r["target"] for r in rows} == {f"sm_{cc}" for cc in TARGETS}


@pytest.mark.slow
def test_every_choosable_config_fits_shared_memory():
    """Every config the autotuner may choose (after the prune for the target's shared memory) compiles
    and fits that target's per-block limit; sm_89 has the least (99 KB)."""
    rows = run_sweep(scope="all", dtypes=("float16", "float32"), head_dims=(64, 128), hiddens=(768, 8192),
                     targets=(89, 90), quick=True, timeout=7200)
    assert _unexpected(rows) == []
    assert any(not r["default"] for r in rows)
