"""Training a QA head on padded batches learns as transformers' does (fastbert's head, and transformers'
head after optimize()): the extractive-QA recipe (question + context padded to max_length, start/end
positions), 30 steps, three data orders. fastbert's padded rows are zeros, so their logits are the
head's bias: the loss leaves padded positions out (fastbert.models.heads.qa_loss), else the softmax
spends its mass there and the model learns worse than transformers'."""
import copy

import pytest
import torch
import torch.nn.functional as F
import transformers as T

import fastbert
import fastbert.models as fm

VOCAB, MAX_LEN, STEPS, BATCH = 32, 24, 30, 8
START, END = 5, 6   # the answer span runs from START's position to END's in every context


def qa_data(n: int, seed: int):
    """[CLS] question [SEP] context [SEP], padded to MAX_LEN; contexts of random length hold one span."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, MAX_LEN, dtype=torch.long)
    types = torch.zeros(n, MAX_LEN, dtype=torch.long)
    mask = torch.zeros(n, MAX_LEN, dtype=torch.long)
    start, end = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    for i in range(n):
        question = torch.randint(10, VOCAB, (2,), generator=g).tolist()
        context = torch.randint(10, VOCAB, (int(torch.randint(5, MAX_LEN - 6, (1,), generator=g)),), generator=g)
        a = int(torch.randint(0, len(context) - 2, (1,), generator=g))
        context[a], context[a + 2] = START, END
        seq = [2, *question, 3, *context.tolist(), 3]
        ids[i, :len(seq)], mask[i, :len(seq)], types[i, 4:len(seq)] = torch.tensor(seq), 1, 1
        start[i], end[i] = 4 + a, 4 + a + 2
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask), start, end


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: torch's threads only contend with each other (seconds become minutes on a busy box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup():
    config = T.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=MAX_LEN, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    hf = T.BertForQuestionAnswering(config)
    return hf, qa_data(STEPS * BATCH, seed=1), qa_data(64, seed=2)


def masked_reference_loss(out, inputs, start, end):
    """transformers' QA loss on transformers' logits with padded positions out of the softmax."""
    pad = inputs["attention_mask"] == 0
    losses = [F.cross_entropy(logits.masked_fill(pad, torch.finfo(logits.dtype).min), target)
              for logits, target in ((out.start_logits, start), (out.end_logits, end))]
    return (losses[0] + losses[1]) / 2


def exact_match(model, data) -> float:
    inputs, start, end = data
    model.eval()
    with torch.no_grad():
        out = model(**inputs)
    pad = inputs["attention_mask"] == 0
    s = out.start_logits.masked_fill(pad, -1e9).argmax(-1)
    e = out.end_logits.masked_fill(pad, -1e9).argmax(-1)
    return ((s == start) & (e == end)).float().mean().item()


def train(model, data, order):
    inputs, start, end = data
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for step in range(STEPS):
        rows = order[step * BATCH:(step + 1) * BATCH]
        loss = model(**{k: v[rows] for k, v in inputs.items()}, start_positions=start[rows],
                     end_positions=end[rows]).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return losses


def contenders(hf):
    native = fm.BertForQuestionAnswering(hf.config)
    native.load_state_dict(hf.state_dict())
    return {"native": native, "optimize": fastbert.optimize(copy.deepcopy(hf))}


def test_first_step_loss_leaves_padding_out(setup):
    hf, (inputs, start, end), _ = setup
    rows = slice(0, BATCH)
    batch = {k: v[rows] for k, v in inputs.items()}
    assert (batch["attention_mask"] == 0).any(), "the batch must be padded"
    want = masked_reference_loss(hf(**batch), batch, start[rows], end[rows])
    for name, model in contenders(hf).items():
        got = model(**batch, start_positions=start[rows], end_positions=end[rows]).loss
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4, msg=name)
    # a target on padding is ignored, as one outside the sequence is (transformers clamps and ignores those)
    on_pad = start[rows].clone()
    on_pad[0] = MAX_LEN - 1
    assert batch["attention_mask"][0, -1] == 0
    got = contenders(hf)["native"](**batch, start_positions=on_pad, end_positions=end[rows]).loss
    assert torch.isfinite(got)


def test_modernbert_first_step_loss_leaves_padding_out(setup):
    """ModernBERT's QA head has its own forward: its loss leaves padding out too."""
    _, (inputs, start, end), _ = setup
    config = T.ModernBertConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, max_position_embeddings=MAX_LEN, pad_token_id=0,
                                bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
    torch.manual_seed(0)
    hf = T.ModernBertForQuestionAnswering(config)
    rows = slice(0, BATCH)
    batch = {k: inputs[k][rows] for k in ("input_ids", "attention_mask")}   # ModernBERT has no token types
    assert (batch["attention_mask"] == 0).any(), "the batch must be padded"
    want = masked_reference_loss(hf(**batch), batch, start[rows], end[rows])
    native = fm.ModernBertForQuestionAnswering(config)
    native.load_state_dict(hf.state_dict())
    got = native(**batch, start_positions=start[rows], end_positions=end[rows]).loss
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("order_seed", [0, 1, 2])
def test_padded_qa_learns_as_transformers(setup, order_seed):
    hf, data, held_out = setup
    order = torch.randperm(STEPS * BATCH, generator=torch.Generator().manual_seed(order_seed))
    reference = copy.deepcopy(hf)
    train(reference, data, order)
    want = exact_match(reference, held_out)
    for name, model in contenders(hf).items():
        losses = train(model, data, order)
        assert losses[-1] < losses[0] / 2, (name, losses)
        got = exact_match(model, held_out)
        assert abs(got - want) <= 0.05, f"{name}: held-out exact match {got:.3f}, transformers {want:.3f}"
