"""Per-example gradients from one batched forward and backward pass (for models whose examples do not interact).

``vmap(grad(loss))`` (:func:`dpsynth.privacy.dpsgd.per_example_gradients`) runs every operator through
torch.func's batching rules; on the ``cpu`` UNet that costs 1.5-1.7x a non-private step (GroupNorm's and
SiLU's batched backward, grouped convolutions). Here the model runs as usual on the whole batch; one
``autograd.grad`` call takes the gradient of the summed per-example losses with respect to the *output* of every
module with parameters (so no parameter gradient is formed), and each example's parameter gradient follows in
closed form from that module's input and output gradient (Opacus' hooks, with a grouped convolution for
convolution weights instead of an unfolded product; one rule per module type, registered with :func:`rule_for`):
the same numbers as vmap, up to float rounding.

Rows: a batch of B examples may run as B*K rows (noise multiplicity K, the rows of an example adjacent); an
example's gradient is the sum over its rows, which each rule forms directly (never B*K per-row gradients: at
the ``paper`` presets' K = 32 those would take 32 times the memory of the per-example ones).

Exactness rests on the model treating examples independently (no BatchNorm in training mode, no operation
across the batch) and on captured tensors not being modified in place. Only module types on an allow-list
(:data:`ALLOWED`, with or without parameters) may appear; the DP-SGD engine then uses this path only after a probe of
random public tensors (never the private batch) agreed with vmap and showed that one example's gradient does not
move when the others change (:meth:`BatchedGradients.agrees_with`, :meth:`BatchedGradients.independent`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

Params = dict[str, torch.Tensor]
# loss(model, *batch_tensors) -> the loss of each example, shape (B,)
BatchLoss = Callable[..., torch.Tensor]
Rule = Callable[[nn.Module, torch.Tensor, torch.Tensor, int], Params]
# The per-example rule of each module type with parameters: rule(module, input, output gradient, examples).
RULES: dict[type[nn.Module], Rule] = {}


def rule_for(kind: type[nn.Module]) -> Callable[[Rule], Rule]:
    """Register the decorated function as the per-example gradient rule of modules of type ``kind`` (which
    puts ``kind`` on the allow-list, :data:`ALLOWED`)."""
    def register(rule: Rule) -> Rule:
        RULES[kind] = rule
        return rule
    return register


def _by_example(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """Rows (count x K, an example's K rows adjacent) to K x (count * channels) x ...: an example's rows side by
    side in a batch of K, the examples' channels stacked, so that a convolution with the examples as groups sums
    each example's rows (no per-row gradient is ever formed: K times less memory)."""
    rows = len(tensor)
    return tensor.reshape(count, rows // count, *tensor.shape[1:]).transpose(0, 1).reshape(
        rows // count, count * tensor.shape[1], *tensor.shape[2:])


@rule_for(nn.Conv2d)
def _conv(module: nn.Module, inputs: torch.Tensor, grad_out: torch.Tensor, count: int) -> Params:
    """Each example's weight gradient as one convolution with the examples as groups; bias: summed output gradient."""
    assert isinstance(module, nn.Conv2d)
    weight = module.weight
    _, grad_weight, _ = torch.ops.aten.convolution_backward(
        _by_example(grad_out, count), _by_example(inputs.to(grad_out.dtype), count),
        weight.detach().to(grad_out.dtype).repeat(count, 1, 1, 1), None, module.stride, module.padding,
        module.dilation, False, [0, 0], count * module.groups, [False, True, False])
    grads = {"weight": grad_weight.view(count, *weight.shape)}
    if module.bias is not None:
        grads["bias"] = _summed(grad_out.sum((2, 3)), count)
    return grads


@rule_for(nn.Linear)
def _linear(module: nn.Module, inputs: torch.Tensor, grad_out: torch.Tensor, count: int) -> Params:
    """Outer products of output gradient and input, summed over an example's rows and any token dimensions."""
    rows = grad_out.reshape(count, -1, grad_out.shape[-1])
    grads = {"weight": torch.einsum("bto,bti->boi", rows, inputs.to(grad_out.dtype).reshape(count, -1,
                                                                                          inputs.shape[-1]))}
    if getattr(module, "bias", None) is not None:
        grads["bias"] = rows.sum(1)
    return grads


@rule_for(nn.GroupNorm)
def _group_norm(module: nn.Module, inputs: torch.Tensor, grad_out: torch.Tensor, count: int) -> Params:
    """Output gradient times the normalised input (weight), output gradient (bias), summed over positions."""
    assert isinstance(module, nn.GroupNorm)
    normalised = F.group_norm(inputs.to(grad_out.dtype), module.num_groups, None, None, module.eps)
    return {"weight": _summed((grad_out * normalised).flatten(2).sum(2), count),
            "bias": _summed(grad_out.flatten(2).sum(2), count)}


@rule_for(nn.Embedding)
def _embedding(module: nn.Module, inputs: torch.Tensor, grad_out: torch.Tensor, count: int) -> Params:
    """Each row's output gradient added to the rows of its example's table that it looked up."""
    assert isinstance(module, nn.Embedding)
    dim = module.embedding_dim
    grad = grad_out.new_zeros(count, module.num_embeddings, dim)
    return {"weight": grad.scatter_add_(1, inputs.reshape(count, -1, 1).expand(-1, -1, dim),
                                        grad_out.reshape(count, -1, dim))}


def _summed(rows: torch.Tensor, count: int) -> torch.Tensor:
    """Per-row values (count x K rows) summed over each example's K rows."""
    return rows.view(count, -1, *rows.shape[1:]).sum(1)


# Every module type the batched rules may meet: each treats the examples of a batch independently (no statistic
# across the batch). Those with a rule, and others named, so the allow-list needs no import of diffusers;
# anything else takes vmap.
ALLOWED = frozenset({
    *(f"{kind.__module__}.{kind.__qualname__}" for kind in RULES),
    *(f"torch.nn.modules.{name}" for name in (
        "container.ModuleList",
        "container.Sequential", "activation.SiLU", "activation.ReLU", "activation.GELU", "dropout.Dropout",
        "linear.Identity", "flatten.Flatten", "pooling.AvgPool2d", "pooling.MaxPool2d", "pooling.AdaptiveAvgPool2d")),
    *(f"diffusers.models.{name}" for name in (
        "unets.unet_2d.UNet2DModel", "unets.unet_2d_blocks.DownBlock2D", "unets.unet_2d_blocks.UpBlock2D",
        "unets.unet_2d_blocks.AttnDownBlock2D", "unets.unet_2d_blocks.AttnUpBlock2D",
        "unets.unet_2d_blocks.UNetMidBlock2D", "resnet.ResnetBlock2D", "attention_processor.Attention",
        "downsampling.Downsample2D", "upsampling.Upsample2D", "embeddings.Timesteps",
        "embeddings.TimestepEmbedding")),
    "dpsynth.models.unet.SiLU",
})


def unsupported(model: nn.Module) -> str | None:
    """Why :class:`BatchedGradients` cannot serve ``model`` (a module type off :data:`ALLOWED`, with or without
    parameters, or a convolution padded otherwise than with zeros), or None."""
    for name, module in model.named_modules():
        kind = f"{type(module).__module__}.{type(module).__qualname__}"
        if kind not in ALLOWED:
            return f"{name or 'the model'} is a {type(module).__name__}, not on the batched engine's allow-list"
        if isinstance(module, nn.Conv2d) and (module.padding_mode != "zeros" or isinstance(module.padding, str)):
            return f"{name} pads with {module.padding_mode} / {module.padding!r}"
    return None


class BatchedGradients:
    """Per-example gradients of ``loss`` (per-example losses of a batch) for the parameters in ``params``."""

    def __init__(self, model: nn.Module, loss: BatchLoss, params: Params) -> None:
        self.model, self.loss, self.params = model, loss, params
        self.modules = {name: module for name, module in model.named_modules()
                        if any(p.requires_grad for p in module.parameters(recurse=False))}

    def __call__(self, batch: Sequence[torch.Tensor]) -> Params:
        captured: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        handles = [module.register_forward_hook(self._capture(captured, name)) for name, module in self.modules.items()]
        try:
            losses = self.loss(self.model, *batch)
        finally:
            for handle in handles:
                handle.remove()
        names = list(captured)
        outputs = torch.autograd.grad(losses.sum(), [captured[name][1] for name in names], allow_unused=True)
        count, grads = len(losses), {}
        for name, grad_out in zip(names, outputs, strict=True):
            module, inputs = self.modules[name], captured[name][0]
            if grad_out is None:
                continue
            for param, grad in RULES[type(module)](module, inputs, grad_out, count).items():
                if f"{name}.{param}" in self.params:
                    grads[f"{name}.{param}"] = grad.float()
        return {name: grads[name] if name in grads else param.new_zeros(count, *param.shape)
                for name, param in self.params.items()}

    @staticmethod
    def _capture(captured: dict[str, tuple[torch.Tensor, torch.Tensor]], name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if name in captured:
                raise RuntimeError(f"{name} runs twice in one forward pass; per-example rules need one call")
            captured[name] = (inputs[0].detach(), output)
        return hook

    def agrees_with(self, reference: Params, batch: Sequence[torch.Tensor], tolerance: float = 1e-3) -> bool:
        """Whether every example's whole gradient on ``batch`` is within ``tolerance`` (relative L2) of
        ``reference`` (vmap's); computed in fp32."""
        return bool((_relative_errors(self._fp32(batch), reference) <= tolerance).all())

    def independent(self, batch: Sequence[torch.Tensor], others: Sequence[torch.Tensor],
                    tolerance: float = 1e-4) -> bool:
        """Whether the first example's gradient stays the same (within ``tolerance``, relative L2) when every other
        example is replaced by those of ``others`` (the same shapes): no operation mixes the examples."""
        changed = [torch.cat([first[:1], other[1:]]) for first, other in zip(batch, others, strict=True)]
        alone = {name: grad[:1] for name, grad in self._fp32(batch).items()}
        return bool((_relative_errors({n: g[:1] for n, g in self._fp32(changed).items()}, alone) <= tolerance).all())

    def _fp32(self, batch: Sequence[torch.Tensor]) -> Params:
        with torch.autocast(batch[0].device.type, enabled=False):
            return self(batch)


def _relative_errors(ours: Params, reference: Params) -> torch.Tensor:
    """Each example's L2 distance between two sets of per-example gradients, over the reference's norm."""
    error = torch.stack([(ours[n] - reference[n]).flatten(1).pow(2).sum(1) for n in reference]).sum(0).sqrt()
    size = torch.stack([reference[n].flatten(1).pow(2).sum(1) for n in reference]).sum(0).sqrt()
    return error / (size + 1e-12)


def public_probe(batch: Sequence[torch.Tensor], count: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Random tensors of ``batch``'s shapes (``count`` examples), which hold nothing of the private batch: floats
    uniform in [0, 1), integers (labels, diffusion times) 0 or 1."""
    probe = []
    for tensor in batch:
        shape = (count, *tensor.shape[1:])
        values = (torch.rand(shape, generator=generator) if tensor.is_floating_point()
                  else torch.randint(0, 2, shape, generator=generator))
        probe.append(values.to(tensor.device, tensor.dtype))
    return probe
