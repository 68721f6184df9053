"""Driver of crash-report.test: SIGSEGV to bonsai-run once it has logged a training step."""
import re
import signal
import subprocess
import sys

run_tool, plan = sys.argv[1:3]
with subprocess.Popen([run_tool, plan, "--steps", "1000000"], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True) as process:
    for line in process.stdout:
        if line.startswith("step 1 "):
            print("trained: step 1 logged")
            break
    process.send_signal(signal.SIGSEGV)
    _, stderr = process.communicate(timeout=60)
print("ended by signal %d" % -process.returncode if process.returncode < 0
      else "exit %d" % process.returncode)
lines = stderr.splitlines()
header = [i for i, l in enumerate(lines) if ": fatal signal " in l]
if not header:
    sys.exit("no crash report on stderr:\n" + stderr)
print(lines[header[0]])
# backtrace_symbols_fd's frames: "module(symbol+offset)[address]".
frames = [l for l in lines[header[0] + 1:] if re.search(r"\[0x[0-9a-f]+\]$", l)]
print("frames: %d" % len(frames))
