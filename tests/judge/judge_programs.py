"""Fixed programs with known verdicts, shared by the tests of the judge's server, RemoteJudge and RayJudge."""
AB = [{"input": "1 2\n", "output": "3"}, {"input": "5 7\n", "output": "12\n"}]
AB_CPP = '#include <bits/stdc++.h>\nint main(){long long a,b; std::cin>>a>>b; std::cout<<a+b<<"\\n";}\n'
AB_PY = "a, b = map(int, input().split())\nprint(a + b)\n"

# (name, language, source, minirl's verdict on AB with a 1 s / 128 MiB limit)
PROGRAMS = [
    ("ac_cpp", "cpp", AB_CPP, "AC"),
    ("ac_py", "python", AB_PY, "AC"),
    ("wa_cpp", "cpp", "#include <cstdio>\nint main(){ puts(\"3\"); }\n", "WA"),
    ("wa_py", "python", "print(3)\n", "WA"),
    ("ce_cpp", "cpp", "int main() { return 0 }\n", "CE"),
    ("ce_py", "python", "print(1\n", "CE"),
    ("tle_cpp", "cpp", "int main(){ volatile long s=0; for(;;) s++; }\n", "TLE"),
    ("tle_py", "python", "while True:\n    pass\n", "TLE"),
    ("re_cpp", "cpp", "int main(){ int *p = nullptr; return *p; }\n", "RE"),
    ("re_py", "python", "raise ValueError('boom')\n", "RE"),
    ("mle_cpp", "cpp", "#include <vector>\nint main(){ std::vector<char> v(1L<<33); return v[5]; }\n", "MLE"),
    ("mle_py", "python", "x = bytearray(2 * 1024**3)\n", "MLE"),
]
TIME_LIMIT_S, MEMORY_MB = 1.0, 128


def jobs(programs=PROGRAMS) -> list[dict]:
    return [dict(source=src, language=lang, tests=AB, time_limit_s=TIME_LIMIT_S, memory_limit_mb=MEMORY_MB)
            for _, lang, src, _ in programs]


def summary(results) -> list[tuple[str, int, int]]:
    return [(r.verdict, r.passed, r.total) for r in results]
