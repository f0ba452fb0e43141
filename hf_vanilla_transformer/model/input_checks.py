"""Checks of the model's inputs and weight files: a wrong input fails here with an error that names the argument,
the value and the fix, instead of deep inside the attention or as silently wrong output. This file imports only
torch and safetensors: it is copied next to the model code (remote code).
"""

import os

import torch


def check_token_ids(
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    vocab_size: int,
    name: str,
    check_range: bool = True,
) -> None:
    """Exactly one of the ids (B, T) or their embeddings is given; the ids are integers inside [0, vocab_size),
    which `check_range=False` leaves unchecked: the range is read back from the device (a synchronisation on a GPU),
    so a caller that checked the ids on the host already skips it."""
    if (input_ids is None) == (inputs_embeds is None):
        got = "both" if input_ids is not None else "neither"
        raise ValueError(f"Pass exactly one of `{name}` or its `*inputs_embeds` (got {got}).")
    if input_ids is None:
        return
    if input_ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, length), got {tuple(input_ids.shape)}.")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold integer token ids, got dtype {input_ids.dtype}.")
    # One pass and one read-back; skipped while torch.compile traces (a data-dependent graph break).
    checked = check_range and input_ids.numel() and not torch.compiler.is_compiling()
    low, high = (int(v) for v in torch.aminmax(input_ids)) if checked else (0, 0)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"`{name}` holds token id {bad}, outside the vocabulary [0, {vocab_size}). Use the tokenizer saved "
            "with this model (labels of -100 belong in `labels`, not in the inputs)."
        )


def check_embeddings(inputs_embeds: torch.Tensor, name: str) -> None:
    """At least one row and one position: an empty batch or sequence has nothing to attend to."""
    if inputs_embeds.shape[0] == 0:
        raise ValueError(
            f"`{name}` is an empty batch (shape {tuple(inputs_embeds.shape[:2])}); pass at least one row."
        )
    if inputs_embeds.shape[1] == 0:
        raise ValueError(
            f"`{name}` has no positions (shape {tuple(inputs_embeds.shape[:2])}); every row needs at least one token, "
            "e.g. </s> for an empty sentence."
        )


def check_mask(attention_mask: torch.Tensor | None, inputs_embeds: torch.Tensor, name: str) -> None:
    """A mask whose shape disagrees with the inputs fails deep inside the attention; say so here instead."""
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape != inputs_embeds.shape[:2]:
        raise ValueError(
            f"`{name}` has shape {tuple(attention_mask.shape)} but the inputs have shape "
            f"{tuple(inputs_embeds.shape[:2])}. Pass the mask the tokenizer returned with these input_ids."
        )


def check_encoder_states(encoder_hidden_states: torch.Tensor | None, inputs_embeds: torch.Tensor) -> None:
    """The decoder attends to an encoder output with one row per target row (§3.2.3)."""
    if encoder_hidden_states is None:
        raise ValueError("The decoder needs `encoder_hidden_states`: run the encoder first (or pass input_ids).")
    if encoder_hidden_states.shape[0] != inputs_embeds.shape[0]:
        raise ValueError(
            f"Batch sizes differ: {encoder_hidden_states.shape[0]} source rows but {inputs_embeds.shape[0]} "
            "target rows. Pass as many decoder_input_ids rows as input_ids rows."
        )


def check_loss_options(label_smoothing: float, skip_logits: bool, labels: torch.Tensor | None) -> None:
    """ε_ls in [0, 1) (§5.4); the fused loss (`skip_logits`) needs labels."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(
            f"`label_smoothing` must be in [0, 1), got {label_smoothing}. The paper uses 0.1 (§5.4); pass 0.0 "
            "for plain cross-entropy."
        )
    if skip_logits and labels is None:
        raise ValueError("`skip_logits=True` needs `labels`: without a loss to compute there is no output.")


def check_labels(labels: torch.Tensor | None, hidden_states: torch.Tensor) -> None:
    """One label per decoder position."""
    if labels is not None and labels.shape != hidden_states.shape[:2]:
        raise ValueError(
            f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(hidden_states.shape[:2])}. "
            "Pass labels with one id per decoder position."
        )


def check_weight_files(directory: str) -> None:
    """Open every safetensors file of a local folder before transformers does, so that a truncated or corrupted file,
    or a non-float weight (which would be cast silently), is reported with its file and key."""
    from safetensors import SafetensorError, safe_open

    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(directory, name)
        try:
            with safe_open(path, "pt") as weights:
                for key in weights.keys():
                    dtype = weights.get_slice(key).get_dtype()
                    if dtype not in ("F64", "F32", "F16", "BF16"):
                        raise ValueError(
                            f"{path}: tensor `{key}` has dtype {dtype}; model weights must be floating point. "
                            "The file is not a checkpoint of this model, or it was damaged."
                        )
        except SafetensorError as error:
            raise ValueError(
                f"{path} is not a readable safetensors file ({error}). It is truncated or corrupted: download or "
                "save it again."
            ) from error
