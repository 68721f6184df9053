"""Runs bonsai-opt --bonsai-verify-model on each broken file and checks for a clean failure."""
import glob
import os
import subprocess
import sys
import tempfile

bonsai_opt, folder = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(folder, "*.mlir")))
# Binary garbage is made here rather than kept in git.
garbage = os.path.join(tempfile.mkdtemp(), "binary.mlir")
with open(garbage, "wb") as f:
    f.write(b"\x00\x01\xff\xfe garbage \x7f\x80 {{{{ ]]]\n")
files.append(garbage)
if not files:
    sys.exit("no inputs in %s" % folder)
failed = 0
for path in files:
    p = subprocess.run([bonsai_opt, "--bonsai-verify-model", path, "-o", os.devnull],
                       capture_output=True)
    err = p.stderr.decode("utf-8", "replace")
    ok = p.returncode == 1 and "error:" in err and "Stack dump" not in err
    first = next((l for l in err.splitlines() if "error:" in l), err[:200])
    print("%-32s exit %d  %s" % (os.path.basename(path), p.returncode, first.strip()))
    failed += not ok
print("%d of %d broken inputs rejected cleanly" % (len(files) - failed, len(files)))
sys.exit(1 if failed else 0)
