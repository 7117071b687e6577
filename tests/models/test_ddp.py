"""DistributedDataParallel on CPU: 2 processes on the gloo backend (127.0.0.1, a free port), each on
half of a padded batch. Their averaged gradients, and the parameters after AdamW steps, equal one
process training on the whole batch."""
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import fastbert

WORLD = 2
STEPS = 2
HEAD = "ForSequenceClassification"   # mean loss over equal halves: the DDP average is the full-batch mean


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(model, inputs):
    """STEPS AdamW steps on `inputs`; -> (gradients of the first step by name, losses)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first, losses = None, []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        if first is None:
            first = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return first, losses


def worker(rank, port, checkpoint, inputs, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        model = fastbert.AutoModelForSequenceClassification.from_pretrained(checkpoint).train()
        ddp = DistributedDataParallel(model)
        shard = {k: v.chunk(WORLD)[rank] for k, v in inputs.items()}
        grads, losses = train(ddp, shard)
        grads = {n.removeprefix("module."): g for n, g in grads.items()}
        torch.save({"grads": grads, "losses": losses, "params": dict(model.named_parameters())},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two training processes over gloo
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo")
def test_ddp_two_processes_match_one_process(tmp_path):
    from test_training import make_batch, save_checkpoint  # here: the spawned workers need no transformers

    save_checkpoint("bert", HEAD, tmp_path / "ckpt")
    model = fastbert.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ckpt").train()
    inputs = make_batch(model.config, HEAD, seed=0, batch=8)
    lengths = inputs["attention_mask"].sum(1)
    assert lengths[:4].max() != lengths[4:].max(), "the halves should pad to different lengths"

    mp.spawn(worker, args=(free_port(), str(tmp_path / "ckpt"), inputs, str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        grads, losses = train(model, inputs)
    finally:
        torch.set_num_threads(threads)
    assert sorted(ranks[0]["grads"]) == sorted(grads)
    for name, g in grads.items():
        for r in ranks:  # every rank holds the all-reduced (averaged) gradient
            torch.testing.assert_close(r["grads"][name], g, rtol=1e-4, atol=1e-7, msg=name)
    # each rank's loss is its half's mean; their average is the whole batch's
    for step in range(STEPS):
        assert abs(sum(r["losses"][step] for r in ranks) / WORLD - losses[step]) <= 1e-5
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), f"{name} did not change"
        for r in ranks:
            torch.testing.assert_close(r["params"][name], p.detach(), rtol=1e-4, atol=1e-6, msg=name)
