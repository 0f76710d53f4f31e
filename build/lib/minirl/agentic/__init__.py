"""Agentic RL: environments (env.py), multi-turn episodes on the sessions API (episodes.py), and a pool that
samples ahead of the trainer (overlap.py). Built on minirl.sessions and the core; the core never imports it."""
