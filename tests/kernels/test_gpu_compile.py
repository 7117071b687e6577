"""Every kernel launch the ops make, compiled for NVIDIA targets on a machine without a GPU (Triton's
compiler and bundled ptxas): it compiles, fits the target's shared memory, and no config a launch may
run with spills (registers to local memory), the config that runs untuned or any other the autotuner
may choose after the kernels' prunes (registers, shared memory). The launches are recorded from the
ops layer (tests/gpu_compile.py), so a new launch path is compiled here without editing this file.
Results are cached on disk by kernel source hash (~/.cache/fastbert/gpu-compile), so only changed
kernels recompile."""
import importlib
import pkgutil

import pytest
from gpu_compile import problems, run_in_compiler, run_sweep

import fastbert.kernels as kernels_pkg

# The fast run: every choosable config of the launches with the most flags (and of relative attention's
# serving forward, whose prune keeps larger tiles without dropout: see record_ops), for fp16 and fp32 (3xTF32
# and TF32), head dim 64 (BERT-base and most models), the largest hidden size, on sm_90 (Hopper's own
# code path). The slow test adds head dims 32, 80 (64 + 16 columns in two chunks) and 128 (fp32 dk/dv
# in two chunks) and sm_80 (MMA v2); bf16, head dim 96 and sm_89 compile the same code paths and are in the
# full sweep (bench/gpu_resources.py --scope all, about 25 minutes on 2 cores with a cold cache; with
# --all-variants every flag combination, not only record_ops' quick ones).
FAST = dict(dtypes=("float16", "float32"), head_dims=(64,), hiddens=(8192,), targets=(90,), quick=True)

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
    return run_sweep(scope="all", **FAST)


def test_every_kernel_is_launched_by_the_ops(fast_rows):
    launched = {r["kernel"] for r in fast_rows}
    assert launched == _kernels(), f"kernels no op launches: {_kernels() - launched}"


def test_choosable_configs_compile_fit_and_do_not_spill(fast_rows):
    assert problems(fast_rows) == []
    assert any(not r["default"] for r in fast_rows)           # configs past the untuned one


def test_fp32_attention_takes_tensor_cores(fast_rows):
    """fp32 products go through 3xTF32, or TF32 where torch allows it (both compiled), never the unrolled
    FMAs of input_precision='ieee'."""
    fp32 = [r for r in fast_rows if r["dtype"] == "fp32" and "DOT_PRECISION" in r["variant"]]
    precisions = {v.split("=")[1] for r in fp32 for v in r["variant"].split(",") if v.startswith("DOT_PRECISION=")}
    assert precisions == {"tf32", "tf32x3"}, precisions


def test_every_launch_keeps_configs_to_choose_from():
    """The prunes leave every launch (every dtype, head dim, hidden size and flag) at least one config on
    sm_80, sm_89 and sm_90, and the attention passes more than one to time."""
    counts = run_in_compiler("choosable_counts")
    assert min(lo for lo, _ in counts.values()) >= 1, counts
    for name in ("attention._attention_fwd_kernel", "attention._attention_bwd_dq_kernel",
                 "attention._attention_bwd_dkdv_kernel", "relative_attention._relative_attention_fwd_kernel"):
        assert counts[name][1] >= 3, (name, counts[name])


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
def test_every_choosable_config_more_head_dims_and_sm_80():
    """Every config the autotuner may choose, for head dims 32, 64, 80 and 128 on sm_80 and sm_90:
    compiles, fits, does not spill."""
    rows = run_sweep(scope="all", dtypes=("float16", "float32"), head_dims=(32, 64, 80, 128), hiddens=(384, 8192),
                     targets=(80, 90), quick=True, timeout=7200)
    assert problems(rows) == []
    assert {r["target"] for r in rows} == {"sm_80", "sm_90"}
