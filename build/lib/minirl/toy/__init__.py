"""The built-in models: `tiny` (a toy model trained in seconds, tiny.py) and `smollm2-135m`
(SmolLM2-135M-Instruct converted from its PyPI wheel, smollm2.py). Each is built once into a cache folder
(cache.py)."""
