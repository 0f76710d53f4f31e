"""python -m minirl.judge --language cpp --source sol.cpp --tests tests.json: judge one program, print JSON."""
from minirl.judge.pool import main

raise SystemExit(main())
