"""The one build step pyproject.toml cannot say: ship the spec files inside the wheel.

`tla/*.tla`, `tla/*.cfg`, `tla/manifest.json` and `spec/*.md` are copied into the built
package as `cacheruntime/_specfiles/`, where `cacheruntime.specfiles` finds them when
`cacheruntime tlc`, `trace` or `check` run without a checkout. Copying at build time keeps
the checkout's files the only ones anybody edits. MANIFEST.in puts the same files into
the sdist, so a wheel built from it has them too. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: the files shipped, relative to the checkout (MANIFEST.in lists the same)
SPECFILES = ("tla/*.tla", "tla/*.cfg", "tla/manifest.json", "spec/*.md")


class BuildPyWithSpecFiles(build_py):
    """build_py, then the spec files into `cacheruntime/_specfiles/` of the build."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "cacheruntime" / "_specfiles"
        for pattern in SPECFILES:
            for source in sorted(ROOT.glob(pattern)):
                destination = target / source.relative_to(ROOT)
                self.mkpath(str(destination.parent))
                self.copy_file(str(source), str(destination))


setup(cmdclass={"build_py": BuildPyWithSpecFiles})
