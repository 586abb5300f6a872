"""usage: chatter.py LINES: many long lines on stdout and stderr at once, to catch lines of
different peers interleaving mid-line; the last line has no newline."""
import os
import sys

rank, count = os.environ["RANK"], int(sys.argv[1])
for i in range(count):
    stream = sys.stdout if i % 2 else sys.stderr
    stream.write(f"<{rank}:{i}:{'x' * 300}>\n")
sys.stdout.write(f"<{rank}:end>")
