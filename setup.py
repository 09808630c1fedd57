"""Adds the start-up file ``rankwatch-autoload.pth`` to the wheel's top level.

Everything else is in pyproject.toml. The ``.pth`` file is what lets ``RANKWATCH=<url>``
instrument a job with no change to its training script; it does nothing unless that variable
is set.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "rankwatch-autoload.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join("hooks", PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
