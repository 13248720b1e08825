"""The training step's torch.compile graphs: a function as one graph (fullgraph) when the model is compiled, else
the function itself. Compiled once per process and function, never kept on a module or an optimizer (which then
deep-copy and pickle as before)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def graph(fn, compile: bool, dynamic: bool = False):
    """``fn`` as one torch.compile graph when ``compile``: static shapes (one graph per image size), or with
    ``dynamic`` its integers as symbols (one graph for every step number)."""
    return torch.compile(fn, fullgraph=True, dynamic=dynamic) if compile else fn
