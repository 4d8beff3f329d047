"""The transformers.Trainer recipe.

    from forge_num.hf import trainer_optimizers
    args = TrainingArguments(..., max_grad_norm=1.0, gradient_accumulation_steps=4)
    optimizers = trainer_optimizers(model, args, num_training_steps=1000)   # prepares the model
    trainer = Trainer(model=model, args=args, train_dataset=ds, optimizers=optimizers)
    trainer.train()

``trainer_optimizers`` builds a forge_num optimizer from the TrainingArguments (learning rate,
betas, epsilon, weight decay — not applied to 1-D parameters such as biases and norm weights — and
the lr scheduler of ``lr_scheduler_type`` with its warmup), prepares the model (updates in backward),
and maps the two options Trainer would otherwise apply to gradients that no longer exist:

* ``max_grad_norm`` becomes forge_num's exact global clipping (a norm-only backward pass, then the
  updating one: the loss of the model's output runs both when Trainer calls ``backward()``), and
  ``args.max_grad_norm`` is set to 0 so that Trainer does not clip (its ``clip_grad_norm_`` would
  see no gradients and clip nothing). Trainer's logged ``grad_norm`` is then 0; the real one is in
  ``optimizer.stats['grad_norm']``.
* ``gradient_accumulation_steps`` becomes the optimizer's ``accumulation_steps``: Trainer keeps
  calling ``backward`` per micro-batch (with the loss scaled as it always does) and ``step()`` once
  per accumulation; forge_num accumulates linear-weight gradients in fp32 buffers (4 bytes per
  parameter during the step) and autograd the rest, so nothing is accumulated twice. A last, short
  accumulation (an epoch not divisible by the accumulation) is applied at ``step()`` as torch would.

What cannot be mapped raises ``ValueError``: fp16 mixed precision (GradScaler scales and unscales
gradients that are never materialized; use ``bf16=True``), DeepSpeed, FSDP and multi-GPU
DataParallel (their gradient reduction would have to come before the in-backward update).
"""

from __future__ import annotations

import contextlib
import threading

from forge_num.optim import SGD, Adam, AdamW, ForgeOptimizer, Lion
from forge_num.fused import prepare

__all__ = ["trainer_optimizers", "causal_lm_loss", "one_sequence_per_row"]

_OPTIMIZERS = {"adamw": AdamW, "adam": Adam, "sgd": SGD, "lion": Lion}


def _check_args(args) -> None:
    if getattr(args, "fp16", False):
        raise ValueError(
            "forge_num: fp16=True uses a GradScaler, which unscales gradients that forge_num never "
            "materializes; use bf16=True (autocast) or fp32"
        )
    if getattr(args, "deepspeed", None):
        raise ValueError(
            "forge_num: DeepSpeed is not supported (it owns the gradients and the optimizer step)"
        )
    if getattr(args, "fsdp", None):
        raise ValueError("forge_num: FSDP is not supported by the in-backward update yet")
    if getattr(args, "n_gpu", 1) > 1:
        raise ValueError("forge_num: multi-GPU DataParallel is not supported; use one process per GPU")


def _param_groups(model, weight_decay):
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def trainer_optimizers(
    model,
    args,
    *,
    num_training_steps: int | None = None,
    optimizer: str = "adamw",
    **optimizer_kwargs,
) -> tuple[ForgeOptimizer, object]:
    """(optimizer, lr_scheduler) for ``Trainer(optimizers=...)``.

    Prepares ``model`` and sets ``args.max_grad_norm = 0`` (see the module docstring).
    """
    from transformers import get_scheduler

    _check_args(args)
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZERS)}, got {optimizer!r}")
    if num_training_steps is None:
        if getattr(args, "max_steps", -1) and args.max_steps > 0:
            num_training_steps = args.max_steps
        else:
            raise ValueError("give num_training_steps= (or set TrainingArguments.max_steps)")
    max_grad_norm = float(getattr(args, "max_grad_norm", 0.0) or 0.0)
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    options = dict(
        max_grad_norm=max_grad_norm if max_grad_norm > 0 else None,
        clipping="exact",
        accumulation_steps=accumulation,
    )
    options.update(optimizer_kwargs)
    cls = _OPTIMIZERS[optimizer]
    groups = _param_groups(model, args.weight_decay)
    if cls in (AdamW, Adam):
        opt = cls(
            groups,
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            **options,
        )
    elif cls is Lion:
        opt = cls(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), **options)
    else:
        opt = cls(groups, lr=args.learning_rate, **options)

    # Trainer must not clip (or try to) a second time: it clips only when args.max_grad_norm > 0.
    try:
        args.max_grad_norm = 0.0
    except Exception as e:  # a frozen TrainingArguments
        raise ValueError(
            "forge_num: cannot set TrainingArguments.max_grad_norm = 0 (Trainer would clip gradients "
            "that do not exist); create the arguments with max_grad_norm=0 and pass max_grad_norm= here"
        ) from e
    if args.max_grad_norm != 0.0:
        raise ValueError("forge_num: TrainingArguments.max_grad_norm could not be set to 0")

    prepare(model, opt)
    sched = get_scheduler(
        args.lr_scheduler_type,
        opt,
        num_warmup_steps=args.get_warmup_steps(num_training_steps),
        num_training_steps=num_training_steps,
        scheduler_specific_kwargs=getattr(args, "lr_scheduler_kwargs", None) or {},
    )
    return opt, sched


def causal_lm_loss(model, input_ids, labels=None, *, ignore_index: int = -100, chunk_rows: int | None = None,
                   **model_kwargs):
    """``model(input_ids, labels=labels).loss`` of a transformers ``*ForCausalLM`` without its logits:
    the model's body, then forge_num.linear_cross_entropy on its output embedding (the LM head) with
    the labels shifted as transformers' ForCausalLMLoss shifts them (padded with ``ignore_index`` at
    the end, then moved one to the left). ``labels`` default to ``input_ids``; ``model_kwargs`` go to
    the body (attention_mask, position_ids, ...). With ``chunk_rows`` at least batch x sequence the
    logits come from the same GEMM as the model's own, so every gradient is transformers' bit for bit
    (tests/test_loss.py); the loss value is within proofs/loss.md's bound of it.

    Models whose head output is transformed before the loss (final logit soft-capping, a logit scale)
    are refused: their loss is not the cross-entropy of the head's output."""
    import torch.nn.functional as F

    from forge_num.loss import linear_cross_entropy

    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(f"causal_lm_loss: {type(model).__name__} sets {name}={value!r}: its loss is not the "
                             "cross-entropy of the head's output, which is all causal_lm_loss computes")
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"causal_lm_loss: {type(model).__name__} has no output embedding (LM head)")
    labels = input_ids if labels is None else labels
    hidden = model.base_model(input_ids=input_ids, **model_kwargs).last_hidden_state
    shifted = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return linear_cross_entropy(hidden, head, shifted, ignore_index=ignore_index, chunk_rows=chunk_rows)


# one_sequence_per_row's state: how deep the contexts are nested, the functions they replaced, and how
# many were entered in all (forge_num.graphs reads the count around a capture)
_ONE_SEQUENCE = {"depth": 0, "entered": 0, "saved": None}
_ONE_SEQUENCE_LOCK = threading.Lock()


@contextlib.contextmanager
def one_sequence_per_row():
    """Within it, transformers' causal masks take, while a CUDA stream captures, the path the eager
    forward takes for a batch whose rows each hold one sequence: no mask, SDPA's ``is_causal=True``
    and ``enable_gqa``. Wrap the model's forward in a captured step (forge_num.capture_step) with it::

        def loss_of(ids):
            with forge_num.hf.one_sequence_per_row():
                return model(input_ids=ids, labels=ids).loss

    Why: transformers 5.x decides from the tensors' values whether a causal mask can be left to SDPA,
    and a stream capture cannot read values, so it builds an explicit [S, S] mask instead:

    * masking_utils.find_packed_sequence_indices looks for several sequences packed into a row (the
      position ids restarting). It runs when there is no attention mask and no KV cache, as in training
      with gradient checkpointing or ``use_cache=False``. Under capture it cannot check and returns the
      packing tensor, so the mask is built (every 5.x version, 5.25 included).
    * masking_utils._ignore_causal_mask_sdpa: transformers 5.0-5.17 answer False under capture even with
      no padding mask to read (5.18 on ask only about a padding mask's values).

    With a mask, SDPA cannot skip the masked half (flash refuses masks; cuDNN reads it: 2.5x the eager
    attention time in session 29's 3B step), and transformers repeats the key/value heads (repeat_kv)
    instead of SDPA's enable_gqa, so a bf16 model's gradients are not the eager step's bits.

    Inside the context the packing check answers "none" without reading the position ids, and a
    padding mask that is absent counts as absent under capture. The first answer is right only for
    batches without packed sequences: a captured step with packed rows (position ids that restart within
    a row) must not use it, since their mask would be lost. A padding mask passed in is still built into
    a mask."""
    from transformers import masking_utils

    with _ONE_SEQUENCE_LOCK:
        if _ONE_SEQUENCE["depth"] == 0:
            # transformers 4.x's masking_utils has no is_tracing (its masks do not look at stream capture;
            # its find_packed_sequence_indices never answers "none", eagerly or captured)
            saved = {}
            if hasattr(masking_utils, "find_packed_sequence_indices"):
                saved["find_packed_sequence_indices"] = masking_utils.find_packed_sequence_indices
                masking_utils.find_packed_sequence_indices = lambda position_ids: None  # one sequence a row
            real_is_tracing = getattr(masking_utils, "is_tracing", None)
            if real_is_tracing is not None:
                saved["is_tracing"] = real_is_tracing
                # an absent padding mask has no values to read: absent under capture as eagerly
                # (transformers 5.0-5.17's _ignore_causal_mask_sdpa asks is_tracing(None))
                masking_utils.is_tracing = lambda tensor=None: tensor is not None and real_is_tracing(tensor)
            _ONE_SEQUENCE["saved"] = saved
        _ONE_SEQUENCE["depth"] += 1
        _ONE_SEQUENCE["entered"] += 1
    try:
        yield
    finally:
        with _ONE_SEQUENCE_LOCK:
            _ONE_SEQUENCE["depth"] -= 1
            if _ONE_SEQUENCE["depth"] == 0:
                for name, fn in _ONE_SEQUENCE["saved"].items():
                    setattr(masking_utils, name, fn)
                _ONE_SEQUENCE["saved"] = None
