"""minirl: RL for LLM reasoning in plain PyTorch. The RL core is this folder. It imports only the two rooms
beneath it, engines/ (every way rollouts are generated) and models/ (building models); the subsystems beside
it (judge/, sessions/, agentic/, toy/, httpd/) import the core, never the other way round (except
models.resolve_model_path, which builds toy/'s models by name); no import circles (tests/core/test_imports.py).
"""
