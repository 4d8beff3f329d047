"""forge_num.hf: the transformers.Trainer recipe, on a tiny Llama (CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # Trainer needs it
transformers.logging.set_verbosity_error()

from forge_num.hf import _param_groups, trainer_optimizers  # noqa: E402
from tests.torch_reference import ExactAdamW, needs_fused_aten  # noqa: E402





def tiny_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


class Data(torch.utils.data.Dataset):
    def __init__(self, n=24, seq=16):
        g = torch.Generator().manual_seed(7)
        self.rows = torch.randint(0, 256, (n, seq), generator=g)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def make_args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        weight_decay=0.1,
        lr_scheduler_type="linear",
        warmup_steps=1,
        max_grad_norm=0.0,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    base.update(kw)
    return transformers.TrainingArguments(**base)


def run_trainer(model, args, optimizers):
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(), optimizers=optimizers)
    trainer.train()
    return trainer


@needs_fused_aten
def test_trainer_with_accumulation_equals_trainer_with_torch_adamw(tmp_path):
    """GA=2, no clipping: Trainer + forge_num == Trainer + torch AdamW (foreach=False, exact sqrt)."""
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    a1 = make_args(tmp_path / "a")
    opt, sched = trainer_optimizers(m1, a1)
    assert opt.accumulation_steps == 2 and opt.max_grad_norm is None
    run_trainer(m1, a1, (opt, sched))
    a2 = make_args(tmp_path / "b")
    ref = ExactAdamW(_param_groups(m2, 0.1), lr=1e-3, foreach=False)
    rsched = transformers.get_scheduler("linear", ref, num_warmup_steps=1, num_training_steps=4)
    run_trainer(m2, a2, (ref, rsched))
    assert opt.stats["step"] == 4 and all(s["clip_coef"] is None for s in opt.stats_history)
    for (n, p), q in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(p, q), n


def test_trainer_clipping_is_mapped_not_doubled(tmp_path):
    m = tiny_llama()
    args = make_args(tmp_path, max_grad_norm=0.01)
    opt, sched = trainer_optimizers(m, args)
    assert args.max_grad_norm == 0.0  # Trainer will not clip
    assert opt.max_grad_norm == 0.01 and opt.clipping == "exact"
    run_trainer(m, args, (opt, sched))
    coefs = [s["clip_coef"] for s in opt.stats_history]
    assert len(coefs) == 4 and all(c is not None and c < 1 for c in coefs)
    assert all(p.grad is None for p in m.parameters())


def test_unmappable_arguments_raise(tmp_path):
    class Args:
        fp16 = True

    with pytest.raises(ValueError, match="fp16"):
        trainer_optimizers(tiny_llama(), Args())
    with pytest.raises(ValueError, match="num_training_steps"):
        trainer_optimizers(tiny_llama(), make_args(tmp_path, max_steps=-1, num_train_epochs=1))


def _transformers_5_or_skip():
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers 4.x does not look at stream capture")


def _sdpa_llama_and_ids():
    """tiny_llama in bf16 on its own SDPA attention (grouped key/value heads), and a batch of two rows."""
    model = tiny_llama().to(torch.bfloat16)
    model.set_attn_implementation("sdpa")
    return model, torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))


def _masking_functions():
    """What one_sequence_per_row replaces in transformers' masking_utils, to check it is restored."""
    from transformers import masking_utils

    return masking_utils.find_packed_sequence_indices, masking_utils.is_tracing


def _attend_and_record(model, ids, capturing: bool, one_sequence: bool, attention_mask=None):
    """The model's loss and gradients, with every SDPA call's mask, is_causal and enable_gqa recorded;
    ``capturing``: transformers told a CUDA stream captures (what a CPU can simulate of a capture: the
    answer its masking code asks for); ``one_sequence``: the forward inside one_sequence_per_row()."""
    import contextlib
    from unittest import mock

    import transformers.utils.import_utils as import_utils

    from forge_num.hf import one_sequence_per_row

    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal"), kwargs.get("enable_gqa", False)))
        return real_sdpa(*args, **kwargs)

    model.zero_grad(set_to_none=True)
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", spy), \
            mock.patch.object(import_utils, "is_cuda_stream_capturing", lambda: capturing), \
            one_sequence_per_row() if one_sequence else contextlib.nullcontext():
        loss = model(input_ids=ids, labels=ids, attention_mask=attention_mask, use_cache=False).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], calls


def test_one_sequence_per_row_gives_a_capture_the_eager_attention():
    """Without a KV cache (as under gradient checkpointing) transformers 5.x builds an explicit causal mask
    while a stream captures, and then repeats the key/value heads; within one_sequence_per_row it takes
    the eager path (no mask, is_causal, enable_gqa), with the eager loss and gradients bit for bit. The
    context restores transformers' functions on exit."""
    _transformers_5_or_skip()
    model, ids = _sdpa_llama_and_ids()
    saved = _masking_functions()

    eager_loss, eager_grads, eager_calls = _attend_and_record(model, ids, capturing=False, one_sequence=False)
    assert all(mask is None and causal and gqa for mask, causal, gqa in eager_calls) and eager_calls

    _, _, captured_calls = _attend_and_record(model, ids, capturing=True, one_sequence=False)
    assert all(mask is not None and not causal and not gqa for mask, causal, gqa in captured_calls), captured_calls

    loss, grads, calls = _attend_and_record(model, ids, capturing=True, one_sequence=True)
    assert calls == eager_calls
    assert torch.equal(loss.reshape(1).view(torch.int32), eager_loss.reshape(1).view(torch.int32))
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))
    assert _masking_functions() == saved


def test_one_sequence_per_row_keeps_a_padding_mask_and_restores_on_error():
    """A padding mask passed in is still built into the mask under capture (its values cannot be read),
    nested contexts restore once, and an exception inside restores transformers' functions."""
    import forge_num
    from forge_num.hf import _ONE_SEQUENCE, one_sequence_per_row

    _transformers_5_or_skip()
    model, ids = _sdpa_llama_and_ids()
    saved = _masking_functions()
    with one_sequence_per_row():  # nested: the inner exit restores nothing
        _, _, calls = _attend_and_record(model, ids, capturing=True, one_sequence=True,
                                         attention_mask=torch.ones_like(ids))
        assert _masking_functions() != saved
    assert calls and all(mask is not None for mask, _, _ in calls)
    assert _masking_functions() == saved
    with pytest.raises(RuntimeError, match="inside"), one_sequence_per_row():
        raise RuntimeError("inside")
    assert _masking_functions() == saved and _ONE_SEQUENCE["depth"] == 0
    assert forge_num.hf.one_sequence_per_row is one_sequence_per_row  # the README's spelling
