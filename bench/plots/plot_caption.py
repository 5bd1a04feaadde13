"""The caption every plot in docs/ carries: where, when and what was measured.

A plot made right after its measurement (bench/drivers/scaling.sh, algo_sweep.sh, startup.sh) gets this
machine, today's date and this checkout's version; one redrawn later from a CSV in docs/ is given
the caption of the run that measured it (--caption), since this machine's is not that run's.
"""
import datetime
import os
import platform
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def version():
    """RINGREDUCE_VERSION_STRING from include/ringreduce/version.h, else the CMake project's."""
    for path, pattern in (("include/ringreduce/version.h",
                           r'#define\s+RINGREDUCE_VERSION_STRING\s+"([^"]+)"'),
                          ("CMakeLists.txt", r"project\(ringreduce VERSION ([0-9.]+)")):
        try:
            with open(os.path.join(ROOT, path)) as f:
                m = re.search(pattern, f.read())
            if m:
                return m.group(1)
        except OSError:
            pass
    return "unknown"


def git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def default_caption():
    """This machine (CPU model, cores, kernel), today's date (UTC), ringreduce's version and git."""
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return (f"{cpu_model()}, {os.cpu_count()} cores, Linux {platform.release()}; {today}; "
            f"ringreduce {version()} (git {git_commit()})")
