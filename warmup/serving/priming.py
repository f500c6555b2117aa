"""A served model primed for what servers send, before its first request.

Every declared shape, then each learned one, is called under the model's mode with
each kind of input it is primed with (``warmup.compiled.inputs.input_kinds``: normal
tensors, and inference tensors too for a model declared ``inference_mode``), each until
steady. Dynamo specialises sizes 0 and 1, so a declared 1 is primed as a shape of its
own (``expand()`` lists it), and Dynamo guards on a tensor's kind, so a server that
makes its inputs under ``torch.inference_mode()`` needs the graph of inference tensors.
A second kind costs Dynamo's trace of each graph again, not Inductor's compile: its
graph hits the FX-graph cache entry the first kind made (the tests' MLP at 3 shapes on
CPU: 0.26-0.45 s more on a 2.3-2.9 s prime from a restored cache). Priming is bounded
by :data:`PRIME_CALLS` calls a shape and kind, two kinds at most.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from registry.core.errors import named
from warmup.compiled.counters import snapshot
from warmup.compiled.inputs import grad_mode, input_kinds, make_inputs
from warmup.core.manifest import ModelEntry

log = logging.getLogger(__name__)

PRIME_CALLS = 3
"""Calls per shape and kind at most while priming. Inductor's CUDA-graph trees
(``reduce-overhead``, ``max-autotune``) run a new shape eagerly once (warm-up), record
its graph on the next call and replay it from the third: three calls put the recording
before any request. A shape stops sooner once a call compiled nothing and no graph is
warming up or recording (on CPU, or without CUDA graphs: the second call)."""


def prime_all(
    function: Callable[..., Any],
    entry: ModelEntry,
    learned: list[dict[str, int]],
    device: Any,
) -> tuple[int, list[dict[str, int]]]:
    """Every declared shape primed (ValueError naming the one that failed), then every
    learned one (a failure logged); the calls made and the learned dims primed."""
    calls, primed = 0, []
    for dims in entry.expand():
        try:
            calls += prime_shape(function, entry, dims, device)
        except Exception as e:  # the traceback in the log: the error names the shape
            log.error("model %s: priming at %s failed", entry.name, dims, exc_info=True)
            raise ValueError(f"at {dims}: {named(e)}") from None
    for dims in learned:
        try:
            calls += prime_shape(function, entry, dims, device)
        except Exception as e:  # a learned shape is a bonus: its first request pays
            log.warning("model %s: learned shape %s not primed: %s", entry.name, dims, e)
        else:
            primed.append(dims)
    return calls, primed


def prime_shape(
    function: Callable[..., Any], entry: ModelEntry, dims: dict[str, int], device: Any
) -> int:
    """Call ``function`` at ``dims`` under the model's mode, with each kind of input
    it is primed with, until steady: a call that compiled nothing, with no CUDA graph
    warming up or recording; at most :data:`PRIME_CALLS` calls a kind. Returns how many
    it made."""
    calls = 0
    for kind in input_kinds(entry):
        inputs = make_inputs(entry, dims, device, inference=kind == "inference")
        calls += _until_steady(function, entry, dims, inputs, device)
    return calls


def _until_steady(
    function: Callable[..., Any],
    entry: ModelEntry,
    dims: dict[str, int],
    inputs: list[Any],
    device: Any,
) -> int:
    import torch  # torch loads on first use

    cuda = getattr(device, "type", device) == "cuda"
    for call in range(1, PRIME_CALLS + 1):
        before = snapshot()
        with grad_mode(entry):
            function(*inputs)
        if cuda:
            torch.cuda.synchronize(device)
        if not (snapshot() - before).request_costs() and not _graph_pending(device):
            return call
    log.info("model %s: %s still not steady after %d calls", entry.name, dims, PRIME_CALLS)
    return PRIME_CALLS


def _graph_pending(device: Any) -> bool:
    """Whether Inductor's CUDA-graph trees on ``device`` ended the last call warming up
    or recording (the next call records or replays); False without CUDA graphs."""
    if getattr(device, "type", device) != "cuda":
        return False
    from torch._inductor import cudagraph_trees  # torch loads on first use

    try:
        manager = cudagraph_trees.get_manager(device.index or 0, create_if_none_exists=False)
    except Exception:  # another torch's internals: the fixed number of calls decides
        return True
    state = getattr(manager, "path_state", None)
    return manager is not None and getattr(state, "name", "") != "EXECUTION"
