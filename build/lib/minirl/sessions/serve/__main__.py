"""python -m minirl.sessions.serve --model DIR: serve a saved model (see minirl/sessions/serve/__init__.py)."""
from minirl.sessions.serve.server import main

main()
