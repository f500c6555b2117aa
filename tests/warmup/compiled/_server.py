"""A server process for the tests: ``python -m tests.warmup.compiled._server NAME
[DIMS_JSON...]`` builds the declared model through the serving API (settings from the
environment; it primes the declared shapes), declares itself warm, calls it at every
declared shape and at each ``DIMS_JSON`` given (in the caller's grad mode, not the
model's: the served model sets its own), and prints what compiled after warm."""

from __future__ import annotations

import json
import sys
import time

from warmup.compiled.counters import snapshot
from warmup.compiled.inputs import make_inputs
from warmup.serving import Serving


def main(name: str, extra: list[dict[str, int]]) -> None:
    started = time.perf_counter()
    with Serving(follow=False) as serving:
        model = serving.model(name, device="cpu")
        built = time.perf_counter()
        serving.declare_warm()
        before = snapshot()
        error = None
        try:
            for dims in [*model.entry.expand(), *extra]:  # in grad mode: the model sets its own
                model(*make_inputs(model.entry, dims, "cpu"))
        except Exception as e:  # strict mode: the test reads the refusal
            error = f"{type(e).__name__}: {e}"
        counts = (snapshot() - before).to_json()
        guarded = (
            {f"{m}/{w}": c for (m, w), c in serving.guard.models.items()} if serving.guard else {}
        )
    print(
        json.dumps(
            {
                "counts": counts,
                "guarded": guarded,
                "error": error,
                "build_s": built - started,
                "calls_s": time.perf_counter() - built,
                "primed": model.primed.outcome if model.primed else None,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], [json.loads(arg) for arg in sys.argv[2:]])
