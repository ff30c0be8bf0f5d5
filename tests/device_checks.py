"""A CPU stand-in for the device errors only a GPU raises: random draws that do not say where their tensor goes.

On a GPU the trainer's generators are CUDA generators (``torch.Generator(device=<the trainer's device>)``). A random
factory given such a generator but no ``device`` makes its tensor on the default device, the CPU, and torch refuses:
"Expected a 'cpu' device type for generator but found 'cuda'". On a CPU-only machine generator and tensor are both on
the CPU, so the same code runs and no test sees it. :class:`RandomDrawsNameTheirDevice` makes the rule visible on
the CPU: inside it, a random factory (``torch.randint``, ``rand``, ``randn``, ``randperm``, ``normal`` with a size)
given a generator must name its ``device``, and that device must be the generator's; an operation that draws into
or from a tensor (``multinomial``, ``bernoulli``, ``Tensor.normal_``, ...) must find that tensor on the generator's
device. Both are exactly what torch checks on a GPU, made independent of which device the default happens to be.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

#: Functions that make a new tensor from a size: they take their device from the ``device`` keyword only.
FACTORIES = {torch.rand, torch.randn, torch.randint, torch.randperm}
#: Operations that draw into or from a tensor argument: they run on that tensor's device.
TENSOR_DRAWS = {torch.multinomial, torch.bernoulli, torch.poisson, torch.Tensor.multinomial, torch.Tensor.bernoulli,
                torch.Tensor.bernoulli_, torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.exponential_,
                torch.Tensor.random_, torch.Tensor.geometric_, torch.Tensor.log_normal_, torch.Tensor.cauchy_}


class DeviceRuleBroken(RuntimeError):
    """A random draw would fail on a GPU (the message says which call and why)."""


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def _first_tensor(args) -> torch.Tensor | None:
    return next((a for a in args if isinstance(a, torch.Tensor)), None)


class RandomDrawsNameTheirDevice(TorchFunctionMode):
    """Raise :class:`DeviceRuleBroken` on a random draw whose tensor is not explicitly on its generator's device.
    ``seen`` counts the draws checked (a test can assert its path drew at all)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if isinstance(generator, torch.Generator):
            self._check(func, args, kwargs, generator)
        return func(*args, **kwargs)

    def _check(self, func, args, kwargs, generator: torch.Generator) -> None:
        want = generator.device.type
        tensor = _first_tensor(args)
        if func in FACTORIES or (func is torch.normal and tensor is None):
            self.seen += 1
            device = kwargs.get("device")
            if device is None:
                raise DeviceRuleBroken(f"{_name(func)}(..., generator=<{want} generator>) names no device: its tensor "
                                       f"goes to the default device, which on a GPU is not the generator's ('Expected "
                                       f"a 'cpu' device type for generator but found 'cuda''); pass device=generator.device")
            if torch.device(device).type != want:
                raise DeviceRuleBroken(f"{_name(func)}: device={device!r} with a {want} generator")
        elif func in TENSOR_DRAWS or func is torch.normal:
            self.seen += 1
            if tensor is not None and tensor.device.type != want:
                raise DeviceRuleBroken(f"{_name(func)}: a {tensor.device.type} tensor drawn with a {want} generator")
