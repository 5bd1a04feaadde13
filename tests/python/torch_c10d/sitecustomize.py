"""Puts ringreduce in gloo's place (rr_as_gloo.py) in every Python process that starts with this
folder on PYTHONPATH and RR_C10D_AS_GLOO=1: pytest, and the ranks torch's MultiProcessTestCase
spawns (fresh interpreters that never see pytest's conftest). Shadows Debian's sitecustomize,
which only installs apport's hook (not in the roots)."""

import os

if os.environ.get("RR_C10D_AS_GLOO") == "1":
    import rr_as_gloo

    rr_as_gloo.install()
