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
