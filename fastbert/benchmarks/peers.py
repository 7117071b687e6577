"""The CPU engines a user picks for BERT-family embeddings, built as their users build them.

Every peer takes a list of texts and returns (len, dim) float32 embeddings computed the way the
checkpoint's sentence-transformers pipeline does (mean or CLS pooling, its Normalize module). Each
tokenizes with the checkpoint's Hugging Face fast tokenizer (truncating at the checkpoint's
max_seq_length) and, as sentence-transformers does, sorts the texts by length (longest first)
before cutting batches, then puts the results back in input order.

  ONNX Runtime        transformers' model with attn_implementation="eager" exported by torch.onnx,
                      then onnxruntime.transformers.optimizer (model_type "bert"): the graph must hold
                      fused Attention, SkipLayerNormalization and BiasGelu nodes (checked here, so
                      a peer that silently lost its fusions cannot enter the table). The sdpa
                      export fuses none of them.
  ONNX Runtime int8   that optimized graph through onnxruntime's dynamic quantization with the
                      settings of sentence-transformers' export_dynamic_quantized_onnx_model for this
                      CPU, as its docs tell users to pick (optimum's AutoQuantizationConfig, ort_int8_recipe):
                      uint8 activations, symmetric weights per channel, no reduce_range; int8 weights
                      on AVX-512 (VNNI) and ARM, uint8 on AVX2 (on this VNNI guest the avx2 recipe ran
                      0.6x the avx512_vnni one's speed).
  OpenVINO            openvino.convert_model of the eager ONNX export (dynamic batch and length),
                      saved as IR and read back (converted in a child process: ov_convert),
                      compiled for CPU with INFERENCE_PRECISION_HINT f32 and the LATENCY hint.
  OpenVINO int8       nncf.quantize (ModelType.TRANSFORMER) of that model, calibrated on texts that
                      the caller keeps disjoint from the timed ones.
  CTranslate2         ctranslate2.converters.TransformersConverter, Encoder with compute_type
                      float32 / int8; its oneDNN and MKL backends (CT2_USE_MKL, read at import) are
                      timed in child processes first and the faster one is used, as its docs advise.
Each builder raises Unavailable(reason) when its package is missing; `build` collects the reasons.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

ONNX_OPSET = 17
# the fused ops the ORT peer must have: at least one per layer each
ORT_FUSED_OPS = ("Attention", "SkipLayerNormalization", "BiasGelu")


class Unavailable(RuntimeError):
    """This peer cannot run here (a package missing, an unsupported model); the message says why."""


@dataclass
class Peer:
    name: str
    precision: str                                   # "fp32" or "int8"
    encode: Callable[[list], torch.Tensor]           # texts -> (len, dim) float32
    note: str = ""


class HFFrontEnd:
    """The part every peer shares: HF fast tokenizer, length sort, batches, pooling, input order."""

    def __init__(self, model_dir, batch_size: int):
        import transformers

        from fastbert.encoder import read_sentence_config

        cfg = read_sentence_config(model_dir)
        self.transformer_dir = Path(cfg["model_dir"])
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.transformer_dir), use_fast=True)
        self.max_length = cfg["max_seq_length"] or self.tokenizer.model_max_length
        self.pooling, self.normalize = cfg["pooling"], cfg["normalize"]
        if any(mode not in ("mean", "cls") for mode in self.pooling):
            raise Unavailable(f"peers pool with mean or cls only, this checkpoint uses {self.pooling}")
        self.batch_size = batch_size
        self.config = transformers.AutoConfig.from_pretrained(str(self.transformer_dir))

    def batches(self, texts: list, return_tensors: str = "np"):
        """(input indices, tokenizer output) per batch, longest texts first (sentence-transformers' order)."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors=return_tensors)
            yield idx, enc

    def pool(self, hidden: np.ndarray, mask: np.ndarray) -> torch.Tensor:
        h = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))
        m = torch.from_numpy(np.asarray(mask)).unsqueeze(-1).float()
        parts = []
        for mode in self.pooling:
            parts.append(h[:, 0] if mode == "cls" else (h * m).sum(1) / m.sum(1).clamp(min=1e-9))
        v = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
        return torch.nn.functional.normalize(v, dim=1) if self.normalize else v

    def encoder(self, run) -> Callable[[list], torch.Tensor]:
        """texts -> embeddings in input order, with run(tokenizer output) -> last hidden state (numpy)."""
        def encode(texts):
            out = None
            for idx, enc in self.batches(texts):
                v = self.pool(run(enc), enc["attention_mask"])
                if out is None:
                    out = torch.empty(len(texts), v.shape[1])
                out[torch.tensor(idx)] = v
            return out
        return encode


def _need(module: str, extra: str = "peers"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Unavailable(f"{module} is not installed (pip install 'fastbert[{extra}]'): {exc}") from exc


# ---- ONNX export (shared by ONNX Runtime and OpenVINO) --------------------------------------------------

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def export_onnx(model, sample, path) -> Path:
    """A transformers encoder -> ONNX file (TorchScript exporter, dynamic batch and length) giving
    last_hidden_state; `sample`, a tokenizer's output holding INPUT_NAMES, is what the exporter traces."""

    class Positional(torch.nn.Module):   # the exporter passes inputs by position; the model's order varies
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUT_NAMES, "last_hidden_state")}
    with torch.no_grad():
        torch.onnx.export(Positional(), tuple(sample[n] for n in INPUT_NAMES), str(path),
                          input_names=list(INPUT_NAMES), output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=ONNX_OPSET, dynamo=False)
    return Path(path)


def export_eager_onnx(front: HFFrontEnd, path: Path) -> Path:
    """transformers' model with eager attention (the form ORT's BERT fusions recognise) -> ONNX file."""
    _need("onnx")
    import transformers

    if path.exists():
        return path
    model = transformers.AutoModel.from_pretrained(str(front.transformer_dir), attn_implementation="eager").eval()
    sample = front.tokenizer(["an example sentence", "a second one"], padding=True, return_tensors="pt")
    return export_onnx(model, sample, path)


def _feed(enc, names) -> dict:
    return {n: np.asarray(enc[n], dtype=np.int64) if n in enc else
            np.zeros_like(np.asarray(enc["input_ids"]), dtype=np.int64) for n in names}


# ---- ONNX Runtime -----------------------------------------------------------------------------------

def ort_optimized(front: HFFrontEnd, workdir: Path) -> tuple[Path, dict]:
    """The eager export through ORT's BERT optimizer; (path, fused-op counts). Raises if a fusion is missing."""
    _need("onnxruntime")
    from onnxruntime.transformers import optimizer

    src = export_eager_onnx(front, workdir / "model_eager.onnx")
    out = workdir / "model_ort_bert.onnx"
    cfg = front.config
    model = optimizer.optimize_model(str(src), model_type="bert", num_heads=cfg.num_attention_heads,
                                     hidden_size=cfg.hidden_size)
    stats = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
    layers = cfg.num_hidden_layers
    missing = {op: stats.get(op, 0) for op in ORT_FUSED_OPS if stats.get(op, 0) < layers}
    if missing:
        raise AssertionError(f"ONNX Runtime's BERT optimizer fused too few ops for {layers} layers: "
                             f"{missing} (all fused ops: {stats})")
    model.save_model_to_file(str(out))
    return out, stats


def ort_session(path: Path, threads: int):
    ort = _need("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_int8_recipe(flags=None) -> str:
    """The sentence-transformers / optimum quantization config for this CPU: avx512_vnni, avx512, arm64
    or avx2."""
    from fastbert.ops.quantized_linear import cpu_flags

    flags = cpu_flags() if flags is None else flags
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    if "asimd" in flags:
        return "arm64"
    return "avx2"


def ort_peer(front: HFFrontEnd, workdir: Path, threads: int, int8: bool = False) -> Peer:
    path, stats = ort_optimized(front, workdir)
    note = "fused: " + ", ".join(f"{op} x{stats[op]}" for op in (*ORT_FUSED_OPS, "EmbedLayerNormalization")
                                 if op in stats)
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.registry import IntegerOpsRegistry

        recipe = ort_int8_recipe()
        weights = QuantType.QUInt8 if recipe == "avx2" else QuantType.QInt8
        q = workdir / f"model_ort_bert_int8_{recipe}.onnx"
        if not q.exists():   # AutoQuantizationConfig.<recipe>(is_static=False), as sentence-transformers uses it
            quantize_dynamic(str(path), str(q), op_types_to_quantize=list(IntegerOpsRegistry), per_channel=True,
                             reduce_range=False, weight_type=weights,
                             extra_options={"WeightSymmetric": True, "ActivationSymmetric": False,
                                            # the fused ops are com.microsoft's: shape inference types none
                                            "DefaultTensorType": 1})   # onnx.TensorProto.FLOAT
        path, note = q, note + f"; dynamic int8 ({recipe} recipe: u8/{'u8' if recipe == 'avx2' else 's8'}, per channel)"
    session = ort_session(path, threads)
    names = [i.name for i in session.get_inputs()]
    return Peer("ONNX Runtime" + (" int8" if int8 else ""), "int8" if int8 else "fp32",
                front.encoder(lambda enc: session.run(None, _feed(enc, names))[0]), note)


# ---- OpenVINO ---------------------------------------------------------------------------------------

_OV_CONVERT = r"""
import pickle, sys
import openvino as ov
onnx, out, calibration = sys.argv[1:4]
model = ov.convert_model(onnx)
if calibration:
    import nncf
    with open(calibration, "rb") as f:
        data = pickle.load(f)
    model = nncf.quantize(model, nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(data))
ov.save_model(model, out, compress_to_fp16=False)
"""


def ov_convert(front: HFFrontEnd, workdir: Path, calibration: Optional[list] = None) -> Path:
    """The eager export as OpenVINO IR (convert_model, dynamic batch and length; with calibration
    texts, then nncf.quantize), made once per workdir in a child process, as users convert once and
    serve the saved model. Not in this process: convert_model and nncf.quantize queue usage events
    that openvino_telemetry sends for seconds afterwards, each from a new process (spawned, in a
    batch-1 child: a fresh interpreter taking a core), and while they ran the engine timed right
    after was ~9x slower at batch 1 (40 ms, 4.5 without them)."""
    import pickle

    _need("openvino")
    if calibration is not None:
        _need("nncf")
    out = workdir / ("model_ov.xml" if calibration is None else "model_ov_int8.xml")
    if not out.exists():
        onnx = export_eager_onnx(front, workdir / "model_eager.onnx")
        data = ""
        if calibration is not None:
            data = workdir / "ov_calibration.pkl"     # the export's inputs, as the engine is fed
            with open(data, "wb") as f:
                pickle.dump([_feed(enc, INPUT_NAMES) for _, enc in front.batches(calibration)], f)
        done = subprocess.run([sys.executable, "-c", _OV_CONVERT, str(onnx), str(out), str(data)],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise Unavailable(f"OpenVINO conversion failed: {done.stderr.strip()[-300:]}")
    return out


def ov_peer(front: HFFrontEnd, workdir: Path, threads: int, calibration: Optional[list] = None) -> Peer:
    ov = _need("openvino")
    model = ov.Core().read_model(str(ov_convert(front, workdir, calibration)))
    names = [p.get_any_name() for p in model.inputs]
    note = ("convert_model (dynamic shapes), f32 hint" if calibration is None
            else f"NNCF int8, calibrated on {len(calibration)} other texts")
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                       "INFERENCE_NUM_THREADS": threads,
                                                       "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    output = compiled.outputs[0]
    return Peer("OpenVINO" + (" int8" if calibration is not None else ""),
                "fp32" if calibration is None else "int8",
                front.encoder(lambda enc: request.infer(_feed(enc, names))[output]), note)


# ---- CTranslate2 ------------------------------------------------------------------------------------

_CT2_PROBE = r"""
import json, sys, time
import ctranslate2, numpy as np
path, threads, compute = sys.argv[1], int(sys.argv[2]), sys.argv[3]
enc = ctranslate2.Encoder(path, device="cpu", compute_type=compute, intra_threads=threads)
ids = [[101] + [2000 + (7 * i + j) % 20000 for j in range(40)] + [102] for i in range(32)]
enc.forward_batch(ids)
times = []
for _ in range(5):
    t = time.perf_counter(); enc.forward_batch(ids); times.append(time.perf_counter() - t)
print(json.dumps(sorted(times)[2]))
"""


def ct2_convert(front: HFFrontEnd, workdir: Path, quantization: Optional[str]) -> Path:
    """TransformersConverter's model directory, converted in a child process: importing ctranslate2
    here would fix its backend before ct2_backend has chosen one."""
    import importlib.util

    if importlib.util.find_spec("ctranslate2") is None:
        raise Unavailable("ctranslate2 is not installed (pip install 'fastbert[peers]')")
    out = workdir / f"ct2_{quantization or 'float32'}"
    if not (out / "model.bin").exists():
        code = ("import sys; from ctranslate2.converters import TransformersConverter as C; "
                "C(sys.argv[1]).convert(sys.argv[2], quantization=sys.argv[3] or None, force=True)")
        done = subprocess.run([sys.executable, "-c", code, str(front.transformer_dir), str(out), quantization or ""],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise Unavailable(f"TransformersConverter failed: {done.stderr.strip()[-300:]}")
    return out


def ct2_backend(path: Path, threads: int, compute_type: str) -> tuple[str, dict]:
    """"1" (MKL) or "0" (oneDNN) for CT2_USE_MKL, whichever ran a 32 x 42 batch faster in a child
    process (the variable is read once, when ctranslate2 is imported); with the median seconds."""
    seconds = {}
    for flag in ("0", "1"):
        env = {**os.environ, "CT2_USE_MKL": flag}
        done = subprocess.run([sys.executable, "-c", _CT2_PROBE, str(path), str(threads), compute_type],
                              env=env, capture_output=True, text=True, timeout=300)
        if done.returncode == 0:
            seconds[flag] = json.loads(done.stdout.strip().splitlines()[-1])
    if not seconds:
        raise Unavailable("ctranslate2 failed in both backends")
    return min(seconds, key=seconds.get), seconds


def ct2_peer(front: HFFrontEnd, workdir: Path, threads: int, int8: bool = False) -> Peer:
    path = ct2_convert(front, workdir, "int8" if int8 else None)
    compute = "int8" if int8 else "float32"
    # imported already, or the backend chosen by a parent process (a batch-1 child): no new probe
    if "ctranslate2" in sys.modules or os.environ.get("CT2_USE_MKL") in ("0", "1"):
        flag, seconds = os.environ.get("CT2_USE_MKL", "default"), {}
    else:
        flag, seconds = ct2_backend(path, threads, compute)
        os.environ["CT2_USE_MKL"] = flag
    import ctranslate2

    encoder = ctranslate2.Encoder(str(path), device="cpu", compute_type=compute, intra_threads=threads)
    backend = {"0": "oneDNN", "1": "MKL"}.get(flag, flag)
    probe = ", ".join(f"{'MKL' if f == '1' else 'oneDNN'} {s * 1e3:.1f} ms" for f, s in seconds.items())
    note = f"backend {backend}" + (f" (probe: {probe})" if probe else " (set at first import)")

    def run(enc):
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        lengths = np.asarray(enc["attention_mask"]).sum(1).astype(np.int32)
        out = encoder.forward_batch(ctranslate2.StorageView.from_array(ids),
                                    ctranslate2.StorageView.from_array(lengths))
        return np.array(out.last_hidden_state)

    return Peer("CTranslate2" + (" int8" if int8 else ""), "int8" if int8 else "fp32",
                front.encoder(run), note)


# ---- all of them ------------------------------------------------------------------------------------

def build(model_dir, workdir, threads: int, batch_size: int, calibration: list,
          precisions=("fp32", "int8"), say=lambda message: None, names=None) -> tuple[list, dict]:
    """([Peer], {peer name: why it is absent}). calibration: texts for NNCF, none of them timed.
    names: build only the peers of these names (None: all)."""
    front = HFFrontEnd(model_dir, batch_size)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    makers = []
    if "fp32" in precisions:
        makers += [("ONNX Runtime", lambda: ort_peer(front, workdir, threads)),
                   ("OpenVINO", lambda: ov_peer(front, workdir, threads)),
                   ("CTranslate2", lambda: ct2_peer(front, workdir, threads))]
    if "int8" in precisions:
        makers += [("ONNX Runtime int8", lambda: ort_peer(front, workdir, threads, int8=True)),
                   ("OpenVINO int8", lambda: ov_peer(front, workdir, threads, calibration)),
                   ("CTranslate2 int8", lambda: ct2_peer(front, workdir, threads, int8=True))]
    peers, absent = [], {}
    for name, make in makers:
        if names is not None and name not in names:
            continue
        say(f"building peer {name}")
        start = time.perf_counter()
        try:
            peer = make()
        except Unavailable as exc:
            absent[name] = str(exc)
            print(f"fastbert bench: peer {name} skipped: {exc}", file=sys.stderr)
            continue
        peer.note += f"; built in {time.perf_counter() - start:.0f} s"
        peers.append(peer)
    return peers, absent
