"""What each example (and bench/drivers/ddp_overlap.py) does before it imports torch and
ringreduce, in one place:

- Debian's python3-torch (with numpy, scikit-learn, Accelerate, Transformers) is installed for
  the system interpreter, /usr/bin/python3; a pyenv or venv python3 first on PATH lacks it. The
  script is then run again under the system interpreter (same arguments and environment).
- ringreduce not installed: the build tree's package, <repo>/build/python (or
  $RINGREDUCE_BUILD/python), goes first on sys.path.

    import example_env  # examples/: the script's own folder is on sys.path
    example_env.prepare()
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prepare():
    try:
        import torch  # noqa: F401
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            os.execv(system, [system] + sys.argv)
        raise
    try:
        import ringreduce  # noqa: F401
    except ImportError:
        build = os.environ.get("RINGREDUCE_BUILD") or str(REPO / "build")
        sys.path.insert(0, str(Path(build) / "python"))
