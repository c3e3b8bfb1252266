"""The nxdi compile, in a process of its own: `python -m handler.backends.nxdi_compile OUT_DIR`
with the `ModelRecipe` JSON on stdin (handler/backends/nxdi.py starts it with a private
BASE_COMPILE_WORK_DIR). Builds the NxDI model from the Hugging Face checkpoint and compiles
it into OUT_DIR: neuron_config.json, model.pt and, with save_sharded_checkpoint, weights/."""

from __future__ import annotations

import logging
import sys
import time

from handler.backends.nxdi import ModelRecipe, compile_model


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="nxdi compile: %(levelname)s %(message)s")
    recipe = ModelRecipe.from_json(sys.stdin.read())
    started = time.perf_counter()
    compile_model(recipe, argv[1])
    logging.info("compiled %s into %s in %.1f s", recipe.model_class, argv[1], time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
