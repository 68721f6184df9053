"""Round-trips every .mlir file under examples/ through bonsai-opt (custom and generic form)."""
import glob
import os
import subprocess
import sys

src, bonsai_opt = sys.argv[1], sys.argv[2]


def opt(text, *args):
    p = subprocess.run([bonsai_opt, *args, "-"], input=text, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return p.stdout


files = sorted(glob.glob(os.path.join(src, "examples", "**", "*.mlir"), recursive=True))
if not files:
    sys.exit("no examples found under %s" % src)
failed = 0
for path in files:
    with open(path) as f:
        text = f.read()
    try:
        printed = opt(text)
        again = opt(printed)
        generic = opt(opt(text, "--mlir-print-op-generic"))
        ok = printed == again == generic
    except RuntimeError as e:
        ok, printed = False, str(e)
    print("%-40s %s" % (os.path.relpath(path, src), "ok" if ok else "FAILED"))
    if not ok:
        failed += 1
        print(printed[:2000])
print("%d of %d examples round-trip" % (len(files) - failed, len(files)))
sys.exit(1 if failed else 0)
