"""minirl: RL for LLM reasoning in plain PyTorch. The RL core is this folder; the subsystems are packages
beside it (judge/, sessions/, agentic/, toy/) that import the core, never the other way round.
"""
