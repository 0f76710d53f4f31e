"""minirl: RL for LLM reasoning in plain PyTorch. The RL core is this folder; the subsystems are packages
beside it (judge/, sessions/, agentic/, toy/, engines/) that import the core, never the other way round
(except models.resolve_model_path, which builds toy/'s models by name); no import circles
(tests/core/test_imports.py).
"""
