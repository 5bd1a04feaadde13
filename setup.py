"""Builds the ringreduce wheel with the project's own CMake (bookworm has no scikit-build-core):
`pip install --no-build-isolation .` with Debian's setuptools.

build_ext configures a build directory outside the package sources (build-pip/ by default,
$RR_PIP_BUILD to choose another; the .gitignore ignores /build*/; not a RINGREDUCE_* name, which
the library would take for one of its settings), builds the target
ringreduce_python (libringreduce, the module _ringreduce and, where libtorch is installed, the
torch backend) with -DRINGREDUCE_PYTHON_WHEEL=ON, and copies the compiled files into the wheel.
In that mode the modules' RPATH is $ORIGIN and libringreduce.so.0 sits beside _ringreduce in the
package (python/CMakeLists.txt says why), so the installed package imports without
LD_LIBRARY_PATH. build_py copies the pure-Python files, the .pyi stubs and py.typed.

A compiler cache is used when ccache is installed, set up as scripts/lib.sh's use_ccache does
(paths hashed relative to the checkout): a build directory one level below the checkout, as
build-pip/ is, then shares the cache entries of build/ and mostly hits.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def read_version():
    """RINGREDUCE_VERSION_STRING from include/ringreduce/version.h."""
    text = (ROOT / "include" / "ringreduce" / "version.h").read_text()
    m = re.search(r'^#define RINGREDUCE_VERSION_STRING "([^"]+)"', text, re.M)
    if not m:
        raise RuntimeError("no RINGREDUCE_VERSION_STRING in include/ringreduce/version.h")
    return m.group(1)


def build_dir():
    return Path(os.environ.get("RR_PIP_BUILD", ROOT / "build-pip")).resolve()


class CMakeBuild(build_ext):
    """Builds the extension modules with CMake instead of compiling setuptools' Extensions."""

    def run(self):
        build = build_dir()
        env = dict(os.environ)
        args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                "-DRINGREDUCE_BUILD_TESTS=OFF", "-DRINGREDUCE_PYTHON_WHEEL=ON",
                # The interpreter running this build is the one the wheel is for.
                f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja") and not (build / "Makefile").exists():
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            env.update(CCACHE_BASEDIR=str(ROOT), CCACHE_NOHASHDIR="1")
            env.setdefault("CCACHE_MAXSIZE", "4G")
            args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                     "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
        self.announce(f"ringreduce: building with CMake in {build}", level=2)
        subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "ringreduce_python",
                        "-j", str(os.cpu_count() or 1)], env=env, check=True)

        # The compiled part of the package: the modules and the library beside them.
        pkg = build / "python" / "ringreduce"
        compiled = sorted(p for p in pkg.rglob("*") if p.is_file() and (
            p.suffix == ".so" or p.name.startswith("libringreduce.so.")))
        if not any(p.name.startswith("_ringreduce.") for p in compiled):
            raise RuntimeError(f"CMake built no _ringreduce module in {pkg} (python3-dev and "
                               "pybind11-dev are needed)")
        dest_root = Path(self.build_lib) / "ringreduce"
        for src in compiled:
            dest = dest_root / src.relative_to(pkg)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            # A wheel carries no debug information (RelWithDebInfo's -g, kept in the build so
            # that its objects are the cache's): about 10x smaller.
            if shutil.which("strip"):
                subprocess.run(["strip", "--strip-debug", str(dest)], check=True)
            self.announce(f"ringreduce: {dest}", level=2)

    def get_outputs(self):
        return [str(p) for p in (Path(self.build_lib) / "ringreduce").rglob("*.so*")]


build_dir().mkdir(parents=True, exist_ok=True)  # egg_info's egg_base must exist
setup(
    version=read_version(),
    packages=["ringreduce", "ringreduce.torch"],
    package_dir={"": "python"},
    package_data={"ringreduce": ["py.typed", "*.pyi"], "ringreduce.torch": ["*.pyi"]},
    # One placeholder Extension: it makes the wheel platform-specific and runs build_ext, which
    # CMakeBuild replaces.
    ext_modules=[Extension("ringreduce._ringreduce", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own intermediate files (build/lib, the egg-info) go into the build directory
    # too, not into the checkout.
    options={"build": {"build_base": str(build_dir() / "setuptools")},
             "egg_info": {"egg_base": str(build_dir())}},
)
