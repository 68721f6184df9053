#!/usr/bin/env python3
"""test/gpu/rest-of-tests.py - the CUDA tests a sanitize.sh run did not finish, in balanced groups.

A tool can take longer over the whole test suite than one device call allows (racecheck over the
f32 attention tests: minutes each). This reads that run's logs (sanitize-logs.tar.xz, or the
folder it unpacks to) and the suite's test list (`bonsai-runtime-tests --gtest_list_tests
--gtest_filter=...` with sanitize.sh's filter), and prints one gtest filter per line: the tests
no log shows as passed, in GROUPS groups of about equal time (longest first into the least
loaded group), each test timed by what the logs measured for it, else for the same test name
with another element type, else a guess from its shape. sanitize.sh runs the lines as its
processes when BONSAI_SANITIZE_TEST_GROUPS names the file.

  python3 test/gpu/rest-of-tests.py LOGS LIST GROUPS > groups.txt
"""
import re
import sys
import tarfile


def read_logs(path):
    """{test name: milliseconds} of every test some log shows as passed."""
    texts = []
    if path.endswith(".tar.xz"):
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                if re.search(r"tests-.*\.log$", member.name):
                    texts.append(tar.extractfile(member).read().decode(errors="replace"))
    else:
        import glob
        for name in glob.glob(path + "/tests-*.log"):
            texts.append(open(name, errors="replace").read())
    passed = {}
    for text in texts:
        for m in re.finditer(r"^\[       OK \] (\S+) \((\d+) ms\)", text, re.M):
            passed[m.group(1)] = int(m.group(2))
    return passed


def read_list(path):
    """The test names of a --gtest_list_tests output."""
    tests, suite = [], None
    for line in open(path):
        if not line.strip() or line.startswith("Note:"):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        else:
            tests.append(suite + line.split("#")[0].strip())
    return tests


def estimate(test, passed):
    """Milliseconds for a test not timed: the same test with another element type, else a guess."""
    for a in ("f32_", "bf16_", "f16_"):
        for b in ("f32_", "bf16_", "f16_"):
            other = test.replace(a, b)
            if other != test and other in passed and (a == "f32_") == (b == "f32_"):
                return passed[other]
    if "f32_" in test:  # the f32 attention kernel is the slowest under the tools
        seq = re.search(r"_S(\d+)_", test)
        return 600 * int(seq.group(1)) if seq else 60000
    return 5000


def main():
    if len(sys.argv) != 4 or not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
        sys.exit("usage: rest-of-tests.py LOGS LIST GROUPS (GROUPS a positive integer)")
    passed = read_logs(sys.argv[1])
    rest = [t for t in read_list(sys.argv[2]) if t not in passed]
    timed = sorted(((passed.get(t) or estimate(t, passed), t) for t in rest), reverse=True)
    groups = [[0, []] for _ in range(int(sys.argv[3]))]
    for ms, test in timed:
        group = min(groups, key=lambda g: g[0])
        group[0] += ms
        group[1].append(test)
    for ms, tests in groups:
        if tests:
            print(":".join(tests))
            print(f"{len(tests)} tests, about {ms / 1000:.0f} s", file=sys.stderr)
    print(f"{len(rest)} of {len(read_list(sys.argv[2]))} tests not passed yet", file=sys.stderr)


if __name__ == "__main__":
    main()
