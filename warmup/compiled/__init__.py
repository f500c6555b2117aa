"""Compiled models: ``torch.compile``d callables declared in the manifest's ``models``,
compiled and run at every declared shape by the warmup, their Inductor artifacts kept
in the registry (``registry.caches.inductor_cache``), and handed to the server by
:func:`~warmup.serving.models.compiled_model` already warm."""
