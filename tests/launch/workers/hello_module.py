"""Run with `-m hello_module` (PYTHONPATH pointing here): proves the launcher's -m form."""
import os
import sys

if __name__ == "__main__":
    print(f"module {__name__} as {os.environ['RANK']}/{os.environ['WORLD_SIZE']} args",
          *sys.argv[1:])
